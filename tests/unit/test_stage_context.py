"""The backends' view of an episode, built from the one row a stage reads before claiming it (pure)."""

from __future__ import annotations

import dataclasses

import pydantic
import pytest

from metarl.runconfig import load_run
from metarl.store.episodes import StageRow, config_and_task, episode_seed, held_out_seed, stage_context, start_set_seed
from metarl.store.records import RunStatus, Stage
from tests.conftest import REPO

ERRORS = [{"field": "training.batch_size", "message": "must be divisible by group_size", "fix": "use 16"}]


def row(probe_attempt: int, previous_errors: list | None) -> StageRow:
    return StageRow(
        episode_id=17,
        run_id="0a1b2c3d-0000-4000-8000-000000000000",
        run_status=RunStatus.running,
        stage=Stage.agent,
        probe_attempt=probe_attempt,
        task_id="addition",
        policy_version=3,
        policy_state_uri="file:///artifacts/policy/v00003.pt",
        workspace_uri=None,
        job_toml=None,
        previous_errors=previous_errors,
        run_config={},
        task_spec={},
    )


def test_context_carries_the_rows_inputs_and_a_seed_per_episode() -> None:
    config, specs = load_run(REPO / "examples" / "sim.toml")
    ctx = stage_context(row(1, None), config, specs["addition"])
    assert (ctx.episode_id, ctx.policy_version, ctx.probe_attempt) == (17, 3, 1)
    assert ctx.policy_state_uri == "file:///artifacts/policy/v00003.pt" and ctx.workspace_uri is None
    assert ctx.seed == episode_seed(config.run.seed, 17) and ctx.artifacts_root == config.artifacts.root
    assert ctx.task.id == "addition" and ctx.feedback == []


def test_feedback_is_the_previous_attempts_probe_errors_only_after_the_first_attempt() -> None:
    config, specs = load_run(REPO / "examples" / "sim.toml")
    retried = stage_context(row(2, ERRORS), config, specs["addition"])
    assert [problem.field for problem in retried.feedback] == ["training.batch_size"]
    assert retried.feedback[0].fix == "use 16"
    # a first attempt has no previous attempt, whatever the row holds
    assert stage_context(row(1, ERRORS), config, specs["addition"]).feedback == []


def test_the_rows_reward_inputs_are_its_attempt_when_it_passed_and_the_tokens_up_to_it() -> None:
    import dataclasses

    passed = dataclasses.replace(row(2, None), passed=True, agent_tokens=140)
    assert passed.passed_attempt_and_tokens == (2, 140)
    rejected = dataclasses.replace(row(3, None), passed=False, agent_tokens=90)
    assert rejected.passed_attempt_and_tokens == (None, 90)
    assert row(1, None).passed_attempt_and_tokens == (None, 0)  # not yet probed


def test_a_runpod_runs_context_workspace_and_speed_reward_use_the_tasks_gpu_training_cap(tmp_path) -> None:
    from metarl.store.episodes import reward_params
    from metarl.workspace import Workspace

    config, specs = load_run(REPO / "examples" / "runpod.toml")
    task = specs["addition"]
    assert task.budget.max_gpu_train_seconds != task.budget.max_train_seconds
    ctx = stage_context(row(1, None), config, task)
    assert ctx.train_backend == "runpod" and ctx.train_seconds == task.budget.max_gpu_train_seconds
    workspace = Workspace(tmp_path / "attempt", task, train_seconds=ctx.train_seconds)
    task_md = (workspace.files_dir / "TASK.md").read_text()
    assert f"training time: at most {task.budget.max_gpu_train_seconds:g} seconds" in task_md
    # half the GPU cap is a fast job there; measured against the 60 s CPU cap it would be over budget
    params = reward_params(
        episode_id=17,
        run_id="run",
        config=config,
        task=task,
        attempts=(1, 100),
        base_score=0.2,
        trained_score=0.6,
        train_seconds=task.budget.max_gpu_train_seconds / 2,
    )
    assert params["speed"] > 0
    sim_config, sim_specs = load_run(REPO / "examples" / "sim.toml")
    assert stage_context(row(1, None), sim_config, sim_specs["addition"]).train_seconds == sim_specs["addition"].budget.max_train_seconds


