"""Hostile workspaces through a real probe worker, end to end (issue 4 and issue 31 acceptance).

Every module of the hostile corpus (tests/fixtures/hostile, as the sandbox unit tests use it, with
its placeholders filled: a live victim process of the sandbox's host uid, a unique /tmp tag with
an abstract unix socket listening under that name, another attempt's file) and a set of hostile
workspace layouts (path traversal, links, special and huge files, deep TOML, invalid UTF-8,
hidden-eval items) is submitted as a probe attempt and sent as the real `metarl.stage.probe` task
to a real probe worker process whose environment holds fake secrets. The worker runs as root and,
in a second run, as an unprivileged user (nobody, through setpriv). Every hostile workspace must
come back with probe errors in `probe_attempts`, the worker must survive and serve the next task,
the victim must live, nothing may appear in the host's /tmp or reach the socket, every module must
have run under the level the run asks for (from the worker's log line of each verdict), and no
secret and no hidden-eval item may appear in a transcript, a log file or a database row. Every
offered level is tried (issue 40): `full`, and `process` with `[sandbox] min_isolation = "process"`
on a worker whose bubblewrap is unavailable, as on a host that refuses user namespaces.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import select, text

from metarl.learning.registry import get_family
from metarl.messaging.dispatch import send_stage
from metarl.pools import stop_process_group, worker_command
from metarl.runconfig import load_run
from metarl.store.db import session_scope
from metarl.store.records import Base, Episode, EpisodeGroup, ProbeAttempt, Stage
from metarl.workspace import TRANSCRIPT_FILE, Workspace
from orchestrator.loop import create_run
from schemas.base import MAX_TOML_DEPTH
from schemas.task_spec import TaskSpec
from tests.conftest import REPO
from tests.integration.helpers import sim_config
from tests.unit.test_sandbox import CASES, HOSTILE, SECRET, abstract_listener, fill  # noqa: F401 - fixture
from tests.unit.test_workspace_probe import JOB, dataset_text
from tests.unprivileged import NOBODY, nobody_python, shared_folder
from workers.app import make_app

pytestmark = pytest.mark.integration

CONTROL_MODULE = "good_reward.py"  # a well-behaved module of the corpus: it must pass, so the probe is not just refusing everything
TASK_ID = "addition"
SECRET_ENV = {"METARL_TEST_SECRET": SECRET, "TINKER_API_KEY": SECRET + "-tinker", "RUNPOD_API_KEY": SECRET + "-runpod"}
HIDDEN = get_family("addition").hidden_eval(200)  # the task's hidden eval (n_items = 200, version 1)
HIDDEN_FILE = "hidden_eval.jsonl"  # planted two levels above each workspace's files, where read_hidden_relative.py looks

# Extra modules that try to smuggle a secret or a hidden item out through the error text the agent gets back.
EXFILTRATING_MODULES = {
    "env_in_error.py": "import os\n\n\ndef reward(prompt, completion, answer):\n    raise ValueError(repr(dict(os.environ)))\n",
    "hidden_in_error.py": f"def reward(prompt, completion, answer):\n    raise ValueError(open('../../{HIDDEN_FILE}').read())\n",
}


def hidden_lines(items) -> str:  # type: ignore[no-untyped-def]
    """Items as dataset JSON lines."""
    return "".join(json.dumps({"prompt": item.prompt, "answer": item.answer}) + "\n" for item in items)


# -- hostile workspace layouts: each edits a valid workspace's files folder ------------------------


def traversal_dataset(files: Path) -> None:
    (files / "job.toml").write_text(JOB.replace("[dataset]\n", f'[dataset]\npath = "../../{HIDDEN_FILE}"\n'), encoding="utf-8")


def dataset_links_to_hidden(files: Path) -> None:
    (files / "dataset.jsonl").unlink()
    (files / "dataset.jsonl").symlink_to(files.parent.parent / HIDDEN_FILE)


def dataset_hardlinked_to_hidden(files: Path) -> None:
    (files / "dataset.jsonl").unlink()
    os.link(files.parent.parent / HIDDEN_FILE, files / "dataset.jsonl")


def environment_links_out(files: Path) -> None:
    (files / "environment.py").unlink()
    (files / "environment.py").symlink_to(HOSTILE / "read_passwd.py")


def files_folder_is_a_link(files: Path) -> None:
    elsewhere = files.parent.parent / "elsewhere"
    files.rename(elsewhere)
    files.symlink_to(elsewhere)


def dataset_is_a_fifo(files: Path) -> None:
    (files / "dataset.jsonl").unlink()
    os.mkfifo(files / "dataset.jsonl")  # reading it would block the worker forever


def job_is_a_folder(files: Path) -> None:
    (files / "job.toml").unlink()
    (files / "job.toml").mkdir()


def huge_dataset(files: Path) -> None:
    with open(files / "dataset.jsonl", "ab") as handle:
        handle.truncate(512 * 1024**2)  # sparse: cheap to make, must not be read whole


def huge_environment(files: Path) -> None:
    with open(files / "environment.py", "ab") as handle:
        handle.truncate(64 * 1024**2)


def deep_toml(files: Path) -> None:
    depth = MAX_TOML_DEPTH * 1000
    (files / "job.toml").write_text("x = " + "[" * depth + "]" * depth + "\n", encoding="utf-8")


def job_not_utf8(files: Path) -> None:
    (files / "job.toml").write_bytes(b'[model]\nname = "\xff\xfe"\n')


def dataset_not_utf8(files: Path) -> None:
    with open(files / "dataset.jsonl", "ab") as handle:
        handle.write(b'{"prompt": "\xc3\x28", "answer": "1"}\n')


def contaminated_dataset(files: Path) -> None:
    lines = (files / "dataset.jsonl").read_text(encoding="utf-8").splitlines()
    lines[:5] = hidden_lines(HIDDEN[:5]).splitlines()
    (files / "dataset.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


LAYOUTS: dict[str, Callable[[Path], None]] = {
    "traversal_dataset": traversal_dataset,
    "dataset_links_to_hidden": dataset_links_to_hidden,
    "dataset_hardlinked_to_hidden": dataset_hardlinked_to_hidden,
    "environment_links_out": environment_links_out,
    "files_folder_is_a_link": files_folder_is_a_link,
    "dataset_is_a_fifo": dataset_is_a_fifo,
    "job_is_a_folder": job_is_a_folder,
    "huge_dataset": huge_dataset,
    "huge_environment": huge_environment,
    "deep_toml": deep_toml,
    "job_not_utf8": job_not_utf8,
    "dataset_not_utf8": dataset_not_utf8,
    "contaminated_dataset": contaminated_dataset,
}


# -- set-up ----------------------------------------------------------------------------------------


def valid_workspace(base: Path, name: str, task: TaskSpec, environment: str) -> Path:
    """A valid attempt written through the agent's own tools (so it has a transcript), plus a planted hidden-eval file."""
    root = base / name / "attempt"
    workspace = Workspace(root, task)
    assert workspace.write_file("job.toml", JOB).ok
    assert workspace.write_file("dataset.jsonl", dataset_text()).ok
    assert workspace.write_file("environment.py", environment).ok
    assert workspace.submit().ok
    (base / name / HIDDEN_FILE).write_text(hidden_lines(HIDDEN), encoding="utf-8")
    return workspace.files_dir


