"""The services a command uses (configured by `--config` [services] or the environment, else embedded) and the note that keeps a folder's runs in services mode."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def configured_services(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(database URL, broker URL) of the command's `--config` [services], or (None, None): the environment then decides, as for every command."""
    path = getattr(args, "config", None)
    if path is None:
        return None, None
    from metarl.runconfig import load_run

    config, _specs = load_run(path)
    return config.services.database_url, config.services.broker_url


class Services:
    """Database and broker for one command: the configured services, or the embedded default."""

    def __init__(self, database_url: str | None, broker_url: str | None, *, spawn_workers: bool, migrate: bool = True):
        from metarl import settings

        self.database_url_setting = settings.database_url(database_url)
        self.broker_url_setting = settings.broker_url(broker_url)
        self.spawn_workers = spawn_workers
        self.migrate = migrate
        self.home = settings.metarl_home()
        self.embedded: Any = None
        self.pools: Any = None
        self.database_url = ""
        self.broker_url: str | None = None

    def __enter__(self) -> Services:
        from metarl.store import upgrade_database

        if self.database_url_setting:
            self.database_url = self.database_url_setting
            if self.spawn_workers or self.migrate:
                note_services_mode(self.home, self.database_url_setting, self.broker_url_setting)
        else:
            refusal = services_mode_refusal(self.home)
            if refusal is not None:
                raise SystemExit(f"error: {refusal}")
            from metarl.embedded import EmbeddedServices

            self.embedded = EmbeddedServices(self.home)
            self.database_url = self.embedded.start_database()
        if self.broker_url_setting:
            self.broker_url = self.broker_url_setting
        elif self.embedded is not None:
            self.broker_url = self.embedded.broker_url
        if self.migrate:
            upgrade_database(self.database_url)
        if self.spawn_workers:
            self.start_workers()
        return self

    def start_workers(self) -> None:
        """Spawn the worker pools here (a command that checks something first starts them after)."""
        if self.broker_url is None:
            raise SystemExit("error: METARL_BROKER_URL is not set while METARL_DATABASE_URL is; set both, or neither for the embedded default")
        from metarl.pools import WorkerPools

        self.pools = WorkerPools(self.database_url, self.broker_url, self.home / "logs")
        self.pools.start()

    def __exit__(self, *exc: object) -> None:
        if self.pools is not None:
            self.pools.stop()
        if self.embedded is not None:
            self.embedded.stop()


SERVICES_NOTE = "services.json"
"""Written under METARL_HOME by a command that used configured services: which ones (passwords left out)."""


def note_services_mode(home: Path, database_url: str, broker_url: str | None) -> None:
    """Record under `home` that runs of this folder live in services mode, so a later command does not open the embedded database."""
    from metarl.store import without_password

    home.mkdir(parents=True, exist_ok=True)
    note = {"database_url": without_password(database_url), "broker_url": without_password(broker_url) if broker_url else None}
    (home / SERVICES_NOTE).write_text(json.dumps(note, indent=2) + "\n", encoding="utf-8")


def services_mode_refusal(home: Path) -> str | None:
    """Why this command must not open the embedded database (a run of this folder lives in services mode), or None."""
    path = home / SERVICES_NOTE
    if not path.is_file():
        return None
    try:
        note = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        note = {}
    from schemas.config_error import printable

    return (
        f"runs of {home} live in services mode (database {printable(str(note.get('database_url')))}, broker {printable(str(note.get('broker_url')))}), "
        f"but METARL_DATABASE_URL is not set, so this command would open the empty embedded database. Fix: set METARL_DATABASE_URL and "
        f"METARL_BROKER_URL as for `metarl run`, or pass --config CONFIG; remove {path} to use the embedded database here again"
    )
