"""The job language: vocabulary, grammar, context tokens, job.toml rendering and parsing."""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

import pytest

from metarl.backends.local.train import REWARD_COMPONENTS as LOCAL_REWARD_COMPONENTS
from metarl.backends.local.train import local_compile_problems
from metarl.graders import MAX_ANSWER_CHARS
from metarl.learning.grpo import LocalTrainConfig
from metarl.policy import job_language as jl
from metarl.policy.job_limits import LONGEST_ROLLOUT_TOKENS, JobLimits, answer_max_tokens, job_limits, longest_answer_bytes
from metarl.policy.task_features import task_examples
from metarl.probe.job import probe_job_text
from schemas.base import FieldProblem, load_toml_model
from schemas.job import JobSpec
from schemas.task_spec import KNOWN_BASE_MODELS, TaskSpec

REPO = Path(__file__).resolve().parents[2]
TASK = load_toml_model(TaskSpec, REPO / "tasks_specs" / "addition.toml")


def job(text: str) -> list[int]:
    return jl.parse_tokens(text)


BASE = "model=Qwen/Qwen3-0.6B lr=default steps=default batch=default group=default kl=default temp=default maxtok=default"
DEFAULT_JOB = f"{BASE} reward=default data=default diff=default <end>"


def probe(tokens: list[int]):
    return probe_job_text(jl.render_job_toml(tokens, seed=7), TASK, [local_compile_problems])


def random_walk(rng: random.Random) -> list[int]:
    tokens: list[int] = []
    while True:
        allowed = jl.allowed_next(tokens)
        if not allowed:
            return tokens
        tokens.append(rng.choice(allowed))


def test_vocabulary_is_fixed_small_and_covers_models_features_and_rewards():
    assert jl.VOCAB_SIZE == len(set(jl.VOCAB)) < 200
    assert jl.VOCAB[:4] == ("<pad>", "<bos>", "<sep>", "<end>")
    assert set(jl.MODELS) == set(KNOWN_BASE_MODELS)
    assert set(jl.REWARD_COMPONENTS) == set(LOCAL_REWARD_COMPONENTS)
    contexts = {jl.format_tokens(jl.context_for_task(load_toml_model(TaskSpec, path))) for path in (REPO / "tasks_specs").glob("*.toml")}
    assert len(contexts) == len(list((REPO / "tasks_specs").glob("*.toml")))  # the shipped families are told apart
    for slot in jl.TRAINING_SLOTS + jl.DATASET_SLOTS:
        assert jl.TOKEN_ID[slot.token(None)] in jl.DEFAULT_TOKEN_IDS
    assert 1 not in jl.TRAINING_SLOTS[3].values  # group_size 1 would train nothing (test_the_language_offers_no_job_that_cannot_learn)
    assert jl.format_tokens(jl.parse_tokens(DEFAULT_JOB)) == DEFAULT_JOB


def test_random_walks_under_the_grammar_always_end_complete():
    rng = random.Random(0)
    for _ in range(300):
        tokens = random_walk(rng)
        assert tokens[-1] == jl.END_ID and len(tokens) <= jl.MAX_JOB_LENGTH
        assert jl.is_complete(tokens)
        choice = jl.decode_job(tokens)
        assert choice.model in jl.MODELS
        text = jl.render_job_toml(tokens)
        assert tomllib.loads(text)["model"]["name"] == choice.model


def test_grammar_rejects_out_of_order_and_incomplete_sequences():
    assert jl.allowed_next([]) == tuple(jl.TOKEN_ID[t] for t in jl.MODEL_SLOT.tokens)
    with pytest.raises(ValueError, match="not allowed"):
        jl.grammar_state(job("lr=default"))
    assert not jl.is_complete(job(BASE))
    with pytest.raises(ValueError, match="incomplete"):
        jl.decode_job(job(BASE))
    # reward components: canonical order, each at most once, a weight after each
    prefix = job(f"{BASE} rw=exact w=1.0")
    allowed = {jl.VOCAB[t] for t in jl.allowed_next(prefix)}
    assert allowed == {"rw=format", "rw=length_penalty", "reward=end"}
    assert {jl.VOCAB[t] for t in jl.allowed_next(job(f"{BASE} rw=exact"))} == {jl.weight_token(w) for w in jl.REWARD_WEIGHTS}
    assert jl.allowed_next(job(DEFAULT_JOB)) == ()
    with pytest.raises(ValueError):
        jl.grammar_state(job(DEFAULT_JOB) + [jl.END_ID])


def test_default_job_renders_through_jobspec_and_passes_the_probe():
    text = jl.render_job_toml(job(DEFAULT_JOB), seed=7)
    spec = JobSpec.model_validate(tomllib.loads(text))
    assert spec.explicit_hyperparameters() == 0 and spec.training.seed == 7
    assert probe(job(DEFAULT_JOB)).passed