def submit_attempt(pg_url: str, run_id: str, group_id: int, index: int, files: Path) -> int:
    """An episode waiting at the probe with one submitted attempt (what the agent stage records)."""
    try:
        job_toml = (files / "job.toml").read_text(encoding="utf-8", errors="replace")[:100_000]
    except (IsADirectoryError, FileNotFoundError):
        job_toml = ""
    with session_scope(pg_url) as session:
        episode = Episode(run_id=run_id, group_id=group_id, index_in_group=index, task_id=TASK_ID, policy_version=0, stage=Stage.probe, probe_attempt=1)
        session.add(episode)
        session.flush()
        session.add(ProbeAttempt(episode_id=episode.id, run_id=run_id, attempt=1, job_toml=job_toml, workspace_uri=str(files), agent_backend="sim"))
        return episode.id


def probed(pg_url: str, episode_ids: list[int]) -> dict[int, ProbeAttempt]:
    """The attempts of these episodes that have a verdict."""
    with session_scope(pg_url) as session:
        attempts = session.execute(select(ProbeAttempt).where(ProbeAttempt.episode_id.in_(episode_ids), ProbeAttempt.probed_at.is_not(None))).scalars().all()
        session.expunge_all()
    return {attempt.episode_id: attempt for attempt in attempts}


