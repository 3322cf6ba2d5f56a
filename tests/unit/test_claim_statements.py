"""The one claim implementation (`metarl.store.claims`): what is claimed, the statements built for it, their parameters."""

from __future__ import annotations

import datetime as dt

import pytest

from metarl.store.claims import (
    CLAIM_STAGE_SQL,
    OUTER_STEPS,
    STAGE_CLAIMS,
    TAKE_OUTER_STEP_SQL,
    Claimable,
    claim_ctes,
    claim_params,
    refusal,
    renew_sql,
    stage_claim_of,
    stage_key,
)
from metarl.store.episodes import STAGE_ROW_AND_CLAIM_SQL
from metarl.store.records import EpisodeGroup, Stage, StageClaim


def test_a_claimable_is_checked_against_its_table() -> None:
    with pytest.raises(ValueError, match="stage_claims has no column attempt"):
        Claimable(StageClaim.__table__, key=("episode_id", "attempt"))
    with pytest.raises(ValueError, match="episode_groups has no column token"):
        Claimable(EpisodeGroup.__table__, key=("id",))
    with pytest.raises(ValueError, match="both first_row and unique"):
        Claimable(StageClaim.__table__, key=("id",), first_row={"run_id": "run_id"})
    with pytest.raises(ValueError, match="has no column runid"):
        Claimable(StageClaim.__table__, key=("id",), first_row={"runid": "run_id"}, unique="uq_stage_claims_key")


def test_every_claim_statement_takes_the_lease_with_the_same_compare_and_set() -> None:
    take = claim_ctes(OUTER_STEPS)
    compare_and_set = take[take.index("SET status") : take.index("WHERE")].strip()
    statements = (CLAIM_STAGE_SQL, TAKE_OUTER_STEP_SQL, STAGE_ROW_AND_CLAIM_SQL)
    assert all(compare_and_set in sql for sql in statements)
    assert "INSERT" not in TAKE_OUTER_STEP_SQL, "an outer step exists before it is claimed"
    assert all("ON CONFLICT ON CONSTRAINT uq_stage_claims_key DO NOTHING" in sql for sql in statements if sql is not TAKE_OUTER_STEP_SQL)
    with pytest.raises(ValueError, match="takes its run_id from a gate"):
        claim_ctes(STAGE_CLAIMS)
    assert renew_sql(STAGE_CLAIMS).replace("stage_claims", "outer_steps") == renew_sql(OUTER_STEPS)


def test_claim_params_take_over_only_with_a_lease() -> None:
    key = stage_key(7, Stage.probe, 2)
    plain = claim_params(key, worker="w", token=None, lease_s=None)
    assert plain["stale_before"] is None and plain["token"] is None and plain["episode_id"] == 7 and plain["stage"] == "probe"
    rules = claim_params(key, worker="w", token="t", lease_s=30.0)
    assert rules["now"] - rules["stale_before"] == dt.timedelta(seconds=30) and rules["token"] == "t"
    assert rules["new_token"] != plain["new_token"]
    claim = stage_claim_of(rules, 11, 2, "Killed")
    assert claim is not None and (claim.claim_id, claim.token, claim.stage, claim.probe_attempt, claim.takeovers, claim.last_error) == (
        11,
        rules["new_token"],
        Stage.probe,
        2,
        2,
        "Killed",
    )
    assert stage_claim_of(rules, None, None, None) is None


def test_a_refusal_says_whether_the_stage_is_done_or_held() -> None:
    assert refusal(Stage.agent, 3, "done", "w1") == "stage agent of episode 3 is already done"
    assert refusal(Stage.agent, 3, "running", "w1") == "stage agent of episode 3 is held by w1"
    assert refusal(Stage.agent, 3, None, None) == "stage agent of episode 3 is held by another worker"
