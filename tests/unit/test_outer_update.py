"""Importance-sampling GRPO: staleness, Tinker-layout datums, the truncated IS loss, the local step."""

from __future__ import annotations

import math

import pytest
import torch

from metarl.domain.batching import is_stale
from metarl.interfaces import OuterBatchEpisode
from metarl.outer_update import (
    Datum,
    build_datum,
    collate,
    datum_from_record,
    datum_record,
    filter_stale,
    importance_sampling_loss,
    kept_batches,
    local_outer_step,
    to_tinker_datum,
)
from metarl.policy import job_language as jl
from metarl.policy.family_features import family_features
from metarl.policy.local_policy import LocalPolicy, grammar_masks

CONTEXT = jl.context_tokens(family_features("Add two numbers.", examples=[("add 1+2=", "3")]))

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- staleness -----------------------------------------------------------------------------------


def episodes(group_id: int, version: int, n: int = 2) -> list[OuterBatchEpisode]:
    return [OuterBatchEpisode(episode_id=group_id * 10 + i, group_id=group_id, policy_version=version, reward=0.0) for i in range(n)]


def test_filter_stale_keeps_groups_within_the_bound():
    groups = [episodes(1, 5), episodes(2, 3), episodes(3, 2), episodes(4, 0)]
    kept, dropped = filter_stale(groups, current_version=5, max_steps_off_policy=2)
    assert [g[0].group_id for g in kept] == [1, 2]  # 5 - 3 == 2 is still within the bound
    assert [g[0].group_id for g in dropped] == [3, 4]
    kept, dropped = filter_stale(groups, current_version=5, max_steps_off_policy=0, mode="resample")
    assert [g[0].group_id for g in kept] == [1] and len(dropped) == 3


def test_filter_stale_on_a_mapping_with_mixed_versions_and_dicts():
    groups = {1: episodes(1, 4) + episodes(1, 1, n=1), 2: [{"policy_version": 4}, {"policy_version": 4}]}
    kept, dropped = filter_stale(groups, current_version=4, max_steps_off_policy=2)
    assert list(kept) == [2] and list(dropped) == [1]  # a group is as old as its oldest episode


def test_filter_stale_follows_the_domain_rule():
    for current in range(5):
        for bound in range(3):
            groups = [episodes(version + 1, version) for version in range(current + 1)]
            _, dropped = filter_stale(groups, current_version=current, max_steps_off_policy=bound)
            assert [g[0].policy_version for g in dropped] == [v for v in range(current + 1) if is_stale(v, current, bound)]


def test_filter_stale_refuses_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        filter_stale([episodes(1, 0)], 0, 1, mode="keep")
    with pytest.raises(ValueError, match="newer"):
        filter_stale([episodes(1, 3)], 2, 1)
    with pytest.raises(ValueError, match="at least one"):
        filter_stale([[]], 2, 1)


# -- datums --------------------------------------------------------------------------------------


def test_build_datum_aligns_targets_logprobs_and_advantages():
    datum = build_datum([1, 2, 3], [10, 11], [-0.5, -0.25], advantage=0.75)
    assert datum.model_input == [1, 2, 3, 10]
    assert datum.target_tokens == [2, 3, 10, 11]
    assert datum.logprobs == [0.0, 0.0, -0.5, -0.25]
    assert datum.advantages == [0.0, 0.0, 0.75, 0.75]
    assert datum.mask == [0.0, 0.0, 1.0, 1.0]
    single = build_datum([1], [9], [-1.0], advantage=-1.0)
    assert single.model_input == [1] and single.target_tokens == [9] and single.advantages == [-1.0]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([], [1], [-1.0], 1.0), "prompt"),
        (([1], [], [], 1.0), "empty"),
        (([1], [2, 3], [-1.0], 1.0), "behaviour logprobs"),
        (([1], [2], [0.5], 1.0), "<= 0"),
        (([1], [2], [-0.5], math.inf), "finite"),
    ],
)
def test_build_datum_refuses_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        build_datum(*args)
    with pytest.raises(ValueError, match="same length"):
        Datum(model_input=[1], target_tokens=[2, 3], logprobs=[0.0], advantages=[0.0], mask=[0.0])


