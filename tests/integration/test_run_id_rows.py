"""Probe attempts and rewards carry their episode's run id: written by the stage records, filled in by migration 0007, checked by exactly-once."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from metarl.store import db
from metarl.store.db import session_scope
from metarl.store.exactly_once import exactly_once_violations
from metarl.store.records import ProbeAttempt, Reward
from tests.integration.helpers import finished_episode

pytestmark = pytest.mark.integration


def test_exactly_once_flags_a_reward_filed_under_another_run(pg_url: str) -> None:
    run_id, _ = finished_episode(pg_url)
    other_run, _ = finished_episode(pg_url)
    astray_run, _ = finished_episode(pg_url, reward_run_id=other_run)
    with session_scope(pg_url) as session:
        assert exactly_once_violations(session, run_id) == []
        assert exactly_once_violations(session, astray_run) == ["1 rewards row(s) of this run's episodes carry another run id"]


def test_migration_0007_fills_the_run_id_of_existing_rows(pg_url: str) -> None:
    run_id, episode_id = finished_episode(pg_url)
    from alembic import command

    command.downgrade(db.alembic_config(pg_url), "0006")
    engine = create_engine(db.normalise_url(pg_url))
    with engine.connect() as connection:
        columns = connection.execute(text("SELECT column_name FROM information_schema.columns WHERE table_name = 'rewards'")).scalars().all()
    assert "run_id" not in columns
    db.dispose_engines()
    db.upgrade(pg_url)
    with session_scope(pg_url) as session:
        assert session.query(Reward).filter_by(episode_id=episode_id).one().run_id == run_id
        assert session.query(ProbeAttempt).filter_by(episode_id=episode_id).one().run_id == run_id
    engine.dispose()
