"""The deployment's hidden-eval secret: it keys the partition that holds generated hidden evals back.

Resolution (:func:`active_eval_secret`): the secret installed in this process
(:func:`install_eval_secret`, which workers call with the run's artifacts root), else the
``METARL_EVAL_SECRET`` environment variable, else the file that ``METARL_EVAL_SECRET_FILE`` names.
``install_eval_secret`` takes the environment variable, else the file the deployment named in
``METARL_EVAL_SECRET_FILE``, else the file ``secrets/eval_partition.key`` under a local artifacts root,
and exports that file's path (never the secret) for child processes. Only the command that creates
or takes up a run may create that file (mode 0600, on first use): a worker never makes a secret of
its own, so pools on several hosts all hold the deployment's one secret or stop the run. The secret itself never leaves this module except as HMAC keys:
:func:`secret_fingerprint` is the only value derived from it that may be stored (a base-score key).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from metarl.errors import HiddenEvalSecretFault

EVAL_SECRET_ENV = "METARL_EVAL_SECRET"
EVAL_SECRET_FILE_ENV = "METARL_EVAL_SECRET_FILE"
SECRET_FILE = Path("secrets") / "eval_partition.key"
SECRET_BYTES = 32
MIN_SECRET_CHARS = 16
FINGERPRINT_MESSAGE = b"metarl hidden-eval secret fingerprint v1"

_installed: list[bytes] = []
_DEPLOYMENT_SECRET_FILE = os.environ.get(EVAL_SECRET_FILE_ENV)
"""The secret file the deployment named before this process exported one of its own."""
SHARED_SECRET_FIX = f"set {EVAL_SECRET_ENV} (or {EVAL_SECRET_FILE_ENV}, a file holding it) to the deployment's hidden-eval secret, the same on every host"


class EvalSecretMissing(HiddenEvalSecretFault):
    """No hidden-eval secret is available to this process."""


def secret_path(artifacts_root: str | Path) -> Path:
    """Where the secret file lives under a local artifacts root."""
    root = str(artifacts_root)
    if root.startswith("file://"):
        root = root[len("file://") :]
    if "://" in root:
        raise EvalSecretMissing(f"artifacts root {root!r} is not a local folder: set {EVAL_SECRET_ENV} to the deployment's hidden-eval secret")
    return Path(root) / SECRET_FILE


def _checked(value: str, source: str) -> bytes:
    text = value.strip()
    if len(text) < MIN_SECRET_CHARS:
        raise EvalSecretMissing(f"the hidden-eval secret from {source} has {len(text)} characters: use at least {MIN_SECRET_CHARS}")
    return text.encode()


def read_or_create_secret_file(path: Path) -> bytes:
    """The secret stored at ``path``, creating the file (mode 0600, exclusively) when there is none."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _checked(path.read_text(encoding="utf-8"), str(path))
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(secrets.token_hex(SECRET_BYTES) + "\n")
    return _checked(path.read_text(encoding="utf-8"), str(path))


def unusable_root_message(artifacts_root: str | Path, path: Path, reason: str) -> str:
    """Why an artifacts root cannot hold the hidden-eval secret file, with the fix."""
    return (
        f"the artifacts root {str(artifacts_root)!r} cannot hold the hidden-eval secret ({path}: {reason}); "
        f"give a local folder that can be created and written, or set {EVAL_SECRET_ENV}"
    )


def install_tool_eval_secret(artifacts_root: str | Path) -> None:
    """:func:`install_eval_secret` for a command outside a run (``metarl probe``, ``metarl tasks show``, a bench), then make
    sure a secret is there: :class:`EvalSecretMissing` naming the root and the fix, before any work, when there is none
    (a remote root without ``METARL_EVAL_SECRET``, a root that is a file or cannot be created)."""
    install_eval_secret(artifacts_root)
    if not _installed and not os.environ.get(EVAL_SECRET_ENV) and not os.environ.get(EVAL_SECRET_FILE_ENV):
        raise EvalSecretMissing(
            f"the artifacts root {str(artifacts_root)!r} is not a local folder, so it holds no hidden-eval secret here: set {EVAL_SECRET_ENV} "
            "to the deployment's secret, or give a local folder"
        )
    active_eval_secret()


