"""What the agent's code may see of the pod, and how it is stopped (stdlib and pydantic only: the pod runner imports it).

``rl`` runs the agent's reward code; it gets only the environment variables named in the runner's
``passthrough_env`` and never a name that looks like a credential (:func:`child_environment`), and once
it stops, whatever is left of its session (or, on a pod, of its user) is killed (:func:`sweep_targets`
over :func:`read_processes`).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_PASSTHROUGH = (
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TZ",
    "TERM",
    "TMPDIR",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "UCX_HOME",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "HF_HUB_ETAG_TIMEOUT",
    "HF_HUB_DOWNLOAD_TIMEOUT",
    "UV_CACHE_DIR",
    "UV_PYTHON_PREFERENCE",
    "PRIME_LOG_LEVEL",
    "PRIME_VF_LOG_LEVEL",
    "NCCL_*",
    "VLLM_*",
    "TORCH_*",
    "TRITON_*",
)
"""What ``rl`` may see of the pod's environment: system paths, GPU and cache settings."""

SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|SESSION)", re.IGNORECASE)
SECRET_PREFIXES = ("AWS_", "RUNPOD_", "TINKER_", "METARL_", "GOOGLE_", "AZURE_", "WANDB_", "OPENAI_", "ANTHROPIC_")
"""Names never passed to ``rl`` unless listed in ``allow_secret_names``."""

FIXED_CHILD_ENV = {"PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}


def is_secret_name(name: str) -> bool:
    """True for a variable name that looks like a credential or one of our own settings."""
    upper = name.upper()
    return bool(SECRET_NAME.search(upper)) or upper.startswith(SECRET_PREFIXES)


def child_environment(
    parent: Mapping[str, str], passthrough: Iterable[str], allow_secret_names: Iterable[str] = (), extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment rl runs with: allowed names of ``parent``, no credentials, plus fixed and extra values."""
    patterns = list(passthrough)
    allowed_secrets = set(allow_secret_names)
    env = {
        name: value
        for name, value in parent.items()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns) and (name in allowed_secrets or not is_secret_name(name))
    }
    env.update(FIXED_CHILD_ENV)
    env.update(extra or {})
    return env


class ProcessInfo(BaseModel):
    """One process as /proc shows it."""

    model_config = ConfigDict(frozen=True)

    pid: int = Field(ge=1, description="Process id")
    ppid: int = Field(ge=0, description="Parent process id")
    session: int = Field(ge=0, description="Session id")
    uid: int = Field(ge=0, description="Real user id")
    zombie: bool = Field(default=False, description="Exited, not yet reaped")


def sweep_targets(processes: Iterable[ProcessInfo], mode: str, session: int, uid: int, own_pid: int) -> list[int]:
    """Processes still running the agent's code: rl's session, or (``uid``) every other live process of
    this user except this process and its ancestors (and pid 1)."""
    table = {proc.pid: proc for proc in processes}
    protected = {1, own_pid}
    cursor = table.get(own_pid)
    while cursor is not None and cursor.ppid not in protected and cursor.ppid > 0:
        protected.add(cursor.ppid)
        cursor = table.get(cursor.ppid)
    out = []
    for proc in table.values():
        if proc.zombie or proc.pid in protected:
            continue
        if proc.session == session or (mode == "uid" and proc.uid == uid):
            out.append(proc.pid)
    return sorted(out)


def read_processes() -> list[ProcessInfo]:
    """Every process /proc lists (those that vanish while read are skipped)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        # the real uid from status (the owner of /proc/<pid> is root for a process that made itself non-dumpable)
        uid_line = next((line for line in status.splitlines() if line.startswith("Uid:")), "Uid:\t0")
        uid = int(uid_line.split()[1])
        fields = stat[stat.rindex(")") + 2 :].split()
        out.append(ProcessInfo(pid=int(entry), ppid=int(fields[1]), session=int(fields[3]), uid=uid, zombie=fields[0] == "Z"))
    return out
