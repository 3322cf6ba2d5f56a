"""Probe benchmark: catch rate on a seeded corpus of invalid workspaces, pass rate on valid ones,
and the median probe time per job.

    python -m bench.probe [--valid 30] [--seed 0]

Valid jobs: samples of the untrained local policy that pass, rendered into workspaces through the
workspace tools. Invalid jobs: each valid workspace broken in one way (job.toml semantics or syntax,
environment module, dataset, contamination), plus every hostile module of tests/fixtures/hostile
that must not pass (its placeholders filled: a live victim process of the sandbox's uid, a unique
/tmp tag, another workspace's file; the victim must survive and the host's /tmp stay clean).
Target: every invalid job stopped before `train`; every valid one passes; the median probe time
is printed beside the 57 ms measured before agent code ran under bubblewrap (aim: at most 200 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
import tomllib
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import tomli_w

from metarl.backends.local.train import local_compile_problems
from metarl.interfaces import EpisodeContext
from metarl.learning.eval_secret import add_artifacts_argument, install_eval_secret
from metarl.learning.registry import get_family
from metarl.probe.workspace import probe_workspace
from metarl.runconfig import load_run

REPO = Path(__file__).resolve().parent.parent
HOSTILE = REPO / "tests" / "fixtures" / "hostile"
PASSING_HOSTILE = {"good_reward.py", "read_workspace.py"}
PREVIOUS_MEDIAN_MS = 57
"""The median probe time before isolation (BENCHMARKS.md, probe section, before issue 31)."""
NOBODY = 65534


def start_victim() -> subprocess.Popen[bytes]:
    """A live process of the sandbox's host uid (nobody under a root worker) that hostile modules aim at."""
    extra = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}
    return subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL, start_new_session=True, **extra)  # type: ignore[call-overload]


def filled(source: str, victim: int, tag: str, other: Path) -> str:
    """A hostile module with its placeholders filled (tests/fixtures/hostile/README.md)."""
    for name, value in {"victim": victim, "tag": tag, "other": other, "hidden": other}.items():
        source = source.replace("{" + name + "}", str(value))
    return source


def edit(path: Path, change: Callable[[str], str]) -> None:
    path.write_text(change(path.read_text(encoding="utf-8")), encoding="utf-8")


def set_training(files: Path, **values: int) -> None:
    job = tomllib.loads((files / "job.toml").read_text(encoding="utf-8"))
    job.setdefault("training", {}).update(values)
    (files / "job.toml").write_text(tomli_w.dumps(job), encoding="utf-8")


