"""Episode transitions and outer batching rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metarl.domain.batching import GroupView, groups_allowed_ahead, groups_to_open, is_stale, oldest_fresh_version, plan_batch, staleness, tasks_to_open
from metarl.domain.transitions import after_agent, after_eval, after_probe, after_train
from metarl.store.records import Stage
from metarl.store.tick_counts import TickCounts


def test_probe_pass_goes_to_train():
    assert after_probe(True, 2, 3).stage == Stage.train


def test_probe_fail_returns_to_agent_with_next_attempt():
    move = after_probe(False, 1, 3)
    assert (move.stage, move.probe_attempt, move.ends_unvalidated) == (Stage.agent, 2, False)


def test_probe_fail_at_cap_ends_unvalidated():
    move = after_probe(False, 3, 3)
    assert (move.stage, move.ends_unvalidated) == (Stage.done, True)


def test_stage_order():
    assert after_agent(1).stage == Stage.probe
    assert after_train(1).stage == Stage.eval
    assert after_eval(1).stage == Stage.done


@given(st.integers(1, 20), st.integers(1, 20))
def test_retry_loop_is_bounded(cap, attempt):
    move = after_probe(False, min(attempt, cap), cap)
    assert move.probe_attempt <= cap


def test_staleness():
    assert staleness(3, 5) == 2
    assert not is_stale(3, 5, 2)
    assert is_stale(2, 5, 2)


def test_one_staleness_rule_for_the_sql_cutoff_and_the_plan():
    """The orchestrator drops groups with `policy_version < oldest_fresh_version(...)`; plan_batch uses is_stale: the same rule."""
    assert oldest_fresh_version(5, 2) == 3 and oldest_fresh_version(5, 0) == 5
    for current in range(6):
        for bound in range(4):
            for version in range(current + 1):
                stale = is_stale(version, current, bound)
                assert stale == (staleness(version, current) > bound) == (version < oldest_fresh_version(current, bound))
                assert (plan_batch([GroupView(1, version)], current, bound, 1).stale == (1,)) == stale


def test_plan_waits_for_enough_fresh_groups_and_drops_stale():
    groups = [GroupView(1, 0), GroupView(2, 3), GroupView(3, 4)]
    plan = plan_batch(groups, current_version=4, max_steps_off_policy=2, groups_per_batch=3)
    assert plan.batch == () and plan.stale == (1,)
    plan = plan_batch(groups, current_version=4, max_steps_off_policy=2, groups_per_batch=2)
    assert plan.batch == (2, 3)


def test_plan_takes_oldest_fresh_first():
    groups = [GroupView(5, 4), GroupView(4, 3), GroupView(6, 4)]
    assert plan_batch(groups, 4, 1, 2).batch == (4, 5)


def test_window_opens_whole_groups():
    assert groups_to_open(0, 8, 4) == 2
    assert groups_to_open(6, 8, 4) == 1
    assert groups_to_open(8, 8, 4) == 0
    assert groups_to_open(12, 8, 4) == 0


def test_batches_ahead_caps_the_groups_sampled_before_the_step_that_trains_on_them():
    assert groups_allowed_ahead(waiting_groups=5, outer_busy=3, groups_per_batch=2, batches_ahead=None) is None
    # synchronous: the next batch's groups open only once no step is in flight, and no more than one batch of them
    assert groups_allowed_ahead(0, 0, 2, 0) == 2
    assert groups_allowed_ahead(1, 0, 2, 0) == 1
    assert groups_allowed_ahead(2, 0, 2, 0) == 0
    assert groups_allowed_ahead(0, 1, 2, 0) == 0
    # one batch ahead: the batch being filled plus the next, an outer step in flight counting as one batch
    assert groups_allowed_ahead(0, 1, 2, 1) == 2
    assert groups_allowed_ahead(3, 0, 2, 1) == 1
    assert groups_allowed_ahead(6, 1, 2, 1) == 0
    with pytest.raises(ValueError, match="batches_ahead"):
        groups_allowed_ahead(0, 0, 2, -1)


def test_reconciler_runs_a_quarter_lease_apart_but_never_more_often_than_ticks() -> None:
    from metarl.runconfig import load_run
    from orchestrator.reconciler import reconcile_interval_s
    from tests.conftest import REPO

    base, _ = load_run(REPO / "examples" / "sim.toml")

    def config(lease_s: float, redispatch_after_s: float, tick_s: float):  # type: ignore[no-untyped-def]
        retries = base.retries.model_copy(update={"lease_s": lease_s, "redispatch_after_s": redispatch_after_s})
        return base.model_copy(update={"retries": retries, "window": base.window.model_copy(update={"tick_s": tick_s})})

    assert reconcile_interval_s(config(60, 120, 0.5)) == 15.0
    assert reconcile_interval_s(config(60, 8, 0.5)) == 2.0
    assert reconcile_interval_s(config(1, 1, 0.5)) == 0.5


def tick_counts(**overrides: float) -> TickCounts:
    values = dict(
        outer_steps=3, outer_busy=0, outer_done=3, dropped_counted=1, trainable_groups=10, waiting_groups=4, dropped_groups=2, active_episodes=6, spent_usd=0.5
    )
    values.update(overrides)
    return TickCounts(**values)  # type: ignore[arg-type]


def test_tick_counts_follow_drops_batches_and_new_groups():
    counts = tick_counts()
    assert counts.dropped_unrecorded == 1
    dropped = counts.after_dropping(2)
    assert (dropped.waiting_groups, dropped.dropped_groups, dropped.dropped_unrecorded) == (2, 4, 3)
    batched = dropped.after_batching(groups=2, dropped_recorded=dropped.dropped_unrecorded)
    assert (batched.outer_steps, batched.outer_busy, batched.waiting_groups, batched.dropped_unrecorded) == (4, 1, 0, 0)
    assert batched.outer_done == 3  # a new step is pending, not done
    opened = batched.after_opening(1, 4, trainable=True).after_opening(1, 4, trainable=False)
    assert (opened.trainable_groups, opened.waiting_groups, opened.active_episodes) == (11, 1, 14)
    assert counts == tick_counts()  # each step returns a copy


def test_a_retried_run_names_its_step_and_the_error_it_failed_with_in_bounded_text() -> None:
    from metarl.store.failed_runs import MAX_MESSAGE_CHARS, retry_message

    assert retry_message(3, "PermanentBackendError: bad key") == "resumed: outer step 3 retried after: PermanentBackendError: bad key"
    long = retry_message(3, "x" * 5000)
    assert len(long) == MAX_MESSAGE_CHARS and long.endswith("...") and long.startswith("resumed: outer step 3 retried after: x")


def test_tick_payloads_say_which_run_and_whether_the_gap_applies() -> None:
    from metarl.store.tick_wakeup import tick_payload, wake_of

    run = "0a1b2c3d-0000-4000-8000-000000000001"
    assert wake_of(tick_payload(run), run) == "gapped"
    assert wake_of(tick_payload(run, urgent=True), run) == "urgent"
    assert wake_of(tick_payload("ffffffff-0000-4000-8000-000000000002", urgent=True), run) is None
    assert wake_of(run + ":later", run) is None


def test_new_groups_resample_dropped_tasks_first_then_take_the_trainable_tasks_in_turn():
    assert tasks_to_open(4, ["b"], ["a", "b", "c"], opened_so_far=5) == ["b", "a", "b", "c"]
    assert tasks_to_open(3, [], ["a", "b"], opened_so_far=0) == ["a", "b", "a"]
    assert tasks_to_open(0, ["x"], ["a"], opened_so_far=2) == []