def test_the_config_and_task_are_validated_from_what_the_row_read() -> None:
    import dataclasses

    config, specs = load_run(REPO / "examples" / "sim.toml")
    stored = dataclasses.replace(row(1, None), run_config=config.model_dump(mode="json"), task_spec=specs["addition"].model_dump(mode="json"))
    assert config_and_task(stored) == (config, specs["addition"])
    with pytest.raises(pydantic.ValidationError):
        config_and_task(dataclasses.replace(stored, task_spec={"id": "addition"}))


def test_a_groups_episodes_share_a_training_time_cap_drawn_from_the_run_configs_choices(tmp_path) -> None:
    import dataclasses

    config, specs = load_run(REPO / "examples" / "local.toml")
    stored = config.model_dump(mode="json")
    stored["run"]["episode_train_seconds"] = [20.0, 60.0]
    base = dataclasses.replace(row(1, None), run_config=stored, task_spec=specs["addition"].model_dump(mode="json"))
    caps = {group: config_and_task(dataclasses.replace(base, group_id=group))[1].budget.max_train_seconds for group in range(1, 41)}
    assert set(caps.values()) == {20.0, 60.0}
    assert config_and_task(dataclasses.replace(base, group_id=7, episode_id=99))[1].budget.max_train_seconds == caps[7]
    ctx = stage_context(base, *config_and_task(base))
    assert ctx.train_seconds in (20.0, 60.0)
    stored["run"]["episode_train_seconds"] = []
    assert config_and_task(base)[1].budget.max_train_seconds == specs["addition"].budget.max_train_seconds


def test_a_time_cap_above_a_tasks_own_is_refused_at_load_naming_the_entry(tmp_path) -> None:
    from schemas.base import ConfigError

    text = (REPO / "examples" / "local.toml").read_text().replace("max_outer_steps = 40", "max_outer_steps = 40\nepisode_train_seconds = [20, 90]")
    text = text.replace('task_specs_dir = "../tasks_specs"', f'task_specs_dir = "{REPO / "tasks_specs"}"')
    path = tmp_path / "run.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_run(path)
    [problem] = caught.value.problems
    assert problem.field == "run.episode_train_seconds.1" and "60" in problem.fix


def test_a_start_set_episode_has_the_same_seed_in_every_run_and_keeps_its_tasks_cap() -> None:
    config, specs = load_run(REPO / "examples" / "local.toml")
    stored = config.model_dump(mode="json")
    stored["run"]["episode_train_seconds"] = [20.0]
    start = dataclasses.replace(row(1, None), run_config=stored, task_spec=specs["addition"].model_dump(mode="json"), start_set=True, index_in_group=1)
    assert start.seed(0) == start.seed(5) == start_set_seed("addition", 1) != start_set_seed("addition", 0)
    assert dataclasses.replace(start, start_set=False).seed(0) == episode_seed(0, 17) != episode_seed(5, 17)
    _, task = config_and_task(start)
    assert task.budget.max_train_seconds == specs["addition"].budget.max_train_seconds
    assert stage_context(start, *config_and_task(start)).seed == start_set_seed("addition", 1)


def test_a_held_out_episode_has_the_same_seed_at_every_version_and_in_every_run() -> None:
    config, specs = load_run(REPO / "examples" / "local.toml")
    held = dataclasses.replace(
        row(1, None),
        task_id="date_format",
        run_config=config.model_dump(mode="json"),
        task_spec=specs["date_format"].model_dump(mode="json"),
        held_out=True,
        index_in_group=3,
    )
    later = dataclasses.replace(held, episode_id=912, policy_version=12)
    assert held.seed(0) == held.seed(5) == later.seed(0) == held_out_seed("date_format", 3)
    assert held_out_seed("date_format", 3) not in {held_out_seed("date_format", 2), start_set_seed("date_format", 3)}
    assert stage_context(later, *config_and_task(later)).seed == held_out_seed("date_format", 3)
    assert dataclasses.replace(held, held_out=False).seed(0) == episode_seed(0, 17)
