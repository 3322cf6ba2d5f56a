"""The hosts that work on a run, the hidden-eval secret each holds, and pausing a run for a platform fault.

Each worker process records (run, host, secret fingerprint) before its first stage of a run; the orchestrator
records its own when it creates or takes up the run. :func:`secret_disagreement` is the pure rule on what was
recorded; :func:`pause_run` stops a run for a platform cause and gives the worker's claim back, so nothing is
charged to the agent and `metarl resume` takes the stage up again without counting a takeover.
"""

from __future__ import annotations

from collections.abc import Mapping

from metarl.store.claims import Claim, utcnow
from metarl.store.db import run_sql, sql_transaction
from schemas.states import ENDED_RUN_STATUSES, ClaimStatus, RunStatus

RECORD_HOST_SQL = """
INSERT INTO run_hosts (run_id, host, secret_fingerprint, role, first_seen_at, last_seen_at)
VALUES (%(run_id)s, %(host)s, %(fingerprint)s, %(role)s, %(now)s, %(now)s)
ON CONFLICT (run_id, host) DO UPDATE SET secret_fingerprint = EXCLUDED.secret_fingerprint, last_seen_at = EXCLUDED.last_seen_at,
    role = CASE WHEN position(EXCLUDED.role IN run_hosts.role) > 0 THEN run_hosts.role ELSE left(run_hosts.role || ',' || EXCLUDED.role, 32) END
"""
RUN_HOSTS_SQL = "SELECT host, secret_fingerprint FROM run_hosts WHERE run_id = %(run_id)s ORDER BY first_seen_at, host"
ENDED = ", ".join(f"'{status.value}'" for status in ENDED_RUN_STATUSES)
PAUSE_RUN_SQL = f"""
UPDATE runs SET status = '{RunStatus.paused.value}', status_message = %(cause)s, updated_at = %(now)s
WHERE id = %(run_id)s AND status NOT IN ({ENDED})
RETURNING id
"""
GIVE_BACK_CLAIM_SQL = f"""
UPDATE stage_claims SET status = '{ClaimStatus.pending.value}', error = %(cause)s, transient_failures = 0, heartbeat_at = %(now)s
WHERE id = %(claim_id)s AND token = %(token)s AND status = '{ClaimStatus.running.value}'
"""


def record_host(database_url: str, run_id: str, host: str, role: str, fingerprint: str | None) -> dict[str, str | None]:
    """Record that `host` works on the run holding the secret `fingerprint`; every host recorded so far and its fingerprint."""
    with sql_transaction(database_url) as sql:
        run_sql(sql, RECORD_HOST_SQL, {"run_id": run_id, "host": host, "fingerprint": fingerprint, "role": role, "now": utcnow()})
        return {str(row[0]): row[1] for row in run_sql(sql, RUN_HOSTS_SQL, {"run_id": run_id})}


def secret_disagreement(hosts: Mapping[str, str | None]) -> str | None:
    """Why the recorded hosts cannot share one run (two secret fingerprints), naming each host and its fingerprint; None when they agree."""
    held = {fingerprint for fingerprint in hosts.values() if fingerprint is not None}
    if len(held) <= 1:
        return None
    listed = "; ".join(f"{host} holds {fingerprint or 'none'}" for host, fingerprint in hosts.items())
    return f"the hosts of this run hold different hidden-eval secrets (fingerprints: {listed}), so they would score different hidden partitions"


def pause_run(database_url: str, run_id: str, cause: str, claim: Claim | None = None) -> bool:
    """Pause the run with `cause` and give `claim` back, in one transaction; False when the run had already ended."""
    now = utcnow()
    with sql_transaction(database_url) as sql:
        paused = run_sql(sql, PAUSE_RUN_SQL, {"run_id": run_id, "cause": cause, "now": now}).first() is not None
        if claim is not None:
            run_sql(sql, GIVE_BACK_CLAIM_SQL, {"cause": cause, "now": now, "claim_id": claim.claim_id, "token": claim.token})
    return paused