def wait_for_verdicts(pg_url: str, episode_ids: list[int], timeout_s: float, worker: subprocess.Popen) -> dict[int, ProbeAttempt]:
    """Wait until every episode's attempt has a verdict, failing early if the worker exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = probed(pg_url, episode_ids)
        if len(done) == len(episode_ids):
            return done
        assert worker.poll() is None, f"the probe worker exited with {worker.returncode}"
        time.sleep(0.25)
    missing = sorted(set(episode_ids) - set(probed(pg_url, episode_ids)))
    raise AssertionError(f"no verdict after {timeout_s}s for episodes {missing}")


WORKER_USERS = ["root", "nobody"] if os.geteuid() == 0 else ["self"]
NO_BUBBLEWRAP = (
    "import sys\n"
    "from metarl.sandbox import isolation\n"
    "isolation.host_isolation = lambda runner, modules: isolation.HostIsolation(None, None, 'bwrap failed (exit 1): No permissions to create a new namespace')\n"
    "from celery.__main__ import main\n"
    "sys.exit(main())\n"
)
"""Run a Celery worker as on a host that refuses user namespaces: bubblewrap unavailable, so level process only."""


PROBE_LOOKALIKES = {"module:mknod_in_training.py"}
"""Modules that behave where the working directory is a workspace's files/ folder, as the probe's is at level process
(bubblewrap's is /workspace): they may pass that probe; what they do elsewhere is refused (tests/unit/test_sandbox.py)."""


@pytest.fixture(params=["full", "process"])
def probe_level(request: pytest.FixtureRequest) -> str:
    """The isolation level the run asks for and the worker gives: full, or process on a host without user namespaces."""
    return str(request.param)


@pytest.fixture(params=WORKER_USERS)
def worker_user(request: pytest.FixtureRequest) -> str:
    """Who the probe worker runs as: root (the test's own user) or nobody (an unprivileged worker)."""
    return str(request.param)


@pytest.fixture
def probe_worker(pg_url: str, redis_url: str, tmp_path: Path, worker_user: str, probe_level: str) -> Iterator[subprocess.Popen[bytes]]:
    """One real probe pool process (two pool processes) with fake secrets in its environment."""
    env = {**os.environ, "METARL_DATABASE_URL": pg_url, "METARL_BROKER_URL": redis_url, **SECRET_ENV}
    command = worker_command("probe", concurrency=2)
    if probe_level == "process":
        assert command[1:3] == ["-m", "celery"]
        command = [command[0], "-c", NO_BUBBLEWRAP, *command[3:]]
    if worker_user == "nobody":
        found = nobody_python()
        if isinstance(found, str):
            pytest.skip(f"no unprivileged worker: {found}")
        prefix, extra = found
        command, env = [*prefix, *command[1:]], {**env, **extra, "METARL_HOME": extra["HOME"]}
    (tmp_path / "logs").mkdir()
    with open(tmp_path / "logs" / "worker-probe.log", "ab") as log_file:
        process = subprocess.Popen(command, env=env, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    yield process
    stop_process_group(process)


@pytest.fixture
def victim(worker_user: str) -> Iterator[subprocess.Popen[bytes]]:
    """A live process of the sandbox's host uid (nobody; for the nobody worker, the worker's own uid too)."""
    extra = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}
    process = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, start_new_session=True, **extra)  # type: ignore[call-overload]
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def workspaces() -> Iterator[Path]:
    """A folder every worker user can read, for the attempts' workspaces."""
    folder = shared_folder("metarl-hostile-workspaces-")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def all_row_text(pg_url: str) -> str:
    """Every row of every table of the run database, as JSON text."""
    with session_scope(pg_url) as session:
        return "\n".join(
            row for table in Base.metadata.sorted_tables for row in session.execute(text(f'SELECT row_to_json(t)::text FROM "{table.name}" t')).scalars()
        )


VERDICT_LOG = re.compile(r"probe episode=(\d+) attempt=1 passed=(True|False) isolation=(\w+)")