def install_eval_secret(artifacts_root: str | Path, *, create: bool = True) -> None:
    """Make the deployment's secret this process's (and its children's) hidden-eval secret.

    ``create=False`` (workers): never create the local root's file; EvalSecretMissing with the fix when there is no secret.
    """
    value = os.environ.get(EVAL_SECRET_ENV)
    if value:
        _installed[:] = [_checked(value, EVAL_SECRET_ENV)]
        return
    if _DEPLOYMENT_SECRET_FILE:
        try:
            _installed[:] = [_checked(Path(_DEPLOYMENT_SECRET_FILE).read_text(encoding="utf-8"), EVAL_SECRET_FILE_ENV)]
        except OSError as exc:
            raise EvalSecretMissing(f"{EVAL_SECRET_FILE_ENV} names an unreadable file: {exc.strerror}") from None
        return
    try:
        path = secret_path(artifacts_root)
    except EvalSecretMissing:
        if create:
            return  # a tool with a remote root: the secret must come from the environment (active_eval_secret says so)
        raise EvalSecretMissing(f"no hidden-eval secret on this host (the artifacts root is not a local folder): {SHARED_SECRET_FIX}") from None
    try:
        if create:
            secret = read_or_create_secret_file(path)
        elif path.is_file():
            secret = _checked(path.read_text(encoding="utf-8"), str(path))
        else:
            raise EvalSecretMissing(f"no hidden-eval secret on this host (no {path}, which only the run's own host creates): {SHARED_SECRET_FIX}")
    except OSError as exc:
        raise EvalSecretMissing(unusable_root_message(artifacts_root, path, exc.strerror or str(exc))) from None
    except UnicodeDecodeError:
        raise EvalSecretMissing(unusable_root_message(artifacts_root, path, "not a text file")) from None
    os.environ[EVAL_SECRET_FILE_ENV] = str(path.resolve())
    _installed[:] = [secret]


def installed_fingerprint() -> str:
    """The fingerprint of this process's hidden-eval secret (:func:`secret_fingerprint`); EvalSecretMissing when it has none."""
    return secret_fingerprint(active_eval_secret())


def install_existing_eval_secret(artifacts_root: str | Path) -> bool:
    """Install the deployment's secret when it already exists (the environment variable, or the file under
    ``artifacts_root``), creating and exporting nothing; False when there is none yet."""
    value = os.environ.get(EVAL_SECRET_ENV)
    if value:
        _installed[:] = [_checked(value, EVAL_SECRET_ENV)]
        return True
    try:
        path = secret_path(artifacts_root)
    except EvalSecretMissing:
        return False
    if not path.is_file():
        return False
    _installed[:] = [_checked(path.read_text(encoding="utf-8"), str(path))]
    return True


def install_provisional_eval_secret() -> None:
    """Install a random secret held in memory only (a dry run before the deployment has one: what it keys is provisional)."""
    _installed[:] = [secrets.token_hex(SECRET_BYTES).encode()]


DEFAULT_TOOL_ARTIFACTS = ".metarl/artifacts"
"""The artifacts root a bench or script outside a run keys its hidden evals by (a run's default root too)."""


def add_artifacts_argument(parser: argparse.ArgumentParser) -> None:
    """``--artifacts DIR`` for a tool that draws hidden evals outside a run: whose secret keys its partition."""
    parser.add_argument(
        "--artifacts",
        default=DEFAULT_TOOL_ARTIFACTS,
        help=f"artifacts root whose {SECRET_FILE} keys the hidden-eval partition (default {DEFAULT_TOOL_ARTIFACTS}; {EVAL_SECRET_ENV} wins)",
    )


def active_eval_secret() -> bytes:
    """This process's hidden-eval secret; :class:`EvalSecretMissing` with the fix when there is none."""
    if _installed:
        return _installed[0]
    value = os.environ.get(EVAL_SECRET_ENV)
    if value:
        return _checked(value, EVAL_SECRET_ENV)
    path = os.environ.get(EVAL_SECRET_FILE_ENV)
    if path:
        try:
            return _checked(Path(path).read_text(encoding="utf-8"), EVAL_SECRET_FILE_ENV)
        except OSError as exc:
            raise EvalSecretMissing(f"{EVAL_SECRET_FILE_ENV} names an unreadable file: {exc.strerror}") from None
    raise EvalSecretMissing(f"no hidden-eval secret: set {EVAL_SECRET_ENV}, or run with an artifacts root (its {SECRET_FILE} is created on first use)")


def keyed_digest(secret: bytes, *parts: str) -> bytes:
    """HMAC-SHA256 of the parts (joined by a unit separator) under the secret."""
    return hmac.new(secret, "\x1f".join(parts).encode(), hashlib.sha256).digest()


def secret_fingerprint(secret: bytes) -> str:
    """A short non-reversible fingerprint of the secret (HMAC of a constant): safe to store in a cache key."""
    return hmac.new(secret, FINGERPRINT_MESSAGE, hashlib.sha256).hexdigest()[:12]
