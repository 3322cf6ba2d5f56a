"""Family features of the local policy's context: pure bucketing, and an unseen family as a valid context."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from metarl.policy import job_language as jl
from metarl.policy.family_features import (
    ANSWER_LENGTH_BOUNDS,
    DESCRIPTION_BUCKETS,
    FEATURE_TOKEN_COUNT,
    FEATURE_TOKENS,
    GRADER_BUCKETS,
    FamilyFeatures,
    answer_type_of,
    difficulty_buckets,
    family_answer_type,
    family_features,
    feature_tokens,
    length_bucket,
    stable_bucket,
)
from metarl.policy.local_policy import LocalPolicy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

UNSEEN = family_features(
    "Translate an English word to French. Prompt: 'fr WORD>'; the answer is the French word.",
    grader_kind="one_of_n",
    difficulty_range=(0.3, 0.6),
    examples=[("fr cat>", "chat"), ("fr water>", "eau"), ("fr summer>", "été")],
)


def test_answer_types():
    assert [answer_type_of(text) for text in ("042", "abc", "été", "a1", "-3", "23 apr 1987", "")] == [
        "digits",
        "letters",
        "letters",
        "mixed",
        "mixed",
        "text",
        "text",
    ]
    assert family_answer_type(["12", "7"]) == "digits"
    assert family_answer_type(["12", "ab"]) == "mixed"
    assert family_answer_type(["12", "a b"]) == "text"
    assert family_answer_type([]) == "text"


def test_length_buckets_use_the_mean_and_an_open_last_bucket():
    assert length_bucket([1, 2, 3], ANSWER_LENGTH_BOUNDS) == 0  # mean 2 <= 2
    assert length_bucket([3, 4], ANSWER_LENGTH_BOUNDS) == 1
    assert length_bucket([17], ANSWER_LENGTH_BOUNDS) == len(ANSWER_LENGTH_BOUNDS)
    assert length_bucket([], ANSWER_LENGTH_BOUNDS) == 0


def test_difficulty_range_rounds_outwards_and_is_never_empty():
    assert difficulty_buckets(0.0, 1.0) == (0, 4)
    assert difficulty_buckets(0.3, 0.6) == (1, 3)
    assert difficulty_buckets(0.5, 0.5) == (2, 3)
    assert difficulty_buckets(1.0, 1.0) == (3, 4)
    with pytest.raises(ValueError, match="0 <= low <= high <= 1"):
        difficulty_buckets(0.8, 0.2)


def test_hash_buckets_are_stable_and_ignore_case_and_whitespace_of_descriptions():
    assert stable_bucket("exact", GRADER_BUCKETS, "grader") == stable_bucket("exact", GRADER_BUCKETS, "grader")
    one = family_features("Add two numbers.\n  Answer the sum.")
    other = family_features("add two numbers. answer   the sum.")
    assert one.description == other.description
    buckets = {family_features(f"family number {index}").description for index in range(64)}
    assert buckets == set(range(DESCRIPTION_BUCKETS))  # every bucket is reachable


def test_features_of_an_unseen_family_and_their_tokens():
    assert UNSEEN.answer_type == "letters" and UNSEEN.answer_length == 1 and UNSEEN.prompt_length == 1
    assert (UNSEEN.difficulty_low, UNSEEN.difficulty_high) == (1, 3)
    tokens = feature_tokens(UNSEEN)
    assert len(tokens) == FEATURE_TOKEN_COUNT and set(tokens) <= set(FEATURE_TOKENS)
    assert tokens[:3] == ("ans=letters", "alen<=4", "plen<=16")
    assert tokens[4:6] == ("dlo=0.25", "dhi=0.75")


def test_features_are_bounded():
    with pytest.raises(ValidationError):
        FamilyFeatures(answer_type="digits", answer_length=9, prompt_length=0, grader=0, difficulty_low=0, difficulty_high=4, description=0)
    with pytest.raises(ValidationError):
        FamilyFeatures(answer_type="emoji", answer_length=0, prompt_length=0, grader=0, difficulty_low=0, difficulty_high=4, description=0)  # type: ignore[arg-type]


def test_every_feature_combination_is_a_valid_context():
    for answer_type in ("digits", "letters", "mixed", "text"):
        for length in range(len(ANSWER_LENGTH_BOUNDS) + 1):
            features = FamilyFeatures(
                answer_type=answer_type,
                answer_length=length,
                prompt_length=length,
                grader=GRADER_BUCKETS - 1,
                difficulty_low=3,
                difficulty_high=4,
                description=0,
            )
            tokens = jl.context_tokens(features, attempt=7)
            assert tokens[0] == jl.BOS_ID and tokens[-1] == jl.SEP_ID and len(tokens) <= jl.MAX_CONTEXT_LENGTH


def test_the_policy_samples_valid_jobs_for_a_family_it_never_saw():
    policy = LocalPolicy()
    context = jl.context_tokens(UNSEEN, attempt=2)
    samples = policy.sample_batch([context] * 16, list(range(16)))
    for sample in samples:
        assert sample.prompt_tokens == context
        assert jl.is_complete(sample.job_tokens)
        assert len(sample.logprobs) == len(sample.job_tokens)
        assert "[model]" in sample.render(seed=1)
    again = policy.sample(context, seed=3)
    assert again.tokens == samples[3].tokens
    assert policy.logprobs(context, again.job_tokens).sum().item() == pytest.approx(sum(again.logprobs), abs=1e-4)