def test_render_and_parse_round_trip_for_explicit_jobs():
    tokens = job(
        "model=Qwen/Qwen3-1.7B lr=0.0003 steps=80 batch=32 group=8 kl=0.01 temp=0.7 maxtok=32 "
        "rw=correctness w=1.0 rw=length_penalty w=0.1 reward=end data=4000 diff=0.25 <end>"
    )
    text = jl.render_job_toml(tokens)
    spec = JobSpec.model_validate(tomllib.loads(text))
    assert spec.model.name == "Qwen/Qwen3-1.7B"
    assert spec.training.learning_rate == pytest.approx(3e-4) and spec.rollout.temperature == pytest.approx(0.7)
    assert spec.reward.components == {"correctness": 1.0, "length_penalty": 0.1}
    assert spec.explicit_hyperparameters() == 7
    assert jl.parse_job_toml(text) == tokens
    assert probe(tokens).passed
    # a full sequence (context + job) renders the same job
    assert jl.render_job_toml(jl.context_for_task(TASK) + tokens) == text
    # JobSpec writes the dataset and reward defaults out, so `data=default` comes back as `data=1000`:
    # parsing is exact up to that, and rendering is a fixed point.
    rng = random.Random(1)
    for _ in range(100):
        walk = random_walk(rng)
        text = jl.render_job_toml(walk)
        again = jl.parse_job_toml(text)
        assert jl.render_job_toml(again) == text
        assert again[: 1 + len(jl.TRAINING_SLOTS)] == walk[: 1 + len(jl.TRAINING_SLOTS)]


def test_off_grid_jobs_are_not_parsed():
    with pytest.raises(ValueError, match="not on the grid"):
        jl.parse_job_toml('[model]\nname = "Qwen/Qwen3-0.6B"\n[training]\nlearning_rate = 0.005\n')
    with pytest.raises(ValueError, match="lora_rank"):
        jl.parse_job_toml('[model]\nname = "Qwen/Qwen3-0.6B"\nlora_rank = 8\n')


TAIL = "reward=default data=default diff=default <end>"


@pytest.mark.parametrize(
    ("prefix", "refused"),
    [
        # 12 is not divisible by the default group_size 8
        ("model=Qwen/Qwen3-0.6B lr=default steps=default batch=12", "group=default"),
        ("model=Qwen/Qwen3-0.6B lr=default steps=default batch=8", "group=16"),
        # a reward table must hold a positive weight before it ends
        (f"{BASE} rw=correctness w=0.0 rw=exact w=-1.0", "reward=end"),
        (f"{BASE} rw=exact w=0.0", "rw=length_penalty"),
        (f"{BASE} rw=format", "w=0.0"),
    ],
)
def test_the_grammar_refuses_what_the_probe_would_refuse(prefix, refused):
    assert jl.TOKEN_ID[refused] not in jl.allowed_next(job(prefix))


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[training]\nbatch_size = 12\n", "training.batch_size"),
        ("[training]\nbatch_size = 8\ngroup_size = 16\n", "training.batch_size"),
        ("[training]\nmax_steps = 1000\nbatch_size = 256\n", "training.max_steps"),
        ("[reward.components]\ncorrectness = 0.0\nformat = -1.0\n", "reward"),
        ("[dataset]\nsize = 32\n", "dataset.size"),
    ],
)
def test_the_probe_still_refuses_the_same_jobs_written_by_hand(text, field):
    verdict = probe_job_text(f'[model]\nname = "Qwen/Qwen3-0.6B"\n{text}', TASK)
    assert not verdict.passed
    assert any(problem.field.startswith(field) for problem in verdict.errors), verdict.errors


def tight_task(base: TaskSpec) -> TaskSpec:
    """A task with narrow limits: the small model only, a 40,000-token rollout budget, 100-500 items, difficulty 0.3-0.6."""
    return base.model_copy(
        update={
            "budget": base.budget.model_copy(update={"max_rollout_tokens": 40_000, "allowed_models": ["Qwen/Qwen3-0.6B"]}),
            "data": base.data.model_copy(update={"min_dataset_size": 100, "max_dataset_size": 500, "difficulty_range": (0.3, 0.6)}),
        }
    )