def test_hostile_workspaces_through_a_real_probe_worker(
    tmp_path, pg_url, redis_url, probe_worker, worker_user, probe_level, victim, abstract_listener, workspaces
):
    sandbox = '\n[sandbox]\nmin_isolation = "process"\n' if probe_level == "process" else ""
    config, specs = load_run(sim_config(tmp_path, name="hostile", extra="max_probe_attempts = 1\n" + sandbox))
    config = config.model_copy(update={"artifacts": config.artifacts.model_copy(update={"root": str(workspaces / "artifacts")})})  # every worker user reads it
    task = specs[TASK_ID]
    run_id = create_run(pg_url, config, specs)
    tag, listener = abstract_listener
    base = workspaces
    good_env = (HOSTILE / CONTROL_MODULE).read_text(encoding="utf-8")
    cases: dict[str, Path] = {}
    for module in CASES:
        source = fill((HOSTILE / module).read_text(encoding="utf-8"), base, base / HIDDEN_FILE, victim, tag)
        cases[f"module:{module}"] = valid_workspace(base, f"module-{module}", task, source)
    for name, source in EXFILTRATING_MODULES.items():
        cases[f"module:{name}"] = valid_workspace(base, f"module-{name}", task, source)
    for name, breaker in LAYOUTS.items():
        files = valid_workspace(base, f"layout-{name}", task, good_env)
        breaker(files)
        cases[f"layout:{name}"] = files
    control = f"module:{CONTROL_MODULE}"

    with session_scope(pg_url) as session:
        group = EpisodeGroup(run_id=run_id, task_id=TASK_ID, policy_version=0, size=len(cases) + 1)
        session.add(group)
        session.flush()
        group_id = group.id
    episodes = {name: submit_attempt(pg_url, run_id, group_id, index, files) for index, (name, files) in enumerate(cases.items())}
    app = make_app(redis_url)
    started = time.monotonic()
    for episode_id in episodes.values():
        send_stage(app, Stage.probe, episode_id, 1)
    verdicts = wait_for_verdicts(pg_url, list(episodes.values()), 110, probe_worker)
    elapsed = time.monotonic() - started

    # Every hostile workspace is stopped with actionable probe errors; the control passes.
    assert verdicts[episodes[control]].passed, verdicts[episodes[control]].errors
    may_pass = PROBE_LOOKALIKES if probe_level == "process" else set()
    let_through = [name for name, episode_id in episodes.items() if name not in {control, *may_pass} and verdicts[episode_id].passed]
    assert not let_through, f"hostile workspaces passed the probe: {let_through}"
    for name, episode_id in episodes.items():
        if name == control or (name in may_pass and verdicts[episode_id].passed):
            continue
        errors = verdicts[episode_id].errors
        assert errors and all(problem["message"] and problem["fix"] for problem in errors), (name, errors)
    with session_scope(pg_url) as session:
        stages = dict(session.execute(select(Episode.id, Episode.stage).where(Episode.run_id == run_id)).all())
    assert all(stages[episodes[name]] == Stage.done for name in episodes if name not in {control, *may_pass}), "a hostile episode did not end at the retry cap"
    assert stages[episodes[control]] == Stage.train

    # Nothing escaped: the victim lives, the host's /tmp and the abstract socket saw nothing.
    assert victim.poll() is None, "a module killed another process of the sandbox's uid"
    assert not list(Path("/tmp").glob(f"{tag}*")), "a module created files in the host's /tmp"
    with pytest.raises(BlockingIOError):
        listener.accept()

    # The worker survived every case (no pool process lost either) and serves the next task.
    assert probe_worker.poll() is None, "the probe worker died"
    next_files = valid_workspace(base, "next", task, good_env)
    next_episode = submit_attempt(pg_url, run_id, group_id, len(cases), next_files)
    send_stage(app, Stage.probe, next_episode, 1)
    assert wait_for_verdicts(pg_url, [next_episode], 30, probe_worker)[next_episode].passed
    log_text = "\n".join(path.read_text(encoding="utf-8", errors="replace") for path in (tmp_path / "logs").rglob("*") if path.is_file())
    assert "WorkerLostError" not in log_text and "exited with" not in log_text, "a pool process of the probe worker died"

    # Every module ran under the level the run asks for, whoever the worker runs as: each verdict records it.
    module_episodes = [episode_id for name, episode_id in episodes.items() if name.startswith("module:")]
    assert {verdicts[episode_id].isolation for episode_id in module_episodes} == {probe_level}, {name: verdicts[e].isolation for name, e in episodes.items()}
    levels = {int(episode): level for episode, _, level in VERDICT_LOG.findall(log_text)}
    assert {levels.get(episode_id) for episode_id in module_episodes} == {probe_level}

    # No secret and no hidden-eval item in a transcript, a log file or a database row.
    transcripts = [root.parent / TRANSCRIPT_FILE for root in cases.values()] + [next_files.parent / TRANSCRIPT_FILE]
    assert all(path.is_file() for path in transcripts)
    task_files = [root / "TASK.md" for root in cases.values()]
    texts = {
        "database rows": all_row_text(pg_url),
        "worker log": log_text,
        **{f"transcript {path.parent.parent.name}": path.read_text(encoding="utf-8") for path in transcripts},
        **{f"TASK.md {path.parent.parent.parent.name}": path.read_text(encoding="utf-8") for path in task_files},
    }
    secrets = list(SECRET_ENV.values())
    for where, content in texts.items():
        for secret in secrets:
            assert secret not in content, f"a secret leaked into the {where}"
        leaked = [item.prompt for item in HIDDEN if item.prompt in content]
        assert not leaked, f"hidden-eval items leaked into the {where}: {len(leaked)} of them"
    assert "root:x:0:0" not in texts["database rows"], "/etc/passwd leaked into the records"
    assert elapsed < 110
