"""The `tinker` outer update: datums (checked as real `tinker.types.Datum`), the call order on the training
client, the clipped-weight cispo loss, checkpoint expiry, recovery of a failed training client from the
last saved state, and exactly one Adam step per published version whatever fails.

Offline: the ServiceClient and TrainingClient are fakes answering with real `tinker.types` objects.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import tinker
from tinker import types

from metarl.backends.tinker import outer as tinker_outer
from metarl.backends.tinker.agent import NOT_SAMPLED
from metarl.backends.tinker.client import TinkerGateway, TinkerPolicyRef
from metarl.backends.tinker.outer import TinkerOuter, batch_datums, ratio_metrics, sample_datum
from metarl.errors import PermanentBackendError, TransientBackendError
from metarl.interfaces import OuterBatchEpisode, PolicySample
from metarl.outer_update import build_datum, to_tinker_datum
from schemas.base import load_toml_model
from schemas.run_config import RunConfig
from tests.unit.test_tinker_fakes import FakeService, http_error, server_failure, user_failure

REPO = Path(__file__).resolve().parents[2]


def run_config(**outer_backend) -> RunConfig:
    config = load_toml_model(RunConfig, REPO / "examples" / "tinker.toml")
    if outer_backend:
        data = config.model_dump(mode="json", exclude_none=True)
        data["backends"]["outer"].update(outer_backend)
        config = RunConfig.model_validate(data)
    return config


def single_turn(prompt: list[int], completion: list[int], lp: float = -0.5) -> PolicySample:
    return PolicySample(tokens=prompt + completion, logprobs=[lp] * len(completion), prompt_length=len(prompt))


def multi_turn() -> PolicySample:
    # prompt 10 11 12 | reply 20 21 | tool result 30 31 (not sampled) | reply 22
    return PolicySample(tokens=[10, 11, 12, 20, 21, 30, 31, 22], logprobs=[-0.1, -0.2, NOT_SAMPLED, NOT_SAMPLED, -0.3], prompt_length=3)


def batch() -> list[OuterBatchEpisode]:
    return [
        OuterBatchEpisode(episode_id=1, group_id=1, policy_version=0, reward=1.0, samples=[single_turn([1, 2, 3], [4, 5])]),
        OuterBatchEpisode(episode_id=2, group_id=1, policy_version=0, reward=0.0, samples=[multi_turn()]),
        OuterBatchEpisode(episode_id=3, group_id=2, policy_version=0, reward=0.5, samples=[single_turn([1, 2], [9])]),
        OuterBatchEpisode(episode_id=4, group_id=2, policy_version=0, reward=0.5, samples=[single_turn([1, 2], [8])]),
    ]


def plain(datum: types.Datum) -> tuple:
    return datum.model_input.to_ints(), {key: (value.dtype, value.tolist()) for key, value in sorted(datum.loss_fn_inputs.items())}


def setup(**outer_backend) -> tuple[FakeService, TinkerGateway, TinkerOuter, RunConfig]:
    config = run_config(**outer_backend)
    service = FakeService()
    gateway = TinkerGateway(service=service)
    outer = TinkerOuter(config.backends.outer, config.backends.agent, connect_to=lambda: gateway)
    return service, gateway, outer, config


# --------------------------------------------------------------------------------------------
# datums


def test_single_turn_datum_is_the_local_backends_datum() -> None:
    sample = single_turn([1, 2, 3], [4, 5], lp=-0.7)
    assert sample_datum(sample, 0.5) == build_datum([1, 2, 3], [4, 5], [-0.7, -0.7], 0.5)


def test_multi_turn_datum_trains_only_sampled_tokens() -> None:
    datum = sample_datum(multi_turn(), 2.0)
    assert datum is not None
    assert datum.model_input == [10, 11, 12, 20, 21, 30, 31]
    assert datum.target_tokens == [11, 12, 20, 21, 30, 31, 22]
    assert datum.logprobs == [0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3]
    assert datum.advantages == [0.0, 0.0, 2.0, 2.0, 0.0, 0.0, 2.0]
    assert datum.mask == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    tinker_datum = to_tinker_datum(datum)
    assert isinstance(tinker_datum, types.Datum)
    tokens, inputs = plain(tinker_datum)
    assert tokens == datum.model_input and set(inputs) == {"target_tokens", "logprobs", "advantages"}
    assert inputs["target_tokens"] == ("int64", datum.target_tokens)
    assert inputs["advantages"] == ("float32", datum.advantages)
    assert inputs["logprobs"][0] == "float32" and inputs["logprobs"][1] == pytest.approx(datum.logprobs)


def test_datums_without_signal_are_left_out_and_bad_samples_are_refused() -> None:
    assert sample_datum(multi_turn(), 0.0) is None
    assert sample_datum(PolicySample(tokens=[1, 2, 3], logprobs=[NOT_SAMPLED, NOT_SAMPLED], prompt_length=1), 1.0) is None
    with pytest.raises(ValueError, match="3 logprobs for 2 tokens"):
        sample_datum(PolicySample(tokens=[1, 2, 3], logprobs=[-0.1, -0.1, -0.1], prompt_length=1), 1.0)
    with pytest.raises(ValueError, match="finite"):
        sample_datum(PolicySample(tokens=[1, 2], logprobs=[float("nan")], prompt_length=1), 1.0)
    with pytest.raises(ValueError, match="<= 0"):
        sample_datum(PolicySample(tokens=[1, 2], logprobs=[0.3], prompt_length=1), 1.0)


def test_batch_datums_are_group_relative() -> None:
    datums = batch_datums(batch(), normalize_std=False)
    assert len(datums) == 2  # group 2 has equal rewards: no signal
    assert datums[0] == build_datum([1, 2, 3], [4, 5], [-0.5, -0.5], 0.5)
    assert datums[1] == sample_datum(multi_turn(), -0.5)
    normalized = batch_datums(batch(), normalize_std=True)
    assert normalized[0].advantages[-1] == pytest.approx(1.0, rel=1e-4)


def test_ratio_metrics_from_returned_logprobs() -> None:
    datums = [build_datum([1, 2], [3], [-1.0], 1.0)]
    stats = ratio_metrics(datums, [[-5.0, -1.0 + math.log(3.0)]], ratio_cap=2.0)
    assert stats["ratio_mean"] == pytest.approx(3.0) and stats["frac_truncated"] == 1.0 and stats["tokens"] == 1.0


# --------------------------------------------------------------------------------------------
# the backend against the fake service


def test_initial_state_creates_the_lora_and_saves_version_zero() -> None:
    service, gateway, outer, config = setup()
    ref = TinkerPolicyRef.parse(outer.initial_state("run-1", config))
    assert service.log == [
        ("create_lora_training_client", "Qwen/Qwen3-30B-A3B", 8, 0),
        ("save_state", "run0", "metarl-run-1-v00000", 7 * 86_400),
        ("save_weights_for_sampler", "run0", "metarl-run-1-v00000", 7 * 86_400),
    ]
    assert ref == TinkerPolicyRef(
        base_model="Qwen/Qwen3-30B-A3B",
        version=0,
        state_path="tinker://run0/weights/metarl-run-1-v00000",
        sampler_path="tinker://run0/sampler_weights/metarl-run-1-v00000",
    )


def test_update_calls_forward_backward_optim_step_and_saves_in_order() -> None:
    service, gateway, outer, config = setup()
    base = outer.initial_state("run-1", config)
    service.log.clear()
    result = outer.update("run-1", 1, 1, batch(), config, base)
    assert [(entry[0], entry[1]) for entry in service.log] == [
        ("forward_backward", "run0"),
        ("optim_step", "run0"),
        ("save_state", "run0"),
        ("save_weights_for_sampler", "run0"),
    ]
    _, _, loss_fn, data, loss_fn_config = service.log[0]
    assert (loss_fn, loss_fn_config) == ("cispo", {"clip_low_threshold": 0.0, "clip_high_threshold": config.outer.ratio_cap})
    assert [plain(d) for d in data] == [plain(to_tinker_datum(d)) for d in batch_datums(batch(), normalize_std=False)]
    adam = service.log[1][2]
    assert isinstance(adam, types.AdamParams)
    assert (adam.learning_rate, adam.beta1, adam.beta2, adam.grad_clip_norm, adam.weight_decay) == (config.outer.learning_rate, 0.9, 0.95, 1.0, 0.0)
    assert service.log[2][2] == service.log[3][2] == "metarl-run-1-v00001"
    ref = TinkerPolicyRef.parse(result.state_uri)
    assert (ref.version, ref.state_path, ref.sampler_path) == (
        1,
        "tinker://run0/weights/metarl-run-1-v00001",
        "tinker://run0/sampler_weights/metarl-run-1-v00001",
    )
    assert service.saved[ref.sampler_path] == 1  # the sampler weights hold the step
    assert result.metrics["skipped"] == 0.0 and result.metrics["datums"] == 2.0 and result.metrics["recoveries"] == 0.0
    assert result.metrics["ratio_mean"] == pytest.approx(math.exp(0.1), rel=1e-4) and result.metrics["frac_truncated"] == 0.0
    assert "tinker_loss:sum" in result.metrics and result.metrics["tinker_optim_optim/lr"] == config.outer.learning_rate
    tokens = sum(len(d.model_input) for d in batch_datums(batch(), normalize_std=False))
    assert [(c.source, c.unit, c.quantity, c.key) for c in result.costs] == [("tinker", "token", tokens, "tinker:outer:run-1:1:train")]
    assert result.costs[0].unit_price_usd == pytest.approx(1.5e-6)


def test_the_held_client_is_reused_and_a_restarted_worker_resumes_from_the_saved_state() -> None:
    service, gateway, outer, config = setup()
    v1 = outer.update("run-1", 1, 1, batch(), config, outer.initial_state("run-1", config))
    v2 = outer.update("run-1", 2, 2, batch(), config, v1.state_uri)
    assert not any(entry[0] == "create_training_client_from_state_with_optimizer" for entry in service.log)
    restarted = TinkerOuter(config.backends.outer, config.backends.agent, connect_to=lambda: TinkerGateway(service=service))
    v3 = restarted.update("run-1", 3, 3, batch(), config, v2.state_uri)
    assert ("create_training_client_from_state_with_optimizer", TinkerPolicyRef.parse(v2.state_uri).state_path) in service.log
    assert service.saved[TinkerPolicyRef.parse(v3.state_uri).state_path] == 3


@pytest.mark.parametrize("failing", ["forward_backward", "optim_step", "save_state", "save_weights_for_sampler"])
def test_a_failed_training_client_is_recreated_from_the_last_saved_state(failing: str) -> None:
    service, gateway, outer, config = setup()
    v1 = outer.update("run-1", 1, 1, batch(), config, outer.initial_state("run-1", config))
    base = TinkerPolicyRef.parse(v1.state_uri)
    service.fail_next = {failing: [server_failure(failing)]}
    service.log.clear()
    v2 = outer.update("run-1", 2, 2, batch(), config, v1.state_uri)
    failed_at = next(i for i, entry in enumerate(service.log) if entry[-1] == "failed")
    assert service.log[failed_at][:2] == (failing, "run0")
    after = service.log[failed_at + 1 :]
    # the request submitted together with the failed one (before its failure was known) is refused; nothing later reaches run0
    on_failed = [entry for entry in after if entry[0] != "create_training_client_from_state_with_optimizer" and entry[1] == "run0"]
    assert len(on_failed) <= 1 and all(entry[-1] == "refused" for entry in on_failed), "the poisoned client got another request"
    assert ("create_training_client_from_state_with_optimizer", base.state_path) in after
    assert [entry[0] for entry in after if entry[0] != "create_training_client_from_state_with_optimizer" and entry[1] != "run0"] == [
        "forward_backward",
        "optim_step",
        "save_state",
        "save_weights_for_sampler",
    ]
    ref = TinkerPolicyRef.parse(v2.state_uri)
    assert ref.state_path.startswith("tinker://run1/") and ref.sampler_path.startswith("tinker://run1/")
    assert service.saved[ref.state_path] == service.saved[ref.sampler_path] == 2, "a partial step of the failed client leaked into the new version"
    assert v2.metrics["recoveries"] == 1.0 and v2.costs[0].quantity == 2 * v1.costs[0].quantity


def test_recovery_is_bounded_and_permanent_errors_are_not_retried() -> None:
    service, gateway, outer, config = setup(max_recoveries=1)
    base = outer.initial_state("run-1", config)
    service.fail_next = {"forward_backward": [server_failure("a"), server_failure("b")]}
    with pytest.raises(TransientBackendError, match="forward_backward failed"):
        outer.update("run-1", 1, 1, batch(), config, base)
    assert "run-1" not in gateway.training_clients
    service.fail_next = {"forward_backward": [user_failure("c")]}
    service.log.clear()
    with pytest.raises(PermanentBackendError, match="rejected"):
        outer.update("run-1", 1, 1, batch(), config, base)
    assert [entry[0] for entry in service.log].count("forward_backward") == 1
    assert outer.update("run-1", 1, 1, batch(), config, base).metrics["skipped"] == 0.0  # the next try starts clean


def test_a_batch_without_signal_takes_no_step_and_republishes_the_weights() -> None:
    service, gateway, outer, config = setup()
    base = outer.initial_state("run-1", config)
    service.log.clear()
    flat = [OuterBatchEpisode(episode_id=i, group_id=1, policy_version=0, reward=0.3, samples=[single_turn([1], [2])]) for i in (1, 2)]
    result = outer.update("run-1", 1, 1, flat, config, base)
    assert service.log == [] and result.costs == [] and result.metrics["skipped"] == 1.0
    assert TinkerPolicyRef.parse(result.state_uri) == TinkerPolicyRef.parse(base).at_version(1)


def test_a_base_state_of_another_version_or_model_is_refused() -> None:
    service, gateway, outer, config = setup()
    base = outer.initial_state("run-1", config)
    with pytest.raises(PermanentBackendError, match="updates version 4"):
        outer.update("run-1", 5, 5, batch(), config, base)
    other = TinkerPolicyRef.parse(base).model_copy(update={"base_model": "other/model"}).encode()
    with pytest.raises(PermanentBackendError, match="LoRA of other/model"):
        outer.update("run-1", 1, 1, batch(), config, other)
    with pytest.raises(PermanentBackendError, match="not a Tinker policy reference"):
        outer.update("run-1", 1, 1, batch(), config, "/artifacts/policy/run-1/v00000.pt")


@pytest.mark.parametrize(("shift", "clipped"), [(0.1, 0.0), (1.0, 1.0)])
def test_cispo_clips_the_weight_at_the_cap_and_never_zeroes_it(shift: float, clipped: float) -> None:
    # ratio e^shift at every trained target: below the cap 2, or past it (e > 2)
    service, gateway, outer, config = setup()
    service.logprob_shift = shift
    base = outer.initial_state("run-1", config)
    service.log.clear()
    result = outer.update("run-1", 1, 1, batch(), config, base)
    assert [entry[0] for entry in service.log] == ["forward_backward", "optim_step", "save_state", "save_weights_for_sampler"]
    datums = batch_datums(batch(), normalize_std=False)
    weight = min(math.exp(shift), config.outer.ratio_cap)
    for datum, grad in zip(datums, service.training_clients[0].grads):
        assert grad.tolist() == pytest.approx([-weight * a for a in datum.advantages], rel=1e-5)
    # the negative-advantage datum (episode 2) is pushed down even past the cap, with the capped weight
    pushed = [g for g, a in zip(service.training_clients[0].grads[1].tolist(), datums[1].advantages) if a < 0]
    assert pushed and all(g == pytest.approx(weight * 0.5, rel=1e-5) and g > 0 for g in pushed)
    assert result.metrics["frac_truncated"] == clipped
    assert result.costs[0].quantity == sum(d.length for d in datums)  # one pass: no extra forward pass


def test_every_version_expires_after_the_ttl_and_the_last_one_after_its_own() -> None:
    service, gateway, outer, config = setup(checkpoint_ttl_s=3600, final_checkpoint_ttl_s=30 * 86_400)
    config = config.model_copy(update={"run": config.run.model_copy(update={"max_outer_steps": 2})})
    state = outer.initial_state("run-1", config)
    for version in (1, 2):
        state = outer.update("run-1", version, version, batch(), config, state).state_uri
    saves = [(entry[0], entry[2][-6:], entry[3]) for entry in service.log if entry[0].startswith("save")]
    assert saves == [
        ("save_state", "v00000", 3600),
        ("save_weights_for_sampler", "v00000", 3600),
        ("save_state", "v00001", 3600),
        ("save_weights_for_sampler", "v00001", 3600),
        ("save_state", "v00002", 30 * 86_400),
        ("save_weights_for_sampler", "v00002", 30 * 86_400),
    ]
    assert tinker_outer.checkpoint_ttl(config.backends.outer.model_copy(update={"final_checkpoint_ttl_s": None}), 2, 2) is None


# --------------------------------------------------------------------------------------------
# exactly one Adam step per published version


class TimeLimit(Exception):
    """Stands for Celery's SoftTimeLimitExceeded raised inside the update."""


