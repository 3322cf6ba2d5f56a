"""What a worker checks of its own host before it works on a run, and pausing a run for a platform fault.

Before its first stage of a run, a worker process installs the deployment's hidden-eval secret (never creating one),
records its host and the secret's fingerprint (`metarl.store.run_hosts`), and under a local-folder artifact root
checks that this host shares the folder. A failed check is a platform fault: the run pauses with the cause.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from metarl.artifact_store import ArtifactStore
from metarl.errors import HiddenEvalSecretFault, PlatformFault, describe_error
from metarl.learning.eval_secret import install_eval_secret, installed_fingerprint
from metarl.settings import host_name
from metarl.store import Claim, pause_run, record_host, secret_disagreement
from schemas.run_config import RunConfig
from workers.common import database_url

log = logging.getLogger("metarl.worker")

_checked_runs: set[tuple[str, str]] = set()
"""(run id, role) pairs this process has checked; the secret is installed again on every stage."""


@dataclass(frozen=True)
class PlatformBlocked:
    """A stage's loader found that this host cannot work on the run (the fault says why and the fix)."""

    fault: PlatformFault


def check_this_host(run_id: str, config: RunConfig, role: str) -> PlatformBlocked | None:
    """Install the secret, and once per process and run record the host and check the secret and the artifact root."""
    try:
        install_eval_secret(config.artifacts.root, create=False)
        if (run_id, role) in _checked_runs:
            return None
        host = host_name()
        hosts = record_host(database_url(), run_id, host, role, installed_fingerprint())
        disagreement = secret_disagreement(hosts)
        if disagreement is not None:
            raise HiddenEvalSecretFault(f"{disagreement}: give every host the same METARL_EVAL_SECRET, then `metarl resume`")
        ArtifactStore(config.artifacts.root, host=host).check_shared(run_id, list(hosts))
    except PlatformFault as fault:
        return PlatformBlocked(fault)
    _checked_runs.add((run_id, role))
    return None


def pause_for_fault(run_id: str, role: str, fault: PlatformFault, claim: Claim | None) -> None:
    """Pause the run with the fault as its cause and give the claim back (nothing is charged to the agent)."""
    cause = f"paused by host {host_name()} ({role}): {describe_error(fault)}"
    if pause_run(database_url(), run_id, cause, claim):
        log.error("run %s %s", run_id, cause)
