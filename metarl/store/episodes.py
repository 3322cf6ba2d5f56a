"""Database side of episode transitions: CAS moves, group completion, reward records, context."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from metarl.domain.reward import RewardInputs, compute_reward
from metarl.domain.time_caps import group_time_cap
from metarl.domain.transitions import TERMINAL_STAGES, Transition
from metarl.interfaces import CostItem, EpisodeContext
from metarl.store.claims import FINISH_SET, STAGE_CLAIMS, Claim, claim_ctes, claim_params, finish_params, stage_claim_of, stage_key
from metarl.store.columns import columns_of, insert_lists
from metarl.store.db import SqlTarget, json_param, run_sql, sql_transaction, text_array_literal
from metarl.store.inner_jobs import INNER_JOB_COLUMNS, InnerJobRow, inner_job_row
from metarl.store.ledger import RECORD_COST_SQL, cost_params
from metarl.store.records import ClaimStatus, Reward, Run, RunStatus, Stage
from metarl.store.stage_records import WHEN_HELD, StageRecord, record_ctes, write_records
from metarl.store.tick_wakeup import CHANNEL as TICK_CHANNEL
from schemas.base import FieldProblem
from schemas.run_config import RunConfig, stored_run_config
from schemas.states import ENDED_RUN_STATUSES
from schemas.task_spec import TaskSpec


class StaleTransition(Exception):
    """The episode moved on since the claim was taken (another worker finished it)."""


def episode_seed(run_seed: int, episode_id: int) -> int:
    digest = hashlib.sha256(f"{run_seed}:{episode_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def start_set_seed(task_id: str, index_in_group: int) -> int:
    """The seed of a start-set episode: from its task and place in the group only, so every run's start set is the same."""
    return fixed_set_seed("start-set", task_id, index_in_group)


def held_out_seed(task_id: str, index_in_group: int) -> int:
    """The seed of a held-out evaluation episode: from its task and place in the group only, the same at every policy
    version and in every run, so two evaluations differ by the policy alone (paired draws)."""
    return fixed_set_seed("held-out", task_id, index_in_group)