def test_to_tinker_datum_builds_real_sdk_types():
    types = pytest.importorskip("tinker.types")
    prompt, completion = [5, 6, 7, 8], [20, 21, 22]
    datum = build_datum(prompt, completion, [-0.1, -0.2, -0.3], advantage=0.4)
    real = to_tinker_datum(datum)
    assert isinstance(real, types.Datum)
    assert isinstance(real.model_input, types.ModelInput)
    assert real.model_input.to_ints() == (prompt + completion)[:-1]
    assert real.model_input.length == 6
    assert set(real.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
    for key, dtype in (("target_tokens", "int64"), ("logprobs", "float32"), ("advantages", "float32")):
        tensor = real.loss_fn_inputs[key]
        assert isinstance(tensor, types.TensorData)
        assert tensor.dtype == dtype and tensor.shape == [6]
    assert real.loss_fn_inputs["target_tokens"].data == (prompt + completion)[1:]
    assert real.loss_fn_inputs["logprobs"].data == pytest.approx([0, 0, 0, -0.1, -0.2, -0.3])
    assert real.loss_fn_inputs["advantages"].data == pytest.approx([0, 0, 0, 0.4, 0.4, 0.4])
    # the first completion target sits right after the last prompt input, as Tinker expects
    first = len(prompt) - 1
    assert real.model_input.to_ints()[first] == prompt[-1] and real.loss_fn_inputs["target_tokens"].data[first] == completion[0]
    # the SDK's own conversion from torch tensors agrees with ours
    sdk = types.Datum(
        model_input=types.ModelInput.from_ints(datum.model_input),
        loss_fn_inputs={"target_tokens": torch.tensor(datum.target_tokens), "advantages": torch.tensor(datum.advantages)},
    )
    assert sdk.loss_fn_inputs["target_tokens"].data == real.loss_fn_inputs["target_tokens"].data
    assert sdk.loss_fn_inputs["advantages"].data == pytest.approx(real.loss_fn_inputs["advantages"].data)


def test_collate_right_pads():
    batch = collate([build_datum([1, 2], [3], [-0.1], 1.0), build_datum([1, 2, 4], [5, 6], [-0.2, -0.3], -1.0)])
    assert batch["inputs"].shape == (2, 4) and batch["lengths"].tolist() == [2, 4]
    assert batch["mask"].tolist() == [[0, 1, 0, 0], [0, 0, 1, 1]]


# -- loss ----------------------------------------------------------------------------------------


def test_on_policy_loss_is_minus_the_advantage_sum_with_unit_ratios():
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    adv = torch.tensor([[0.0, 2.0, 2.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    loss, stats = importance_sampling_loss(lp, lp.detach().clone(), adv, mask, ratio_cap=2.0)
    assert loss.item() == pytest.approx(-4.0)
    assert stats["ratio_mean"] == stats["ratio_min"] == stats["ratio_max"] == pytest.approx(1.0)
    assert stats["frac_truncated"] == 0.0 and stats["tokens"] == 2.0
    loss.backward()
    # d/dlp of -(exp(lp - blp) * adv) at lp == blp is -adv; nothing flows to masked positions
    assert lp.grad[0].tolist() == pytest.approx([0.0, -2.0, -2.0])


def test_weights_are_clipped_at_the_cap_not_zeroed():
    behaviour = torch.log(torch.tensor([0.5, 0.5, 0.5, 0.5]))
    new = torch.log(torch.tensor([0.25, 0.5, 0.9, 1.0])).requires_grad_(True)  # ratios 0.5, 1, 1.8, 2
    adv = torch.ones(4)
    mask = torch.ones(4)
    loss, stats = importance_sampling_loss(new, behaviour, adv, mask, ratio_cap=1.5)
    assert loss.item() == pytest.approx(-(0.5 + 1.0 + 1.5 + 1.5))
    assert stats["ratio_max"] == pytest.approx(2.0) and stats["ratio_min"] == pytest.approx(0.5)
    assert stats["ratio_mean"] == pytest.approx((0.5 + 1 + 1.8 + 2) / 4)
    assert stats["frac_truncated"] == pytest.approx(0.5)
    loss.backward()
    assert new.grad.tolist() == pytest.approx([-0.5, -1.0, -1.5, -1.5])  # clipped tokens keep a gradient, its weight the cap
    # without a cap it is exactly Tinker's importance_sampling loss
    untruncated, stats = importance_sampling_loss(new.detach(), behaviour, adv, mask, ratio_cap=None)
    assert float(untruncated) == pytest.approx(-(0.5 + 1.0 + 1.8 + 2.0))
    assert stats["frac_truncated"] == 0.0
    with pytest.raises(ValueError, match="ratio_cap"):
        importance_sampling_loss(new, behaviour, adv, mask, ratio_cap=0.5)


def test_a_token_whose_probability_grew_past_the_cap_with_a_negative_advantage_is_pushed_down():
    # ratios 3 and 3 (past the cap 2): the old min(r, cap) loss gave both zero gradient, so the bad token stayed up
    behaviour = torch.log(torch.tensor([0.1, 0.1]))
    new = torch.log(torch.tensor([0.3, 0.3])).requires_grad_(True)
    adv = torch.tensor([-1.0, 1.0])
    loss, stats = importance_sampling_loss(new, behaviour, adv, torch.ones(2), ratio_cap=2.0)
    loss.backward()
    # descent moves lp by -grad: the negative-advantage token goes down, with the clipped weight 2 (not 3, not 0)
    assert new.grad.tolist() == pytest.approx([2.0, -2.0])
    assert float(loss.detach()) == pytest.approx(-(2.0 * -1.0 + 2.0 * 1.0)) and stats["frac_truncated"] == 1.0
    with torch.no_grad():
        stepped = new - 0.1 * new.grad
    assert stepped[0] < new[0] and stepped[1] > new[1]


def test_masked_positions_never_make_nan():
    new = torch.tensor([-math.inf, -1.0])
    loss, stats = importance_sampling_loss(new, torch.tensor([0.0, -1.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0]), 2.0)
    assert float(loss) == pytest.approx(-1.0) and stats["tokens"] == 1.0
    loss, stats = importance_sampling_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(3), 2.0)
    assert float(loss) == 0.0 and stats["tokens"] == 0.0


# -- the local step ------------------------------------------------------------------------------


def sampled_datums(policy: LocalPolicy, advantages: list[float]) -> list[Datum]:
    samples = policy.sample_batch([CONTEXT] * len(advantages), list(range(len(advantages))))
    return [build_datum(s.prompt_tokens, s.job_tokens, s.logprobs, a) for s, a in zip(samples, advantages)]


def test_local_step_raises_the_logprob_of_positive_advantage_samples():
    policy = LocalPolicy()
    datums = sampled_datums(policy, [1.0, -1.0, 0.5, -0.5])
    p = len(CONTEXT)

    def job_logprob(d: Datum) -> float:
        return policy.logprobs(d.model_input[:p], d.target_tokens[p - 1 :]).sum().item()

    before = [job_logprob(d) for d in datums]
    metrics = local_outer_step(policy, None, datums, ratio_cap=2.0, lr=1e-2)
    assert metrics["skipped"] == 0.0 and metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["grad_norm"] > 0 and metrics["tokens"] == sum(sum(d.mask) for d in datums)
    after = [job_logprob(d) for d in datums]
    assert after[0] > before[0] and after[1] < before[1]
    # a second step on the same (now off-policy) datums sees ratios away from 1
    metrics = local_outer_step(policy, policy.optimizer, datums, ratio_cap=1.05, lr=1e-2)
    assert metrics["ratio_max"] > 1.0 and metrics["ratio_min"] < 1.0


def test_target_scores_entropy_is_the_masked_softmax_entropy_at_job_targets():
    policy = LocalPolicy()
    datum = sampled_datums(policy, [1.0])[0]
    inputs, targets = torch.tensor([datum.model_input]), torch.tensor([datum.target_tokens])
    scores = policy.target_scores(inputs, targets, [datum.length])
    p = len(CONTEXT)
    assert torch.all(scores.entropy[0, : p - 1] == 0)  # prompt targets
    masks = grammar_masks(datum.model_input + [datum.target_tokens[-1]], datum.length)
    with torch.no_grad():
        logits = policy.net.head(policy.net.gru(policy.net.embed(inputs))[0])[0]
    for position in range(p - 1, datum.length):
        allowed = torch.softmax(logits[position][masks[position]], dim=-1)
        expected = float(-(allowed * allowed.log()).sum())
        assert float(scores.entropy[0, position].detach()) == pytest.approx(expected, abs=1e-5)
    assert torch.equal(scores.logprobs, policy.target_logprobs(inputs, targets, [datum.length]))


def test_an_entropy_bonus_keeps_more_entropy_after_the_same_steps():
    entropies = {}
    for coef in (0.0, 0.5):
        policy = LocalPolicy()
        datums = sampled_datums(policy, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
        for _ in range(5):
            metrics = local_outer_step(policy, None, datums, ratio_cap=2.0, lr=3e-2, entropy_coef=coef)
        entropies[coef] = metrics["entropy_mean"]
    assert entropies[0.5] > entropies[0.0] + 0.05, entropies
    with pytest.raises(ValueError, match="entropy_coef"):
        local_outer_step(LocalPolicy(), None, datums, ratio_cap=2.0, lr=1e-2, entropy_coef=-0.1)


def test_local_step_skips_without_signal():
    policy = LocalPolicy()
    state = {k: v.clone() for k, v in policy.net.state_dict().items()}
    assert local_outer_step(policy, None, [], ratio_cap=2.0, lr=1e-2)["skipped"] == 1.0
    metrics = local_outer_step(policy, None, sampled_datums(policy, [0.0, 0.0]), ratio_cap=2.0, lr=1e-2)
    assert metrics["skipped"] == 1.0
    assert all(torch.equal(v, policy.net.state_dict()[k]) for k, v in state.items())


def test_a_datum_round_trips_through_its_record_in_a_weights_only_state(tmp_path):
    policy = LocalPolicy()
    datums = sampled_datums(policy, [1.0, -0.5])
    policy.replay = [[datum_record(d) for d in datums]]
    path = tmp_path / "policy.pt"
    policy.save_state(path)
    restored = LocalPolicy.from_state(path)
    assert [datum_from_record(record) for record in restored.replay[0]] == datums
    record = datum_record(datums[0])
    with pytest.raises(ValueError, match="lacks mask"):
        datum_from_record({key: value for key, value in record.items() if key != "mask"})
    with pytest.raises(ValueError, match="same length"):
        datum_from_record({**record, "mask": record["mask"][:-1]})


def test_kept_batches_put_the_latest_first_and_keep_at_most_the_given_number():
    a, b, c = [{"x": [1]}], [{"x": [2]}], [{"x": [3]}]
    assert kept_batches(c, [b, a], 2) == [c, b]
    assert kept_batches(c, [], 3) == [c]
    assert kept_batches(c, [b, a], 0) == []
    with pytest.raises(ValueError, match="keep"):
        kept_batches(c, [], -1)
