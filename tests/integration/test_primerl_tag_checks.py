"""prime-rl's own code at the pinned tag on our compiled bundles (needs a checkout; skipped without one).

    METARL_PRIMERL_CHECKOUT=/tmp/prime-rl-v0.8.0 python -m pytest tests/integration/test_primerl_tag_checks.py

The scripts build a Python 3.12 environment on first use (METARL_PRIMERL_VENV, default
/tmp/metarl-primerl-v0.8.0-venv; a minute or two from the package registry).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKOUT = os.environ.get("METARL_PRIMERL_CHECKOUT")
VENV = os.environ.get("METARL_PRIMERL_VENV", "/tmp/metarl-primerl-v0.8.0-venv")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHECKOUT, reason="set METARL_PRIMERL_CHECKOUT to a prime-rl checkout at the pinned tag")]


def script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(REPO / "scripts" / name), "--checkout", str(CHECKOUT), "--venv", VENV, *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=1500)


def test_the_committed_schema_is_what_the_tag_derives() -> None:
    result = script("derive_primerl_schema.py", "--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_tags_launcher_accepts_every_checked_bundle() -> None:
    result = script("check_bundles_with_primerl.py")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert "0 failed" in result.stdout