def fixed_set_seed(kind: str, task_id: str, index_in_group: int) -> int:
    """A seed that depends on the kind of evaluation set, the task and the place in the group, not on the run or episode id."""
    digest = hashlib.sha256(f"{kind}:{task_id}:{index_in_group}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def run_config_of(run: Run) -> RunConfig:
    """The run's validated config."""
    return stored_run_config(run.config)


@dataclass(frozen=True)
class StageRow:
    """What a stage reads of its episode before claiming it: one row, one round trip."""

    episode_id: int
    run_id: str
    run_status: RunStatus
    stage: Stage
    probe_attempt: int
    task_id: str
    policy_version: int
    policy_state_uri: str | None
    workspace_uri: str | None
    job_toml: str | None
    previous_errors: list[dict[str, Any]] | None
    run_config: dict[str, Any]
    """The run's config as stored (`config_and_task` validates it)."""
    task_spec: dict[str, Any]
    """The episode's task spec as stored."""
    passed: bool | None = None
    agent_tokens: int = 0
    inner_job: InnerJobRow | None = None
    group_id: int = 0
    """The episode's group (its training-time cap is drawn per group: `metarl.domain.time_caps`)."""
    index_in_group: int = 0
    start_set: bool = False
    """An episode of the run's fixed start set: its seed comes from its task and index, not the run's seed, and it keeps its task's cap."""
    held_out: bool = False
    """An evaluation-only episode (the start set's, or a held-out family's)."""

    def seed(self, run_seed: int) -> int:
        """The episode's seed: a start-set or held-out evaluation episode's is the same in every run (`start_set_seed`,
        `held_out_seed`); a training episode's depends on the run's seed and its id."""
        if self.start_set:
            return start_set_seed(self.task_id, self.index_in_group)
        if self.held_out:
            return held_out_seed(self.task_id, self.index_in_group)
        return episode_seed(run_seed, self.episode_id)

    @property
    def passed_attempt_and_tokens(self) -> tuple[int | None, int]:
        """The reward's inputs from the attempts: this attempt if it passed the probe (None otherwise), and the agent tokens of
        the attempts up to it. At a train or eval stage this is the attempt that passed (earlier ones all failed); at a probe
        that ends the episode unvalidated, None and the tokens of every attempt."""
        return (self.probe_attempt if self.passed else None), self.agent_tokens


STAGE_ROW_SQL = f"""
SELECT e.id, e.run_id, r.status, e.stage, e.probe_attempt, e.task_id, e.policy_version,
       pv.state_uri, cur.workspace_uri, cur.job_toml, prev.errors, r.config, r.task_specs -> e.task_id, cur.passed,
       (SELECT coalesce(sum(a.agent_tokens), 0) FROM probe_attempts a WHERE a.episode_id = e.id AND a.attempt <= e.probe_attempt), e.group_id,
       e.index_in_group, g.start_set, e.held_out,
       {", ".join(f"ij.{column} AS inner_{column}" for column in INNER_JOB_COLUMNS)}
FROM episodes e
JOIN runs r ON r.id = e.run_id
JOIN episode_groups g ON g.id = e.group_id
LEFT JOIN policy_versions pv ON pv.run_id = e.run_id AND pv.version = e.policy_version
LEFT JOIN probe_attempts cur ON cur.episode_id = e.id AND cur.attempt = e.probe_attempt
LEFT JOIN probe_attempts prev ON prev.episode_id = e.id AND prev.attempt = e.probe_attempt - 1
LEFT JOIN inner_jobs ij ON ij.episode_id = e.id
WHERE e.id = %(episode_id)s
"""
ENDED_ARRAY = text_array_literal(status.value for status in ENDED_RUN_STATUSES)
STAGE_ROW_AND_CLAIM_SQL = f"""
WITH stage_row AS ({STAGE_ROW_SQL}),
claimable AS (
    SELECT run_id FROM stage_row WHERE stage = %(stage)s AND probe_attempt = %(probe_attempt)s AND status <> ALL({ENDED_ARRAY})
),
{claim_ctes(STAGE_CLAIMS, "claimable")}
SELECT stage_row.*, claim.id, claim.takeovers, claim.error
FROM stage_row LEFT JOIN claim ON true
"""
"""The stage row, and in the same statement the claim when it is the plain case: a first claim, or the continuation of
this worker's own claim (the token of its last message), by the claim statement of `metarl.store.claims` without a
takeover. Anything else (a duplicate message, a takeover) gets no claim here and goes through
`metarl.store.claims.claim_stage`, which needs the run's lease."""


OPEN_GROUPS_SQL = """
WITH new_groups AS (
    INSERT INTO episode_groups (run_id, task_id, policy_version, size, held_out, start_set, status, ended_episodes, created_at)
    SELECT %(run_id)s, t.task_id, %(policy_version)s, %(size)s, %(held_out)s, %(start_set)s, 'open', 0, %(now)s
    FROM unnest(%(task_ids)s::text[]) WITH ORDINALITY AS t(task_id, position)
    ORDER BY t.position
    RETURNING id, task_id
),
new_episodes AS (
    INSERT INTO episodes (run_id, group_id, index_in_group, task_id, policy_version, held_out, stage, probe_attempt, dispatched_at, dispatch_count,
                          created_at, updated_at)
    SELECT %(run_id)s, g.id, i, g.task_id, %(policy_version)s, %(held_out)s, 'agent', 1, %(now)s, 1, %(now)s, %(now)s
    FROM new_groups g CROSS JOIN generate_series(0, %(size)s - 1) AS i
    ORDER BY g.id, i
    RETURNING id
)
SELECT id FROM new_episodes ORDER BY id
"""
"""New open groups, one per task id, each with `size` episodes at the agent stage, first attempt, dispatched now."""


def open_groups(
    session: SqlTarget, *, run_id: str, task_ids: Sequence[str], policy_version: int, size: int, held_out: bool, now: dt.datetime, start_set: bool = False
) -> list[int]:
    """In the caller's transaction: open a group per task id with its episodes (one statement); the new episodes' ids."""
    params = {
        "run_id": run_id,
        "task_ids": list(task_ids),
        "policy_version": policy_version,
        "size": size,
        "held_out": held_out,
        "start_set": start_set,
        "now": now,
    }
    return [episode_id for (episode_id,) in run_sql(session, OPEN_GROUPS_SQL, params)]


def stage_row_of(columns: tuple[Any, ...]) -> StageRow:
    """A StageRow from the columns of STAGE_ROW_SQL."""
    (eid, run_id, run_status, stage, attempt, task_id, version, state_uri, workspace_uri, job_toml, errors, config, task_spec, passed, tokens) = columns[:15]
    group_id, index_in_group, start_set, held_out = columns[15:19]
    inner_job = inner_job_row(columns[19:])
    return StageRow(
        eid,
        run_id,
        RunStatus(run_status),
        Stage(stage),
        attempt,
        task_id,
        version,
        state_uri,
        workspace_uri,
        job_toml,
        errors,
        config,
        task_spec,
        passed,
        int(tokens),
        inner_job,
        int(group_id),
        int(index_in_group),
        bool(start_set),
        bool(held_out),
    )


def stage_row_and_claim(
    session: SqlTarget, *, episode_id: int, stage: Stage, probe_attempt: int, worker: str, token: str | None
) -> tuple[StageRow | None, Claim | None]:
    """The episode's stage row (None: no such episode) and, when it is at this stage of a live run, a new or continued claim.

    The claim is None when the episode is elsewhere, its run ended, or the plain claim did not apply
    (see STAGE_ROW_AND_CLAIM_SQL): the caller then skips, or claims with `metarl.store.claims.claim_stage`.
    """
    params = claim_params(stage_key(episode_id, stage, probe_attempt), worker=worker, token=token, lease_s=None)
    found = run_sql(session, STAGE_ROW_AND_CLAIM_SQL, params).first()
    if found is None:
        return None, None
    return stage_row_of(found[:-3]), stage_claim_of(params, *found[-3:])


def config_and_task(row: StageRow) -> tuple[RunConfig, TaskSpec]:
    """The run's config and the episode's task spec, validated from what the stage row read, at its group's training-time cap (pure)."""
    config = stored_run_config(row.run_config)
    task = TaskSpec.model_validate(row.task_spec)
    cap = None if row.start_set else group_time_cap(config.run.episode_train_seconds, config.run.seed, row.group_id)
    return config, task if cap is None else task.with_train_seconds(cap, config.backends.train.trains_on_gpu)


def stage_context(row: StageRow, config: RunConfig, task: TaskSpec) -> EpisodeContext:
    """The backends' view of the episode at this stage (pure)."""
    feedback = [FieldProblem.model_validate(item) for item in (row.previous_errors or [])] if row.probe_attempt > 1 else []
    return EpisodeContext(
        policy_state_uri=row.policy_state_uri,
        workspace_uri=row.workspace_uri,
        run_id=row.run_id,
        episode_id=row.episode_id,
        task=task,
        policy_version=row.policy_version,
        probe_attempt=row.probe_attempt,
        seed=row.seed(config.run.seed),
        feedback=feedback,
        artifacts_root=config.artifacts.root,
        train_backend=config.backends.train.type,
        train_on_gpu=config.backends.train.trains_on_gpu,
    )


FINISH_AND_MOVE_SQL = f"""
WITH held AS (
    SELECT c.id FROM stage_claims c JOIN episodes e ON e.id = c.episode_id
    WHERE c.id = %(claim_id)s AND c.token = %(token)s AND c.status = 'running'
      AND e.id = %(episode_id)s AND e.stage = %(from_stage)s AND e.probe_attempt = %(from_attempt)s
    FOR NO KEY UPDATE OF c, e
),
finished AS (UPDATE stage_claims SET {FINISH_SET} WHERE id IN (SELECT id FROM held) RETURNING id),
moved AS (
    UPDATE episodes
    SET stage = %(to_stage)s, probe_attempt = %(to_attempt)s, updated_at = %(now)s, dispatched_at = %(now)s, error = %(episode_error)s,
        finished_at = CASE WHEN %(terminal)s THEN %(now)s ELSE finished_at END
    WHERE id = %(episode_id)s AND EXISTS (SELECT 1 FROM held)
    RETURNING group_id
),
counted AS (
    UPDATE episode_groups g
    SET ended_episodes = g.ended_episodes + 1,
        status = CASE WHEN g.status = 'open' AND g.ended_episodes + 1 >= g.size THEN (CASE WHEN g.held_out THEN 'evaluated' ELSE 'complete' END)
                      ELSE g.status END
    FROM moved WHERE g.id = moved.group_id AND %(terminal)s
    RETURNING g.run_id, g.ended_episodes = g.size AND g.status IN ('complete', 'evaluated') AS completed
),
notified AS (SELECT pg_notify('{TICK_CHANNEL}', run_id) FROM counted WHERE completed){{records}}
SELECT (SELECT count(*) FROM finished), (SELECT count(*) FROM notified)
"""
"""One statement: lock the claim (still this worker's, by its token) and the episode (still at the claimed stage
and attempt) together, then close the claim, move the episode and write the stage's records
(`{records}`: those conditioned on `held`, see `metarl.store.stage_records.WHEN_HELD`, only with the move;
facts such as a poll's or a charge either way). Either all of the move happens or none of it, so a
move runs on its own in autocommit. A move that ends the episode counts it on its group's row; the
one that brings the count to the group's size completes the group (evaluated, if held out) and asks
its run's orchestrator for a (gapped) tick, delivered when the statement commits (`metarl.store.tick_wakeup`).
Two episodes of a group ending at once update the same row: the second waits for the first and then
counts on the row as the first left it. The locks are FOR NO KEY UPDATE: they serialise movers, and
leave alone the inserts whose foreign keys point at these rows."""
CLAIM_STILL_HELD_SQL = "SELECT EXISTS (SELECT 1 FROM stage_claims WHERE id = %(claim_id)s AND token = %(token)s AND status = 'running')"
"""Why a move wrote nothing, read after it (a new snapshot, so it sees what the move waited for): the claim still held means the episode moved on."""


def ends_episode(to: Transition) -> bool:
    """Whether a move to `to` ends the episode (its group counts it)."""
    return to.stage in TERMINAL_STAGES


def finish_and_move_sql(ctes: Sequence[str]) -> str:
    """FINISH_AND_MOVE_SQL with these records' CTEs in it (the same text for the same records: prepared once)."""
    return FINISH_AND_MOVE_SQL.format(records="".join(f",\n{cte}" for cte in ctes))


def finish_and_move(
    session: SqlTarget,
    claim: Claim,
    status: ClaimStatus,
    to: Transition,
    *,
    episode_error: str | None = None,
    claim_error: str | None = None,
    records: Sequence[StageRecord] = (),
) -> bool:
    """Close the claim, move its episode from the claimed stage and attempt to `to` and write `records`: all or nothing.

    False when the claim was taken over (nothing written). Raises StaleTransition when the episode
    moved on (nothing written either). Records without `WHEN_HELD` (a poll's facts) are written in
    both cases: in autocommit they stay, in a transaction the caller decides. An ending move
    completes the group when it was the group's last episode, in the same statement.
    """
    terminal = ends_episode(to)
    params: dict[str, Any] = {
        **finish_params(claim, status, claim_error),
        "to_stage": to.stage.value,
        "to_attempt": to.probe_attempt,
        "episode_error": episode_error,
        "terminal": terminal,
        "episode_id": claim.episode_id,
        "from_stage": claim.stage.value,
        "from_attempt": claim.probe_attempt,
    }
    for record in records:
        if record.params.get("episode_id", claim.episode_id) != claim.episode_id:
            raise ValueError(f"record {record.name} is for episode_id {record.params['episode_id']}, not the moved episode {claim.episode_id}")
    ctes, record_params = record_ctes(records)
    params.update(record_params)
    finished = run_sql(session, finish_and_move_sql(ctes), params).one()[0]
    if not finished:
        if run_sql(session, CLAIM_STILL_HELD_SQL, {"claim_id": claim.claim_id, "token": claim.token}).scalar_one():
            raise StaleTransition(f"episode {claim.episode_id} is no longer at {claim.stage.value}/{claim.probe_attempt}")
        return False
    return True


def move_episode(
    database_url: str,
    claim: Claim,
    status: ClaimStatus,
    to: Transition,
    *,
    episode_error: str | None = None,
    claim_error: str | None = None,
    records: Sequence[StageRecord] = (),
) -> bool:
    """:func:`finish_and_move` as a unit of work of its own: one statement in autocommit (what a stage message ends with)."""
    with sql_transaction(database_url, autocommit=True) as sql:
        return finish_and_move(sql, claim, status, to, episode_error=episode_error, claim_error=claim_error, records=records)


def cost_records(run_id: str, episode_id: int | None, costs: list[CostItem], simulated: bool) -> list[StageRecord]:
    """Each charge as a record to write in the same statement as a move or heartbeat (idempotent on its key, unconditional)."""
    return [
        StageRecord(
            f"charge_{index}",
            RECORD_COST_SQL,
            cost_params(
                run_id=run_id,
                episode_id=episode_id,
                source=item.source,
                description=item.description,
                quantity=item.quantity,
                unit=item.unit,
                unit_price_usd=item.unit_price_usd,
                idempotency_key=item.key,
                simulated=simulated,
            ),
        )
        for index, item in enumerate(costs)
    ]


def record_costs(session: SqlTarget, run_id: str, episode_id: int | None, costs: list[CostItem], simulated: bool) -> None:
    """Write each charge once (a replayed charge is not billed again), in one statement."""
    write_records(session, cost_records(run_id, episode_id, costs, simulated))


REWARD_COLUMNS, REWARD_VALUES = insert_lists(Reward.__table__, columns_of(Reward.__table__, without=("id",)), {"created_at": "now()"})
REWARD_WITH_MOVE_SQL = f"""
INSERT INTO rewards ({REWARD_COLUMNS})
SELECT {REWARD_VALUES}
WHERE {WHEN_HELD}
ON CONFLICT ON CONSTRAINT uq_rewards_episode_id DO NOTHING
"""
"""The reward, as a record of the episode's ending move (written only if the move happens, once)."""


def reward_params(
    *,
    episode_id: int,
    run_id: str,
    config: RunConfig,
    task: TaskSpec,
    attempts: tuple[int | None, int],
    base_score: float | None,
    trained_score: float | None,
    train_seconds: float | None,
) -> dict[str, Any]:
    """The episode's reward from its records (`attempts`: `StageRow.passed_attempt_and_tokens`), as REWARD_WITH_MOVE_SQL's parameters (pure)."""
    passed_on, tokens = attempts
    breakdown = compute_reward(
        RewardInputs(
            passed_on_attempt=passed_on,
            max_probe_attempts=config.retries.max_probe_attempts,
            agent_tokens=tokens,
            base_score=base_score,
            trained_score=trained_score,
            train_seconds=train_seconds,
            train_budget_seconds=config.backends.train.train_seconds(task),
        ),
        config.reward,
    )
    return {"episode_id": episode_id, "run_id": run_id, "weights": json_param(config.reward.model_dump()), **breakdown.model_dump()}


def reward_record(params: dict[str, Any]) -> StageRecord:
    """The episode's reward (`reward_params`) as a record of its last move: written only if the move happens."""
    return StageRecord("reward", REWARD_WITH_MOVE_SQL, params)


def unscored_reward_record(*, episode_id: int, run_id: str, config: RunConfig, task: TaskSpec, attempts: tuple[int | None, int]) -> StageRecord:
    """The reward of an episode that ends without a scored job (never validated, or its inner job failed), as a record of that move."""
    return reward_record(
        reward_params(
            episode_id=episode_id, run_id=run_id, config=config, task=task, attempts=attempts, base_score=None, trained_score=None, train_seconds=None
        )
    )
