"""The local torch policy: grammatical, deterministic sampling; behaviour logprobs; state files; initial mix."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from metarl.backends.local.train import local_compile_problems
from metarl.policy import job_language as jl
from metarl.policy.job_limits import job_limits
from metarl.policy.local_policy import LocalPolicy, PolicyConfig, mixed_logprobs, state_file_problem
from metarl.probe.job import probe_job_text
from schemas.base import FieldProblem, load_toml_model
from schemas.task_spec import TaskSpec

REPO = Path(__file__).resolve().parents[2]
TASK = load_toml_model(TaskSpec, REPO / "tasks_specs" / "addition.toml")
CTX = jl.context_for_task(TASK)
SORTING = load_toml_model(TaskSpec, REPO / "tasks_specs" / "sorting.toml")
CAESAR = load_toml_model(TaskSpec, REPO / "tasks_specs" / "caesar.toml")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_policy_is_small():
    assert LocalPolicy().num_parameters() < 100_000


def test_samples_are_complete_jobs_with_one_logprob_per_job_token():
    policy = LocalPolicy()
    samples = policy.sample_batch([CTX, jl.context_for_task(SORTING, 3, [FieldProblem(field="model.name", message="m", fix="f")])] * 20, list(range(40)))
    for sample in samples:
        assert sample.tokens[: sample.prompt_length] == sample.prompt_tokens
        assert jl.is_complete(sample.job_tokens)
        assert len(sample.logprobs) == len(sample.job_tokens)
        assert all(lp <= 0 for lp in sample.logprobs)
        assert "[model]" in sample.render(seed=1)


def test_sampling_is_deterministic_given_a_seed_and_independent_of_the_batch():
    policy = LocalPolicy()
    a = policy.sample(CTX, seed=123)
    b = policy.sample(CTX, seed=123)
    assert a == b
    batch = policy.sample_batch([jl.context_for_task(CAESAR), CTX, CTX], [5, 123, 9])
    assert batch[1].tokens == a.tokens
    assert batch[1].logprobs == pytest.approx(a.logprobs, abs=1e-5)
    distinct = {tuple(policy.sample(CTX, seed=s).tokens) for s in range(30)}
    assert len(distinct) > 10
    # the same init seed gives the same policy
    assert LocalPolicy().sample(CTX, seed=123) == a
    assert LocalPolicy(PolicyConfig(init_seed=1)).sample_batch([CTX] * 8, list(range(8))) != policy.sample_batch([CTX] * 8, list(range(8)))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_match_training_logprobs(temperature):
    policy = LocalPolicy()
    for seed in range(5):
        sample = policy.sample(CTX, seed=seed, temperature=temperature)
        recomputed = policy.logprobs(sample.prompt_tokens, sample.job_tokens, temperature=temperature)
        assert recomputed.requires_grad
        assert recomputed.detach() == pytest.approx(torch.tensor(sample.logprobs), abs=1e-5)


def test_the_exploration_floor_keeps_every_allowed_choice_at_its_share():
    logits = torch.tensor([[9.0, 0.0, -9.0, 3.0]])
    masks = torch.tensor([[True, True, True, False]])
    plain = mixed_logprobs(logits, masks, 0.0).exp()
    floored = mixed_logprobs(logits, masks, 0.3).exp()
    assert float(plain[0, 2]) < 1e-7 and float(plain[0, 3]) == 0.0
    assert float(floored.sum()) == pytest.approx(1.0) and float(floored[0, 3]) == 0.0
    assert float(floored[0, 2]) >= 0.1 - 1e-6  # 0.3 of the mass spread over the three allowed choices
    assert floored[0, :3] == pytest.approx(0.7 * plain[0, :3] + 0.1, abs=1e-6)


def test_a_floored_policy_samples_rare_choices_and_scores_them_as_sampled():
    policy = LocalPolicy(PolicyConfig(default_bias=12.0))
    plain = policy.sample_batch([CTX] * 200, list(range(200)))
    floored = policy.sample_batch([CTX] * 200, list(range(200)), floor=0.5)
    explicit = {name: sum(jl.decode_job(sample.job_tokens).explicit for sample in samples) for name, samples in (("plain", plain), ("floored", floored))}
    assert explicit["plain"] < 20 < 400 < explicit["floored"], explicit
    for sample in floored[:5]:
        recomputed = policy.logprobs(sample.prompt_tokens, sample.job_tokens, floor=0.5)
        assert recomputed.detach() == pytest.approx(torch.tensor(sample.logprobs), abs=1e-5)
        assert not torch.allclose(recomputed.detach(), policy.logprobs(sample.prompt_tokens, sample.job_tokens).detach())


def test_target_logprobs_reject_ungrammatical_jobs():
    policy = LocalPolicy()
    bad = CTX + jl.parse_tokens("lr=default")
    with pytest.raises(ValueError, match="not allowed"):
        policy.target_logprobs(torch.tensor([bad[:-1]]), torch.tensor([bad[1:]]), [len(bad) - 1])


def test_bad_contexts_are_refused():
    policy = LocalPolicy()
    with pytest.raises(ValueError, match="<sep>"):
        policy.sample(CTX[:-1], seed=0)
    with pytest.raises(ValueError, match="one seed per context"):
        policy.sample_batch([CTX], [1, 2])


def test_state_round_trips_with_adam_state_and_loads_weights_only(tmp_path):
    policy = LocalPolicy()
    optimizer = policy.make_optimizer(1e-2)
    sample = policy.sample(CTX, seed=0)
    loss = -policy.logprobs(sample.prompt_tokens, sample.job_tokens).sum()
    loss.backward()
    optimizer.step()
    path = tmp_path / "state" / "policy.pt"
    policy.save_state(path)
    payload = torch.load(path, weights_only=True)
    assert payload["optimizer"]["state"]  # Adam moments were saved
    restored = LocalPolicy.from_state(path)
    for (name, a), (_, b) in zip(policy.net.state_dict().items(), restored.net.state_dict().items()):
        assert torch.equal(a, b), name
    assert restored.sample(CTX, seed=4) == policy.sample(CTX, seed=4)
    state_a, state_b = policy.optimizer.state_dict()["state"], restored.optimizer.state_dict()["state"]
    assert all(torch.equal(state_a[k]["exp_avg"], state_b[k]["exp_avg"]) for k in state_a)
    other = LocalPolicy(PolicyConfig(init_seed=5))
    other.load_state(path)
    assert other.sample(CTX, seed=4) == policy.sample(CTX, seed=4)
    assert sorted(p.name for p in path.parent.iterdir()) == ["policy.pt"]  # no temp files left


def test_load_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "x.pt"
    torch.save({"format": "something-else"}, path)
    with pytest.raises(ValueError, match="not a local policy state"):
        LocalPolicy().load_state(path)
    policy = LocalPolicy(PolicyConfig(hidden_dim=16))
    policy.save_state(tmp_path / "small.pt")
    with pytest.raises(ValueError, match="embed/hidden"):
        LocalPolicy().load_state(tmp_path / "small.pt")


def test_state_file_problem_names_what_keeps_a_state_from_loading(tmp_path):
    LocalPolicy().save_state(tmp_path / "ok.pt")
    assert state_file_problem(tmp_path / "ok.pt") is None
    payload = LocalPolicy().state_dict()
    payload["vocab"] = [token for token in payload["vocab"] if token != payload["vocab"][-1]] + ["<other>", "<tokens>"]
    torch.save(payload, tmp_path / "other.pt")
    assert state_file_problem(tmp_path / "other.pt") == (
        f"saved with a different job-language vocabulary ({len(jl.VOCAB) + 1} tokens; this code has {len(jl.VOCAB)}: 1 added, 2 removed)"
    )
    with pytest.raises(ValueError, match="other.pt: saved with a different job-language vocabulary"):
        LocalPolicy.from_state(tmp_path / "other.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    assert state_file_problem(tmp_path / "junk.pt").startswith("cannot be read")
    assert state_file_problem(tmp_path / "absent.pt").startswith("cannot be read")


def test_untrained_policy_writes_mostly_default_jobs_that_all_keep_to_the_task():
    policy = LocalPolicy()
    samples = policy.sample_batch([CTX] * 300, list(range(300)))
    verdicts = [probe_job_text(sample.render(seed=0, limits=job_limits(TASK)), TASK, [local_compile_problems]) for sample in samples]
    choices = [jl.decode_job(sample.job_tokens) for sample in samples]
    larger = sum(c.model == "Qwen/Qwen3-1.7B" for c in choices) / len(choices)
    explicit = sum(c.explicit for c in choices) / (7 * len(choices))
    assert [v.errors for v in verdicts if not v.passed] == []
    assert 0.25 < larger < 0.6, larger
    assert 0.1 < explicit < 0.35, explicit
    unfitted = Counter(jl.feedback_kind(p.field) for sample in samples for p in probe_job_text(sample.render(seed=0), TASK).errors)
    assert set(unfitted) == {"dataset_size"}, unfitted  # only the dataset is moved into the task's range when rendered


def test_a_weaker_default_prior_sets_more_settings_explicitly(tmp_path):
    from metarl.backends.local.agent import LocalOuter
    from schemas.run_config import RunConfig

    def explicit_share(policy: LocalPolicy) -> float:
        choices = [jl.decode_job(sample.job_tokens) for sample in policy.sample_batch([CTX] * 300, list(range(300)))]
        return sum(c.explicit for c in choices) / (7 * len(choices))

    data = load_toml_model(RunConfig, REPO / "examples" / "local.toml").model_dump(mode="json", exclude_none=True)
    data["artifacts"]["root"] = str(tmp_path)
    shares = {}
    for bias in (3.0, 1.0):
        data["backends"]["agent"]["prior_default_bias"] = bias
        config = RunConfig.model_validate(data)
        path = LocalOuter(config.backends.outer, config.backends.agent).initial_state(f"run-{bias}", config)
        policy = LocalPolicy.from_state(path)
        assert policy.config.default_bias == bias
        shares[bias] = explicit_share(policy)
    assert shares[3.0] < 0.35 < 0.5 < shares[1.0], shares


def test_a_floored_update_has_finite_gradients():
    policy = LocalPolicy()
    sample = policy.sample(CTX, seed=3, floor=0.1)
    loss = -policy.logprobs(sample.prompt_tokens, sample.job_tokens, floor=0.1).sum()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in policy.parameters() if p.grad is not None)


def outer_batch(policy: LocalPolicy, rewards: list[float], first_episode: int) -> list:
    """A batch of one group: episodes sampled by `policy` with the given rewards."""
    from metarl.interfaces import OuterBatchEpisode, PolicySample

    batch = []
    for index, reward in enumerate(rewards):
        sample = policy.sample(CTX, seed=first_episode + index)
        episode = OuterBatchEpisode(
            episode_id=first_episode + index,
            group_id=first_episode,
            policy_version=0,
            reward=reward,
            samples=[PolicySample(tokens=sample.tokens, logprobs=sample.logprobs, prompt_length=sample.prompt_length)],
        )
        batch.append(episode)
    return batch


@pytest.mark.parametrize("replay_batches", [0, 1])
def test_the_local_update_trains_again_on_the_kept_batches_of_the_steps_before(tmp_path, replay_batches):
    from metarl.backends.local.agent import LocalOuter
    from schemas.run_config import RunConfig

    data = load_toml_model(RunConfig, REPO / "examples" / "local.toml").model_dump(mode="json", exclude_none=True)
    data["artifacts"]["root"] = str(tmp_path)
    data["backends"]["outer"]["replay_batches"] = replay_batches
    config = RunConfig.model_validate(data)
    outer = LocalOuter(config.backends.outer, config.backends.agent)
    state = outer.initial_state("run", config)
    first = outer.update("run", 1, 1, outer_batch(LocalPolicy.from_state(state), [1.0, 0.0, 0.5, -0.5], 1), config, state)
    assert first.metrics["replayed_datums"] == 0 and first.metrics["datums"] == 4
    second_batch = outer_batch(LocalPolicy.from_state(first.state_uri), [0.2, 0.9, -0.3], 5)
    second = outer.update("run", 2, 2, second_batch, config, first.state_uri)
    assert second.metrics["replayed_datums"] == 4 * replay_batches
    assert second.metrics["datums"] == 3 + 4 * replay_batches
    kept = LocalPolicy.from_state(second.state_uri).replay
    assert len(kept) == replay_batches  # only the latest batch is kept for the next step
    if replay_batches:
        assert [record["model_input"][len(CTX) - 1 :] for record in kept[0]] == [episode.samples[0].tokens[len(CTX) - 1 : -1] for episode in second_batch]


def test_a_state_saved_before_replay_was_kept_loads_with_none(tmp_path):
    policy = LocalPolicy()
    payload = policy.state_dict()
    del payload["replay"]
    path = tmp_path / "old.pt"
    torch.save(payload, path)
    assert LocalPolicy.from_state(path).replay == []
