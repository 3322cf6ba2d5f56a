"""The versus-search bench's pure parts: best so far, the t-interval, the CSV rows, the summary and checks, the search space, the budget."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench._versus_methods import ABSENT, AgentProposer, RandomProposer, TpeProposer, fitted_point, job_seed, point_tokens, search_space, sensible_job_toml
from bench.versus_search import (
    JOB_OVERHEAD_S,
    QUICK_JOB_OVERHEAD_S,
    SEARCHING_METHODS,
    SETUP_S,
    TARGET_WALL_S,
    PolicyProvenance,
    default_plan,
    job_description,
    resolve_provenance,
    worst_case_jobs,
    worst_case_wall_s,
)
from metarl.backends.local.train import local_compile_problems
from metarl.policy import job_language as jl
from metarl.probe.job import ProbeVerdict, probe_job_text
from metarl.versus_search import (
    CSV_COLUMNS,
    VersusRow,
    best_so_far,
    clipped,
    mean_ci,
    parse_versus_csv,
    rows_to_csv,
    shape_problems,
    summarize,
    t_critical_95,
    zero_shot_lines,
)
from schemas.base import ConfigError, FieldProblem, load_toml_model
from schemas.task_spec import TaskSpec

REPO = Path(__file__).resolve().parents[2]


def task(name: str = "date_format") -> TaskSpec:
    return load_toml_model(TaskSpec, REPO / "tasks_specs" / f"{name}.toml")


def series_rows(
    method: str, family: str, seed: int, scores: list[float | None], floor: float = 0.2, held_out: bool = False, mode: str = "full"
) -> list[VersusRow]:
    """A method's rows on one family and seed: None is a rejected job."""
    best = best_so_far(floor, scores)
    return [
        VersusRow(
            mode=mode,  # type: ignore[arg-type]
            method=method,  # type: ignore[arg-type]
            family=family,
            held_out=held_out,
            seed=seed,
            job_index=index + 1,
            outcome="passed" if score is not None else "rejected",
            rejected_fields="" if score is not None else "dataset.size",
            model="Qwen/Qwen3-0.6B",
            score=score,
            base_score=floor,
            best_so_far=best[index],
            steps=10 if score is not None else None,
            cpu_s=2.5 if score is not None else 0.001,
            wall_s=3.0 if score is not None else 0.002,
            cost_usd=0.0,
            job="model.name=Qwen/Qwen3-0.6B training.learning_rate=0.0003",
        )
        for index, score in enumerate(scores)
    ]


def bench_rows(seeds: int = 3, jobs: int = 4) -> list[VersusRow]:
    rows: list[VersusRow] = []
    for seed in range(seeds):
        rows += series_rows("trained_agent", "date_format", seed, [0.6 + 0.05 * seed] + [0.5] * (jobs - 1), held_out=True)
        rows += series_rows("optuna_tpe", "date_format", seed, [None, 0.3, 0.5 + 0.1 * seed, 0.7][:jobs], held_out=True)
        rows += series_rows("sensible_preset", "date_format", seed, [0.55 + 0.01 * seed], held_out=True)
    return rows


# -- best so far and the interval ------------------------------------------------------------------


def test_best_so_far_starts_at_the_floor_and_keeps_the_best_passing_score() -> None:
    assert best_so_far(0.2, [None, 0.1, 0.5, None, 0.4, 0.7]) == [0.2, 0.2, 0.5, 0.5, 0.5, 0.7]
    assert best_so_far(0.3, []) == []


@given(st.floats(0.0, 1.0), st.lists(st.one_of(st.none(), st.floats(0.0, 1.0)), max_size=20))
def test_best_so_far_is_monotone_and_the_running_maximum(floor: float, scores: list[float | None]) -> None:
    best = best_so_far(floor, scores)
    assert len(best) == len(scores)
    assert all(after >= before for before, after in zip([floor, *best], best))
    for index, value in enumerate(best):
        assert value == max([floor, *(s for s in scores[: index + 1] if s is not None)])


def test_t_critical_values() -> None:
    assert t_critical_95(1) == pytest.approx(12.706, abs=1e-3)
    assert t_critical_95(2) == pytest.approx(4.303, abs=1e-3)
    assert t_critical_95(30) == pytest.approx(2.042, abs=1e-3)
    assert t_critical_95(31) == pytest.approx(2.0395, abs=2e-4)  # past the table: the expansion
    assert t_critical_95(60) == pytest.approx(2.0003, abs=2e-4)
    assert t_critical_95(120) == pytest.approx(1.9799, abs=2e-4)
    with pytest.raises(ValueError):
        t_critical_95(0)