@pytest.mark.parametrize("spec", sorted(path.name for path in (REPO / "tasks_specs").glob("*.toml")) + ["tight"])
def test_every_job_the_grammar_allows_under_a_tasks_context_passes_the_probes_checks(spec):
    task = tight_task(TASK) if spec == "tight" else load_toml_model(TaskSpec, REPO / "tasks_specs" / spec)
    limits = job_limits(task)
    rules = jl.context_rules(jl.context_for_task(task))
    rng = random.Random(spec)
    for _ in range(300):
        tokens: list[int] = []
        while allowed := jl.allowed_next(tokens, rules):
            tokens.append(rng.choice(allowed))
        verdict = probe_job_text(jl.render_job_toml(tokens, seed=1, limits=limits), task)
        assert verdict.passed, (jl.format_tokens(tokens), verdict.errors)


def test_the_dataset_is_moved_into_the_tasks_range_when_rendered():
    limits = job_limits(tight_task(TASK))
    small = tomllib.loads(jl.render_job_toml(job(f"{BASE} reward=default data=32 diff=0.0 <end>"), limits=limits))
    assert (small["dataset"]["size"], small["dataset"]["difficulty"]) == (100, 0.3)
    default = tomllib.loads(jl.render_job_toml(job(DEFAULT_JOB), limits=limits))
    assert default["dataset"]["size"] == 500 and default["dataset"]["difficulty"] == 0.5
    inside = tomllib.loads(jl.render_job_toml(job(DEFAULT_JOB), limits=job_limits(TASK)))
    assert (inside["dataset"]["size"], inside["dataset"]["difficulty"]) == (1000, 0.5)  # JobSpec writes the defaults out


DATE_TASK = load_toml_model(TaskSpec, REPO / "tasks_specs" / "date_format.toml")


def test_the_rollout_length_a_task_needs_holds_its_longest_answer_and_the_end_token():
    assert job_limits(DATE_TASK).min_max_tokens == MAX_ANSWER_CHARS["date_format"] + 1  # 'YYYY-MM-DD' and the month-name forms
    assert job_limits(TASK).min_max_tokens == MAX_ANSWER_CHARS["addition"] + 1
    assert (answer_max_tokens(0), answer_max_tokens(len("é".encode())), answer_max_tokens(500)) == (1, 3, LONGEST_ROLLOUT_TOKENS)
    assert LONGEST_ROLLOUT_TOKENS == max(jl.TRAINING_SLOTS[-1].values) == LocalTrainConfig.model_fields["max_tokens"].metadata[-1].le


def test_a_max_chars_written_in_the_spec_grader_sets_the_rollout_length_and_a_default_one_does_not():
    capitals = load_toml_model(TaskSpec, REPO / "tests" / "fixtures" / "families" / "capitals" / "capitals.toml")
    assert capitals.grader is not None and capitals.grader.max_chars == 20  # written in the spec: answers may be that long
    assert job_limits(capitals).min_max_tokens == 21
    unwritten = capitals.model_copy(update={"grader": type(capitals.grader).model_validate({"kind": "exact", "charset": "letters"})})
    assert unwritten.grader is not None and unwritten.grader.max_chars == 100  # the default: says nothing of the answers
    from_examples = job_limits(unwritten).min_max_tokens
    assert from_examples == max(len(answer) for _, answer in task_examples(unwritten)) + 1 < 21
    assert longest_answer_bytes(["ab", "é"], declared_chars=5) == 10  # declared characters at the widest bytes per character seen
    assert longest_answer_bytes(["abcdef"], declared_chars=3) == 6
    assert longest_answer_bytes([], declared_chars=0) == 0


def test_a_rollout_too_short_for_the_tasks_answers_is_raised_when_rendered():
    limits = job_limits(DATE_TASK)

    def rendered(text: str, at: JobLimits = limits) -> dict:
        return tomllib.loads(jl.render_job_toml(job(text), limits=at))

    short = rendered(DEFAULT_JOB.replace("maxtok=default", "maxtok=8").replace("steps=default", "steps=200"))
    assert (short["rollout"]["max_tokens"], short["training"]["max_steps"]) == (12, 200)
    assert rendered(DEFAULT_JOB.replace("maxtok=default", "maxtok=32"))["rollout"]["max_tokens"] == 32
    assert "max_tokens" not in rendered(DEFAULT_JOB).get("rollout", {})  # the default's 16 holds 12
    assert rendered(DEFAULT_JOB, limits.model_copy(update={"min_max_tokens": 20}))["rollout"]["max_tokens"] == 20
    assert "max_tokens" not in rendered(DEFAULT_JOB, job_limits(TASK)).get("rollout", {})


