"""The local GRPO trainer end to end on tiny models: outputs, reproducibility, knobs, learning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from metarl.learning.families import generate_dataset
from metarl.learning.grpo import LocalTrainConfig, StepMetrics, read_metrics, train
from metarl.learning.models import ensure_base_model
from metarl.learning.presets import bad_config, sensible_config
from metarl.learning.registry import get_family
from metarl.learning.scoring import score_checkpoint

TINY_SCALE = 0.01
LEARNING_TEST_SCALE = 0.25
LEARNING_TEST_FAMILY = "sorting"
LEARNING_TEST_STEPS = 100
LEARNING_TEST_MARGIN = 0.30
"""Required hidden-eval gain. Measured on 2 cores: base 0.085, gain +0.690/+0.680/+0.655 for seeds
0/1/2 (a rerun with the same seed is bit-identical), so 0.30 is far outside seed noise."""


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local-s base model pretrained for a handful of steps, shared by the session."""
    return ensure_base_model("local-s", tmp_path_factory.getbasetemp() / "metarl-models", scale=TINY_SCALE)


def quick_config(**overrides) -> LocalTrainConfig:
    """A few small steps: enough to exercise every code path quickly."""
    settings = {"max_steps": 3, "batch_size": 4, "group_size": 4, "max_tokens": 6, "learning_rate": 1e-3, "warmup_steps": 0}
    settings.update(overrides)
    return LocalTrainConfig(**settings)


def metrics_without_time(path: str) -> list[dict]:
    """Metric rows with the wall-clock column removed."""
    return [row.model_dump(exclude={"wall_s"}) for row in read_metrics(path)]


def test_train_writes_metrics_and_a_loadable_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    family = get_family("caesar")
    dataset = generate_dataset(family, 16, seed=0, difficulty=0.3)
    outcome = train(quick_config(), dataset, family, tiny_model_dir, tmp_path)
    assert outcome.steps_completed == 3 and outcome.stopped_by == "max_steps"
    rows = [json.loads(line) for line in Path(outcome.metrics_path).read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2]
    for row in rows:
        StepMetrics.model_validate(row)
        assert set(row) >= {"step", "reward_mean", "loss", "kl", "entropy", "wall_s"}
    checkpoint = Path(outcome.checkpoint_dir)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (checkpoint / name).exists()
    score = score_checkpoint(checkpoint, family, family.hidden_eval(20))
    assert 0.0 <= score.mean <= 1.0


def test_same_seed_gives_same_metrics_and_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    family = get_family("addition")
    dataset = generate_dataset(family, 16, seed=1, difficulty=0.5)
    first = train(quick_config(seed=5), dataset, family, tiny_model_dir, tmp_path / "a")
    second = train(quick_config(seed=5), dataset, family, tiny_model_dir, tmp_path / "b")
    other = train(quick_config(seed=6), dataset, family, tiny_model_dir, tmp_path / "c")
    assert metrics_without_time(first.metrics_path) == metrics_without_time(second.metrics_path)
    assert metrics_without_time(first.metrics_path) != metrics_without_time(other.metrics_path)
    weights_a = load_file(str(Path(first.checkpoint_dir) / "model.safetensors"))
    weights_b = load_file(str(Path(second.checkpoint_dir) / "model.safetensors"))
    assert all(torch.equal(weights_a[name], weights_b[name]) for name in weights_a)


def test_group_size_one_learns_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    family = get_family("sorting")
    dataset = generate_dataset(family, 16, seed=2, difficulty=0.5)
    outcome = train(quick_config(group_size=1, batch_size=8), dataset, family, tiny_model_dir, tmp_path)
    assert all(row.zero_advantage_groups == 1.0 for row in read_metrics(outcome.metrics_path))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    trained = load_file(str(Path(outcome.checkpoint_dir) / "model.safetensors"))
    assert all(torch.equal(base[name], trained[name]) for name in base)


def test_lora_with_kl_trains_adapters_and_saves_merged_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    family = get_family("reversal")
    dataset = generate_dataset(family, 16, seed=3, difficulty=0.5)
    config = quick_config(lora_rank=4, kl_coef=0.1, temperature=1.5, updates_per_batch=2)
    outcome = train(config, dataset, family, tiny_model_dir, tmp_path)
    rows = read_metrics(outcome.metrics_path)
    assert all(row.kl >= 0.0 for row in rows)
    assert outcome.trainable_parameters < 50_000
    trained = load_file(str(Path(outcome.checkpoint_dir) / "model.safetensors"))
    assert not any("lora" in name for name in trained)
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(base) == set(trained)
    assert torch.equal(base["model.embed_tokens.weight"], trained["model.embed_tokens.weight"])


def test_full_fine_tune_with_kl_to_frozen_copy(tiny_model_dir: Path, tmp_path: Path) -> None:
    family = get_family("max_of_list")
    dataset = generate_dataset(family, 16, seed=4, difficulty=0.5)
    outcome = train(quick_config(kl_coef=0.5, max_steps=2), dataset, family, tiny_model_dir, tmp_path)
    assert outcome.steps_completed == 2
    assert read_metrics(outcome.metrics_path)[0].kl == pytest.approx(0.0, abs=1e-6)


def test_time_budget_stops_training(tiny_model_dir: Path, tmp_path: Path) -> None:
    family = get_family("date_format")
    dataset = generate_dataset(family, 16, seed=5, difficulty=0.5)
    outcome = train(quick_config(max_steps=1000, time_budget_s=1.0), dataset, family, tiny_model_dir, tmp_path)
    assert outcome.stopped_by == "time_budget"
    assert 1 <= outcome.steps_completed < 1000


def test_empty_dataset_is_rejected(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        train(quick_config(), [], get_family("addition"), tiny_model_dir, tmp_path)


@pytest.fixture(scope="module")
def learning_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """local-s with a quarter of the pretraining budget: weaker than the real one, built in about 35 s."""
    return ensure_base_model("local-s", tmp_path_factory.getbasetemp() / "metarl-models", scale=LEARNING_TEST_SCALE)


@pytest.mark.slow
def test_sensible_config_improves_hidden_eval_and_bad_config_does_not(learning_model_dir: Path, tmp_path: Path) -> None:
    family = get_family(LEARNING_TEST_FAMILY)
    eval_items = family.hidden_eval(200)
    base = score_checkpoint(learning_model_dir, family, eval_items)
    dataset = generate_dataset(family, 1000, seed=0, difficulty=(0.0, 1.0))
    sensible = sensible_config("local-s", family).model_copy(update={"max_steps": LEARNING_TEST_STEPS, "time_budget_s": 600.0})
    trained = train(sensible, dataset, family, learning_model_dir, tmp_path / "sensible")
    after = score_checkpoint(trained.checkpoint_dir, family, eval_items)
    assert after.mean - base.mean >= LEARNING_TEST_MARGIN, (base.mean, after.mean)
    bad = bad_config("local-s", family).model_copy(update={"time_budget_s": 600.0})
    collapsed = train(bad, dataset, family, learning_model_dir, tmp_path / "bad")
    assert score_checkpoint(collapsed.checkpoint_dir, family, eval_items).mean < after.mean - 0.2