def test_mean_ci_of_three_seeds_and_of_one() -> None:
    interval = mean_ci([0.2, 0.4, 0.6])
    half = 4.302653 * 0.2 / math.sqrt(3)
    assert interval.n == 3 and interval.mean == pytest.approx(0.4)
    assert interval.low == pytest.approx(0.4 - half) and interval.high == pytest.approx(0.4 + half)
    same = mean_ci([0.5, 0.5])
    assert same.low == same.high == pytest.approx(0.5)
    one = mean_ci([0.7])
    assert one.low is None and one.high is None and one.mean == 0.7
    with pytest.raises(ValueError):
        mean_ci([])


def test_intervals_are_clipped_to_the_score_range_in_the_summary() -> None:
    wide = mean_ci([0.0, 0.05])
    assert wide.low is not None and wide.low < 0
    cut = clipped(wide, 0.0, 1.0)
    assert (cut.low, cut.mean, cut.high) == (0.0, wide.mean, wide.high)
    assert clipped(mean_ci([0.95, 1.0]), 0.0, 1.0).high == 1.0
    assert clipped(mean_ci([0.5]), 0.0, 1.0) == mean_ci([0.5])
    rows = series_rows("random_search", "addition", 0, [None], floor=0.0) + series_rows("random_search", "addition", 1, [0.05], floor=0.0)
    assert summarize(rows)[0].best.low == 0.0


# -- rows and the CSV ------------------------------------------------------------------------------


def test_a_row_has_a_score_exactly_when_it_passed_and_best_so_far_never_below_it() -> None:
    good = series_rows("random_search", "addition", 0, [0.4])[0]
    with pytest.raises(ValueError, match="score is set exactly"):
        VersusRow.model_validate({**good.model_dump(), "outcome": "rejected"})
    with pytest.raises(ValueError, match="best_so_far is below"):
        VersusRow.model_validate({**good.model_dump(), "best_so_far": 0.3})
    with pytest.raises(ValueError):
        VersusRow.model_validate({**good.model_dump(), "score": 1.5})


def test_the_csv_round_trips_and_has_the_columns_in_order() -> None:
    rows = bench_rows()
    text = rows_to_csv(rows)
    assert text.splitlines()[0] == ",".join(CSV_COLUMNS)
    assert parse_versus_csv(text, "t.csv") == rows