def test_a_raised_rollout_length_keeps_the_job_in_the_rollout_budget_with_fewer_steps():
    tight = job_limits(DATE_TASK).model_copy(update={"min_max_tokens": 20, "max_rollout_tokens": 640_000})
    text = DEFAULT_JOB.replace("maxtok=default", "maxtok=8").replace("steps=default", "steps=1000").replace("batch=default", "batch=64")
    data = tomllib.loads(jl.render_job_toml(job(text), limits=tight))
    assert (data["rollout"]["max_tokens"], data["training"]["max_steps"]) == (20, 500)  # 500 x 64 x 20 = 640,000
    kept = tomllib.loads(jl.render_job_toml(job(text.replace("steps=1000", "steps=200")), limits=tight))
    assert kept["training"]["max_steps"] == 200


def test_feedback_fields_map_to_feedback_tokens():
    cases = {
        "model.name": "model",
        "training.batch_size": "batch_size",
        "training.max_steps": "max_steps",
        "rollout.max_tokens": "max_tokens",
        "(local trainer) max_tokens": "max_tokens",
        "(local trainer) training.group_size": "group_size",
        "(local trainer) base_model": "model",
        "reward": "reward",
        'reward.components."odd key"': "reward",
        "dataset.size": "dataset_size",
        "dataset.difficulty": "difficulty",
        "dataset.path": "other",
        "(syntax)": "other",
        "environment.module": "other",
        "training.seed": "other",
    }
    for field_path, kind in cases.items():
        assert jl.feedback_kind(field_path) == kind, field_path


CAESAR = load_toml_model(TaskSpec, REPO / "tasks_specs" / "caesar.toml")
FEATURES = "ans=digits alen<=4 plen<=16 grader=4 dlo=0.0 dhi=1.0 desc=7"
"""The feature tokens of tasks_specs/addition.toml."""
LIMITS = "time<=90 rbud=2^20 allow=Qwen/Qwen3-0.6B allow=Qwen/Qwen3-1.7B dmin>=64 dmax<=20000"
"""Its limit tokens at its 60 s CPU cap (2,000,000 rollout tokens: 2^20 is the largest power of two below)."""


def test_context_tokens_hold_features_attempt_and_deduplicated_feedback():
    assert (
        jl.format_tokens(jl.context_for_task(CAESAR)) == f"<bos> ans=letters alen<=4 plen<=16 grader=7 dlo=0.0 dhi=1.0 desc=2 {LIMITS} attempt=1 fb=none <sep>"
    )
    feedback = [
        FieldProblem(field="training.batch_size", message="m", fix="f"),
        FieldProblem(field="model.name", message="m", fix="f"),
        FieldProblem(field="(local trainer) batch_size", message="m", fix="f"),
    ]
    text = jl.format_tokens(jl.context_for_task(TASK, 9, feedback))
    assert text == f"<bos> {FEATURES} {LIMITS} attempt=5 fb=model fb=batch_size <sep>"
    assert len(jl.context_for_task(TASK, 2, [FieldProblem(field=f"x{i}", message="m", fix="f") for i in range(200)])) == 17
    short = jl.format_tokens(jl.context_for_task(tight_task(TASK), train_seconds=20))
    assert "time<=30 rbud=2^15 allow=Qwen/Qwen3-0.6B dmin>=64 dmax<=1000 attempt=1" in short
    with pytest.raises(ValueError):
        jl.context_for_task(TASK, 0)


def test_a_task_of_a_family_without_a_generator_is_a_valid_context():
    unseen = TASK.model_copy(
        update={
            "id": "capitals",
            "family": "capitals_from_files",
            "public": TASK.public.model_copy(update={"description": "Name the capital of a country.", "example_prompt": "France?", "example_answer": "Paris"}),
        }
    )
    tokens = jl.context_for_task(unseen, 2)
    assert jl.format_tokens(tokens).startswith("<bos> ans=letters alen<=8 plen<=8 ")
    assert tokens[-1] == jl.SEP_ID and len(tokens) <= jl.MAX_CONTEXT_LENGTH


def test_context_for_episode_reads_an_episode_context():
    from metarl.interfaces import EpisodeContext

    ctx = EpisodeContext(
        run_id="r",
        episode_id=1,
        task=TASK,
        policy_version=0,
        probe_attempt=2,
        seed=3,
        feedback=[FieldProblem(field="dataset.size", message="m", fix="f")],
        artifacts_root="/tmp/x",
    )
    assert jl.format_tokens(jl.context_for_episode(ctx)) == f"<bos> {FEATURES} {LIMITS} attempt=2 fb=dataset_size <sep>"


def test_the_language_offers_no_job_that_cannot_learn():
    # group_size 1 gives every rollout a zero group-relative advantage: the job keeps its base model,
    # a safe reward the policy of 2026-12-06's seed-0 run collapsed onto (BENCHMARKS.md)
    assert "group=1" not in jl.VOCAB and jl.TOKEN_ID["group=2"] in jl.allowed_next(job("model=Qwen/Qwen3-0.6B lr=default steps=default batch=8"))