def breakages(task_family: str) -> dict[str, Callable[[Path], None]]:
    """One way to break a valid workspace each (applied to a copy of its files folder)."""
    hidden = get_family(task_family).hidden_eval(200, 1)

    def contaminate(files: Path) -> None:
        lines = (files / "dataset.jsonl").read_text(encoding="utf-8").splitlines()
        lines[: len(hidden[:5])] = [json.dumps({"prompt": item.prompt, "answer": item.answer}) for item in hidden[:5]]
        (files / "dataset.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")

    return {
        "toml_syntax": lambda f: edit(f / "job.toml", lambda t: t + "\n[training\n"),
        "unknown_key": lambda f: edit(f / "job.toml", lambda t: t + "\n[extras]\nturbo = true\n"),
        "unknown_model": lambda f: edit(f / "job.toml", lambda t: t.replace("Qwen/Qwen3-", "Qwen/Qwen9-")),
        "indivisible_batch": lambda f: set_training(f, batch_size=30, group_size=8),
        "over_budget": lambda f: set_training(f, max_steps=100_000, batch_size=512, group_size=8),
        "env_wrong_answer_wins": lambda f: (f / "environment.py").write_text(
            "def reward(prompt, completion, answer):\n    return 0.0 if completion == answer else 1.0\n"
        ),
        "env_missing": lambda f: (f / "environment.py").unlink(),
        "env_syntax": lambda f: (f / "environment.py").write_text("def reward(prompt, completion, answer)\n    return 1\n"),
        "dataset_bad_line": lambda f: edit(f / "dataset.jsonl", lambda t: "not json\n" + t),
        "dataset_size_mismatch": lambda f: edit(f / "dataset.jsonl", lambda t: "\n".join(t.splitlines()[:-3]) + "\n"),
        "dataset_contaminated": contaminate,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--valid", type=int, default=30, help="valid workspaces in the corpus (default 30); each is also broken in every way for the invalid ones"
    )
    parser.add_argument("--seed", type=int, default=0)
    add_artifacts_argument(parser)
    args = parser.parse_args(argv)
    install_eval_secret(args.artifacts)
    import torch

    from metarl.policy.local_policy import LocalPolicy

    torch.set_num_threads(1)
    config, specs = load_run(REPO / "examples" / "local.toml")
    rng = random.Random(args.seed)
    times: list[float] = []
    caught: Counter[str] = Counter()
    total: Counter[str] = Counter()
    levels: Counter[str] = Counter()
    victim = start_victim()
    tag = f"metarl-bench-{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory(prefix="metarl-probe-bench-") as tmp:
        state = Path(tmp) / "policy.pt"
        LocalPolicy().save_state(state)
        from metarl.backends.local.agent import LocalAgent

        agent = LocalAgent(config.backends.agent)
        valid: list[tuple[Path, str]] = []
        episode = 0
        while len(valid) < args.valid and episode < args.valid * 10:
            episode += 1
            task = specs[rng.choice(sorted(specs))]
            ctx = EpisodeContext(
                run_id="bench",
                episode_id=episode,
                task=task,
                policy_version=0,
                probe_attempt=1,
                seed=rng.randrange(2**31),
                artifacts_root=tmp,
                policy_state_uri=str(state),
            )
            files = Path(agent.run_attempt(ctx).workspace_uri)
            started = time.perf_counter()
            verdict = probe_workspace(files, task, [local_compile_problems], seed=ctx.seed)
            times.append(time.perf_counter() - started)
            levels[str(verdict.isolation)] += 1
            if verdict.passed:
                valid.append((files, task.id))
        passed_again = 0
        for files, task_id in valid:
            started = time.perf_counter()
            verdict = probe_workspace(files, specs[task_id], [local_compile_problems])
            times.append(time.perf_counter() - started)
            passed_again += verdict.passed
            levels[str(verdict.isolation)] += 1
        for index, (files, task_id) in enumerate(valid):
            for kind, breaker in breakages(specs[task_id].family).items():
                broken = Path(tmp) / "broken" / f"{index}-{kind}"
                shutil.copytree(files, broken)
                breaker(broken)
                started = time.perf_counter()
                verdict = probe_workspace(broken, specs[task_id], [local_compile_problems])
                times.append(time.perf_counter() - started)
                levels[str(verdict.isolation)] += 1
                total[kind] += 1
                caught[kind] += not verdict.passed
        files, task_id = valid[0]
        for module in sorted(HOSTILE.glob("*.py")):
            if module.name in PASSING_HOSTILE:
                continue
            broken = Path(tmp) / "hostile" / module.stem
            shutil.copytree(files, broken)
            (broken / "environment.py").write_text(filled(module.read_text(encoding="utf-8"), victim.pid, tag, files / "dataset.jsonl"), encoding="utf-8")
            started = time.perf_counter()
            verdict = probe_workspace(broken, specs[task_id], [local_compile_problems])
            times.append(time.perf_counter() - started)
            levels[str(verdict.isolation)] += 1
            total["hostile_module"] += 1
            caught["hostile_module"] += not verdict.passed
    escaped = [] if victim.poll() is None else ["the victim process was killed"]
    escaped += [f"{len(list(Path('/tmp').glob(tag + '*')))} files in the host's /tmp"] if list(Path("/tmp").glob(tag + "*")) else []
    victim.kill()
    victim.wait()
    print(f"{'kind':<24} {'caught':>7} {'of':>4}")
    for kind in sorted(total):
        print(f"{kind:<24} {caught[kind]:>7} {total[kind]:>4}")
    invalid = sum(total.values())
    print(f"# catch rate on invalid jobs: {sum(caught.values())}/{invalid} = {sum(caught.values()) / invalid:.3f}")
    print(f"# pass rate on valid jobs: {passed_again}/{len(valid)} = {passed_again / max(1, len(valid)):.3f}")
    median_ms = statistics.median(times) * 1000
    print(f"# median probe time per job: {median_ms:.0f} ms over {len(times)} probes (before isolation: {PREVIOUS_MEDIAN_MS} ms; aim <= 200 ms)")
    print(f"# isolation level of the probes: {dict(sorted(levels.items()))} (None: the module did not run)")
    print(f"# escapes: {', '.join(escaped) if escaped else 'none (victim alive, host /tmp clean)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