def problem_fields(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_versus_csv(text, "bad.csv")
    return [problem.field for problem in caught.value.problems]


def test_a_bad_csv_names_the_row_and_the_column() -> None:
    lines = rows_to_csv(bench_rows()).splitlines()
    header = lines[0].split(",")
    cells = lines[2].split(",")
    cells[header.index("score")] = "1.5"
    assert problem_fields("\n".join([lines[0], lines[1], ",".join(cells)])) == ["row 2 (line 3), column score"]
    cells = lines[1].split(",")
    cells[header.index("seed")] = "one"
    assert problem_fields("\n".join([lines[0], ",".join(cells)])) == ["row 1 (line 2), column seed"]
    assert problem_fields("\n".join([lines[0], lines[1] + ",extra"])) == ["row 1 (line 2)"]
    assert problem_fields(lines[0].replace(",cpu_s", "")) == ["column cpu_s"]
    assert problem_fields("") == ["header"]
    assert problem_fields(lines[0]) == ["rows"]


def test_a_csv_mixing_modes_repeating_a_job_or_with_a_falling_best_is_refused() -> None:
    rows = bench_rows(seeds=1)
    quick = rows[0].model_copy(update={"mode": "quick"})
    assert problem_fields(rows_to_csv([*rows, quick.model_copy(update={"seed": 5})])) == [f"row {len(rows) + 1}, column mode"]
    assert problem_fields(rows_to_csv([*rows, rows[0]])) == [f"row {len(rows) + 1}, column job_index"]
    first = series_rows("random_search", "addition", 0, [0.6])[0]
    lower = first.model_copy(update={"job_index": 2, "outcome": "rejected", "score": None, "best_so_far": 0.5})
    assert problem_fields(rows_to_csv([first, lower])) == ["row 2, column best_so_far"]


# -- summary, checks, zero-shot ---------------------------------------------------------------------


def test_summary_points_per_budget_with_ordered_intervals() -> None:
    points = summarize(bench_rows(seeds=3, jobs=4))
    keys = [(point.method, point.budget) for point in points]
    assert keys == [
        ("trained_agent", 1),
        ("trained_agent", 2),
        ("trained_agent", 4),
        ("optuna_tpe", 1),
        ("optuna_tpe", 2),
        ("optuna_tpe", 4),
        ("sensible_preset", 1),
    ]
    tpe_one = points[3]
    assert tpe_one.best.mean == pytest.approx(0.2) and tpe_one.pass_rate == 0.0 and tpe_one.floor == pytest.approx(0.2)
    tpe_four = points[5]
    assert tpe_four.best.mean == pytest.approx(0.7) and tpe_four.pass_rate == pytest.approx(0.75)
    assert tpe_four.cpu_s == pytest.approx(0.001 + 3 * 2.5)
    for point in points:
        assert point.best.low is not None and point.best.high is not None
        assert point.best.low <= point.best.mean <= point.best.high


def test_shape_check_passes_a_complete_run_and_names_what_is_off() -> None:
    rows = bench_rows(seeds=2, jobs=4)
    methods = ["trained_agent", "optuna_tpe", "sensible_preset"]
    assert shape_problems(rows, methods, ["date_format"], [0, 1], 4, "full") == []
    short = [row for row in rows if not (row.method == "optuna_tpe" and row.seed == 1 and row.job_index == 4)]
    assert shape_problems(short, methods, ["date_format"], [0, 1], 4, "full") == ["optuna_tpe/date_format/seed 1: jobs [1, 2, 3], expected 1..4"]
    assert shape_problems(rows, methods, ["date_format"], [0, 1], 4, "quick")[-1] == "rows not labelled quick"
    assert shape_problems(rows, [*methods, "random_search"], ["date_format"], [0, 1], 4, "full")[0].startswith("random_search/date_format/seed 0: jobs []")


def test_zero_shot_lines_compare_the_first_job_with_tpe_and_say_when_the_trained_agent_is_missing() -> None:
    points = summarize(bench_rows(seeds=3, jobs=4))
    trained, untrained = zero_shot_lines(points, "date_format")
    assert trained.startswith("zero-shot on date_format: trained agent's first job 0.650 [")
    assert "best of 1: 0.200" in trained and "Optuna TPE matches it in 4 job(s)" in trained
    assert untrained == "zero-shot on date_format: untrained agent: not run"
    without = summarize([row for row in bench_rows() if row.method != "trained_agent"])
    assert zero_shot_lines(without, "date_format")[0] == "zero-shot on date_format: trained agent: MISSING (not run: no policy given)"


# -- the search space and the methods ---------------------------------------------------------------


def test_the_search_space_is_the_job_language_grids() -> None:
    space = {dimension.name: dimension.choices for dimension in search_space()}
    assert len(space) == 1 + len(jl.TRAINING_SLOTS) + len(jl.REWARD_COMPONENTS) + len(jl.DATASET_SLOTS)
    assert space["model.name"] == jl.MODEL_SLOT.tokens
    for slot in (*jl.TRAINING_SLOTS, *jl.DATASET_SLOTS):
        assert space[f"{slot.section}.{slot.key}"] == slot.tokens
    for name in jl.REWARD_COMPONENTS:
        assert space[f"reward.{name}"] == (ABSENT, *(jl.weight_token(weight) for weight in jl.REWARD_WEIGHTS))
    used = {choice for choices in space.values() for choice in choices if choice != ABSENT}
    structural = {jl.REWARD_DEFAULT, jl.REWARD_END, *(jl.component_token(name) for name in jl.REWARD_COMPONENTS)}
    assert used | structural == set(jl.JOB_TOKENS), "every job token is reachable, and nothing else"


def test_every_point_is_a_complete_job_that_decodes_to_its_choices() -> None:
    rng = random.Random(0)
    space = search_space()
    for _ in range(300):
        drawn = {dimension.name: rng.choice(dimension.choices) for dimension in space}
        point = fitted_point(drawn, jl.ContextRules())
        assert {name for name in point if point[name] != drawn[name]} <= {"training.group_size", "reward.correctness"}
        tokens = point_tokens(point)
        assert jl.is_complete(tokens)
        choice = jl.decode_job(tokens)
        for slot in jl.TRAINING_SLOTS:
            assert jl.TOKEN_ID[point[f"{slot.section}.{slot.key}"]] == jl.TOKEN_ID[slot.token(choice.hyperparameters[f"{slot.section}.{slot.key}"])]
        present = {name: point[f"reward.{name}"] for name in jl.REWARD_COMPONENTS if point[f"reward.{name}"] != ABSENT}
        if present:
            assert choice.reward == {name: float(token.removeprefix("w=")) for name, token in present.items()}
        else:
            assert choice.reward is None
    nothing = {dimension.name: dimension.choices[0] for dimension in space}
    assert jl.format_tokens(point_tokens(nothing)).split()[8] == jl.REWARD_DEFAULT


def test_random_and_tpe_write_on_grid_jobs_that_the_probe_judges() -> None:
    spec = task("addition")
    narrow = spec.model_copy(
        update={
            "budget": spec.budget.model_copy(update={"max_rollout_tokens": 30_000, "allowed_models": ["Qwen/Qwen3-0.6B"]}),
            "data": spec.data.model_copy(update={"min_dataset_size": 300, "max_dataset_size": 3000, "difficulty_range": (0.2, 0.4)}),
        }
    )
    for limited in (spec, narrow):
        for proposer in (RandomProposer(limited, "addition", 0), TpeProposer(limited, "addition", 0)):
            for index in range(1, 13):
                text = proposer.propose(index)
                if limited is spec:
                    assert jl.parse_job_toml(text), "the job is expressible in the job language"
                verdict = probe_job_text(text, limited, (local_compile_problems,))
                assert verdict.passed, verdict.errors  # no job spent on a value the probe must refuse
                proposer.observe(verdict, 0.3)
    again = RandomProposer(spec, "addition", 0)
    assert again.propose(1) == RandomProposer(spec, "addition", 0).propose(1)


def test_a_fitted_point_keeps_to_the_rollout_budget_and_models_by_the_nearest_choices() -> None:
    space = {dimension.name: dimension.choices[0] for dimension in search_space()}
    point = {
        **space,
        "model.name": "model=Qwen/Qwen3-1.7B",
        "training.max_steps": "steps=1000",
        "training.batch_size": "batch=256",
        "rollout.max_tokens": "maxtok=64",
        "reward.format": "w=-1.0",
    }
    rules = jl.ContextRules(models=frozenset({"Qwen/Qwen3-0.6B"}), rollout_bound=2**15)
    fitted = fitted_point(point, rules)
    assert fitted["model.name"] == "model=Qwen/Qwen3-0.6B"
    choice = jl.decode_job(point_tokens(fitted))
    hyper = choice.hyperparameters
    assert (hyper["training.max_steps"] or 40) * (hyper["training.batch_size"] or 64) * (hyper["rollout.max_tokens"] or 16) <= 2**15
    assert choice.reward == {"correctness": 1.0, "format": -1.0}


def test_the_agent_retries_with_the_probe_feedback_and_starts_a_new_episode_after_the_last_attempt() -> None:
    from metarl.policy.local_policy import LocalPolicy, PolicyConfig

    agent = AgentProposer(LocalPolicy(PolicyConfig(default_bias=1.0)), task(), "date_format", 0, temperature=1.0, max_attempts=3)
    rejected = ProbeVerdict(passed=False, errors=[FieldProblem(field="dataset.size", message="too small", fix="more")])
    agent.propose(1)
    agent.observe(rejected, None)
    assert agent.attempt == 2 and [p.field for p in agent.feedback] == ["dataset.size"]
    agent.propose(2)
    agent.observe(rejected, None)
    agent.propose(3)
    agent.observe(rejected, None)
    assert agent.attempt == 1 and agent.feedback == []
    agent.observe(ProbeVerdict(passed=True), 0.5)
    assert agent.attempt == 1


def test_the_sensible_preset_passes_the_probe_as_the_small_models_preset() -> None:
    text = sensible_job_toml(task(), seed=7)
    verdict = probe_job_text(text, task(), (local_compile_problems,))
    assert verdict.passed, verdict.errors
    assert verdict.job is not None and verdict.job.model.name == "Qwen/Qwen3-0.6B"
    assert verdict.job.training.learning_rate == 3e-4 and verdict.job.training.batch_size == 256 and verdict.job.training.seed == 7
    assert "training.learning_rate=0.0003" in job_description(text).split()


def test_job_seeds_are_fixed_and_differ_by_seed_family_and_job() -> None:
    assert job_seed(0, "addition", 1) == job_seed(0, "addition", 1)
    assert len({job_seed(seed, family, job) for seed in range(3) for family in ("addition", "sorting") for job in range(1, 9)}) == 48


# -- budget and provenance -------------------------------------------------------------------------


def test_the_budget_arithmetic_fits_the_targets() -> None:
    assert worst_case_jobs(4, 3, 3, 8) == 297
    training = ("addition", "reversal", "caesar", "max_of_list", "sorting")
    full, quick = default_plan("full", ["date_format"], training, 60.0), default_plan("quick", ["date_format"])
    assert full.families == ["date_format", *training] and quick.families == ["date_format", "addition"]
    assert (full.jobs, full.seeds, full.train_seconds) == (4, 3, 60.0)
    full_s = worst_case_wall_s(full, len(SEARCHING_METHODS), JOB_OVERHEAD_S, SETUP_S["full"])
    assert full_s == SETUP_S["full"] + 153 * (60.0 + JOB_OVERHEAD_S)
    one_family = full.model_copy(update={"families": ["date_format"]})
    assert worst_case_wall_s(one_family, len(SEARCHING_METHODS), JOB_OVERHEAD_S, SETUP_S["full"]) <= TARGET_WALL_S["full"]
    assert worst_case_wall_s(quick, len(SEARCHING_METHODS), QUICK_JOB_OVERHEAD_S, SETUP_S["quick"]) <= TARGET_WALL_S["quick"]


def test_provenance_from_a_file_beside_the_state_or_from_the_path_and_flags(tmp_path: Path) -> None:
    state = tmp_path / "artifacts" / "policy" / "58a50e26" / "v00012-0123456789ab.pt"
    state.parent.mkdir(parents=True)
    state.write_bytes(b"")
    with pytest.raises(ConfigError) as caught:
        resolve_provenance(state, None, None)
    assert [problem.field for problem in caught.value.problems] == ["--policy-commit", "--policy-seed"]
    found = resolve_provenance(state, "954a5ee", 0)
    assert found == PolicyProvenance(run_id="58a50e26", commit="954a5ee", seed=0, outer_version=12)
    assert resolve_provenance(state, None, None) == found, "written beside the state, read back"
    elsewhere = tmp_path / "trained.pt"
    elsewhere.write_bytes(b"")
    with pytest.raises(ConfigError) as caught:
        resolve_provenance(elsewhere, "954a5ee", 0)
    assert [problem.field for problem in caught.value.problems] == ["--policy"]


def test_the_summary_says_how_many_jobs_each_method_lost_to_rejections() -> None:
    from metarl.versus_search import rejections_line

    rows = [
        *series_rows("random_search", "addition", 0, [None, 0.3, None, 0.4]),
        *series_rows("random_search", "addition", 1, [0.3, 0.3, 0.3, None]),
        *series_rows("sensible_preset", "addition", 0, [0.5]),
        *series_rows("trained_agent", "addition", 0, [0.6, 0.6, 0.6, 0.6]),
    ]
    assert rejections_line(rows) == "jobs lost to probe rejections: trained agent 0/4; random search 3/8; sensible preset 0/1"
    assert rejections_line([]) == "jobs lost to probe rejections: no jobs"


def test_families_may_be_task_spec_files_added_under_their_ids() -> None:
    from bench.versus_search import family_ids

    specs = {"addition": task("addition")}
    spec_file = REPO / "examples" / "families" / "increment" / "increment.toml"
    ids = family_ids(f"addition, {spec_file}", specs)
    assert ids[0] == "addition" and ids[1] in specs and specs[ids[1]].id == ids[1] and len(specs) == 2
    clash = load_toml_model(TaskSpec, REPO / "tasks_specs" / "sorting.toml")
    with pytest.raises(ConfigError, match="has the id 'sorting' of a task of the run config"):
        family_ids(str(REPO / "tasks_specs" / "sorting.toml"), {"sorting": clash.model_copy(update={"held_out": not clash.held_out})})