FAILURES = {
    "transient": lambda what: server_failure(what),  # mapped: recovered inside the update
    "conflict 409": lambda what: http_error(tinker.ConflictError, 409, f"{what}: lock timeout"),
    "blocked client": lambda what: RuntimeError("A previous request failed; this TrainingClient is poisoned and cannot accept further requests."),
    "time limit": lambda what: TimeLimit(f"time limit during {what}"),
}


def steps_on_top(service: FakeService, refs: list[TinkerPolicyRef]) -> list[tuple[str | None, int]]:
    """For each published version after the first: (the state it started from, Adam steps since), from the fake's records."""
    return [service.origin[ref.state_path] for ref in refs[1:]]


def published_chain(service: FakeService, refs: list[TinkerPolicyRef]) -> None:
    """Each published version is exactly one Adam step on the previous one, and its sampler weights hold the same steps."""
    assert steps_on_top(service, refs) == [(earlier.state_path, 1) for earlier in refs[:-1]]
    assert [service.saved[ref.state_path] for ref in refs] == [service.saved[ref.sampler_path] for ref in refs] == list(range(len(refs)))


@pytest.mark.parametrize("retry_in", ["same process", "new process"])
@pytest.mark.parametrize("failure", sorted(FAILURES))
@pytest.mark.parametrize("after", ["forward_backward", "optim_step", "save_state", "save_weights_for_sampler"])
def test_a_failure_after_any_request_never_puts_two_steps_in_a_version(after: str, failure: str, retry_in: str) -> None:
    service, gateway, outer, config = setup()
    refs = [TinkerPolicyRef.parse(outer.initial_state("run-1", config))]
    refs.append(TinkerPolicyRef.parse(outer.update("run-1", 1, 1, batch(), config, refs[0].encode()).state_uri))
    service.fail_after = {after: [FAILURES[failure](after)]}  # the request took effect; its answer is lost
    if failure in ("transient", "conflict 409"):
        result = outer.update("run-1", 2, 2, batch(), config, refs[1].encode())  # recovered from version 1's saved state
        assert result.metrics["recoveries"] == 1.0
    else:
        with pytest.raises((RuntimeError, TimeLimit)):
            outer.update("run-1", 2, 2, batch(), config, refs[1].encode())
        retrying = (
            outer
            if retry_in == "same process"
            else TinkerOuter(config.backends.outer, config.backends.agent, connect_to=lambda: TinkerGateway(service=service))
        )
        result = retrying.update("run-1", 2, 2, batch(), config, refs[1].encode())  # the worker's retry of step 2
    refs.append(TinkerPolicyRef.parse(result.state_uri))
    refs.append(TinkerPolicyRef.parse(outer.update("run-1", 3, 3, batch(), config, refs[2].encode()).state_uri))
    published_chain(service, refs)


@pytest.mark.parametrize("retry_in", ["same process", "new process"])
def test_an_error_in_our_own_code_after_the_step_drops_the_stepped_client(retry_in: str, monkeypatch: pytest.MonkeyPatch) -> None:
    service, gateway, outer, config = setup()
    refs = [TinkerPolicyRef.parse(outer.initial_state("run-1", config))]
    real = tinker_outer.ratio_metrics
    calls = []

    def broken_once(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("Tinker returned logprobs of another length than the datums")
        return real(*args, **kwargs)

    monkeypatch.setattr(tinker_outer, "ratio_metrics", broken_once)
    with pytest.raises(ValueError, match="another length"):
        outer.update("run-1", 1, 1, batch(), config, refs[0].encode())
    assert "run-1" not in gateway.training_clients
    retrying = (
        outer if retry_in == "same process" else TinkerOuter(config.backends.outer, config.backends.agent, connect_to=lambda: TinkerGateway(service=service))
    )
    refs.append(TinkerPolicyRef.parse(retrying.update("run-1", 1, 1, batch(), config, refs[0].encode()).state_uri))
    refs.append(TinkerPolicyRef.parse(retrying.update("run-1", 2, 2, batch(), config, refs[1].encode()).state_uri))
    published_chain(service, refs)
