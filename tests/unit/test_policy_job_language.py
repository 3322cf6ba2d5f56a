"""The job language: vocabulary, grammar, context tokens, job.toml rendering and parsing."""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

import pytest

from metarl.backends.local.train import REWARD_COMPONENTS as LOCAL_REWARD_COMPONENTS
from metarl.backends.local.train import local_compile_problems
from metarl.policy import job_language as jl
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
    assert jl.VOCAB_SIZE == len(set(jl.VOCAB)) < 160
    assert jl.VOCAB[:4] == ("<pad>", "<bos>", "<sep>", "<end>")
    assert set(jl.MODELS) == set(KNOWN_BASE_MODELS)
    assert set(jl.REWARD_COMPONENTS) == set(LOCAL_REWARD_COMPONENTS)
    contexts = {jl.format_tokens(jl.context_for_task(load_toml_model(TaskSpec, path))) for path in (REPO / "tasks_specs").glob("*.toml")}
    assert len(contexts) == len(list((REPO / "tasks_specs").glob("*.toml")))  # the shipped families are told apart
    for slot in jl.TRAINING_SLOTS + jl.DATASET_SLOTS:
        assert jl.TOKEN_ID[slot.token(None)] in jl.DEFAULT_TOKEN_IDS
    assert 1 in jl.TRAINING_SLOTS[3].values  # group_size 1 is expressible
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
    ("hyper", "field"),
    [
        # 12 is not divisible by the default group_size 8
        ("lr=default steps=default batch=12 group=default", "training.batch_size"),
        ("lr=default steps=default batch=8 group=16", "training.batch_size"),
        # 1000 x 256 x 16 rollout tokens is over the task budget of 2M
        ("lr=default steps=1000 batch=256 group=default", "training.max_steps"),
    ],
)
def test_semantically_invalid_jobs_stay_expressible(hyper, field):
    tokens = job(f"model=Qwen/Qwen3-0.6B {hyper} kl=default temp=default maxtok=default {TAIL}")
    verdict = probe(tokens)
    assert not verdict.passed
    assert field in {problem.field for problem in verdict.errors}


def test_schema_invalid_jobs_render_as_raw_toml_for_the_probe_to_reject():
    no_positive_weight = job(f"{BASE} rw=correctness w=0.0 rw=format w=-1.0 reward=end data=default diff=default <end>")
    text = jl.render_job_toml(no_positive_weight)
    assert tomllib.loads(text)["reward"]["components"] == {"correctness": 0.0, "format": -1.0}
    verdict = probe(no_positive_weight)
    assert not verdict.passed and [jl.feedback_kind(p.field) for p in verdict.errors] == ["reward"]
    too_small = job(f"{BASE} reward=default data=32 diff=default <end>")
    verdict = probe(too_small)
    assert not verdict.passed and {p.field for p in verdict.errors} == {"dataset.size"}


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


def test_context_tokens_hold_features_attempt_and_deduplicated_feedback():
    assert jl.format_tokens(jl.context_for_task(CAESAR)) == "<bos> ans=letters alen<=4 plen<=16 grader=7 dlo=0.0 dhi=1.0 desc=2 attempt=1 fb=none <sep>"
    feedback = [
        FieldProblem(field="training.batch_size", message="m", fix="f"),
        FieldProblem(field="model.name", message="m", fix="f"),
        FieldProblem(field="(local trainer) batch_size", message="m", fix="f"),
    ]
    text = jl.format_tokens(jl.context_for_task(TASK, 9, feedback))
    assert text == f"<bos> {FEATURES} attempt=5 fb=model fb=batch_size <sep>"
    assert len(jl.context_for_task(TASK, 2, [FieldProblem(field=f"x{i}", message="m", fix="f") for i in range(200)])) == 11
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
    assert jl.format_tokens(jl.context_for_episode(ctx)) == f"<bos> {FEATURES} attempt=2 fb=dataset_size <sep>"
