"""The hidden-eval secret's leak check: the secret file is the only place under a test's folder that holds it."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url


def secret_forms(secret: str) -> list[str]:
    """The secret as written, and its hex and base64 spellings (of the text and, for a hex secret, of its bytes)."""
    raw = secret.encode()
    forms = {secret, raw.hex(), base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode().rstrip("=")}
    try:
        decoded = bytes.fromhex(secret)
    except ValueError:
        decoded = b""
    if decoded:
        forms |= {base64.b64encode(decoded).decode().rstrip("="), base64.urlsafe_b64encode(decoded).decode().rstrip("=")}
    return sorted(forms)


def files_holding(root: Path, needles: list[str], skip: set[Path]) -> list[str]:
    """Every file under `root` (but `skip`) whose bytes hold one of the needles, as 'path: needle'."""
    found = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.resolve() in skip:
            continue
        data = path.read_bytes()
        found += [f"{path.relative_to(root)}: {needle}" for needle in needles if needle.encode() in data]
    return found


def dump_database(pg_url: str, out: Path) -> None:
    """Every row of every table of the database, as `pg_dump --data-only` writes it (skips the test without pg_dump)."""
    if shutil.which("pg_dump") is None:
        pytest.skip("pg_dump is not installed")
    url = make_url(pg_url)
    dumped = subprocess.run(
        [
            "pg_dump",
            "--data-only",
            "-h",
            url.host or "127.0.0.1",
            "-p",
            str(url.port or 5432),
            "-U",
            url.username or "postgres",
            "-f",
            str(out),
            url.database or "",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dumped.returncode == 0, dumped.stderr
    assert out.stat().st_size > 1000, "the database dump is nearly empty"


def assert_secret_stays_put(root: Path, secret_file: Path, pg_url: str) -> None:
    """Dump the database under ``root``, then fail naming every file under ``root`` (but the secret file) that holds the secret in any form."""
    assert secret_file.is_file(), "the workers did not create the secret under the artifacts root"
    secret = secret_file.read_text().strip()
    assert len(secret) >= 32
    dump_database(pg_url, root / "database.sql")
    leaks = files_holding(root, secret_forms(secret), skip={secret_file.resolve()})
    assert leaks == [], f"the hidden-eval secret leaked into: {leaks}"
