"""Alembic migrations upgrade an empty database and downgrade it again, on both backends."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from jobs.store.engine import downgrade_database, make_engine, upgrade_database
from jobs.store.settings import Settings
from jobs.store.tables import Base

TABLES = {"projects", "api_keys", "jobs", "job_events", "metrics", "job_logs", "checkpoints",
          "workers"}  # fmt: skip


@pytest.mark.parametrize("fresh_url", ["sqlite", "postgresql"], indirect=True)
def test_upgrade_then_downgrade(fresh_url: str) -> None:
    settings = Settings(database_url=fresh_url)
    upgrade_database(settings)
    engine = make_engine(fresh_url)
    try:
        assert set(inspect(engine).get_table_names()) >= TABLES
        downgrade_database(settings)
        assert not TABLES & set(inspect(engine).get_table_names())
        upgrade_database(settings)  # and up again: the downgrade left nothing behind
        assert set(inspect(engine).get_table_names()) >= TABLES
    finally:
        engine.dispose()


@pytest.mark.parametrize("fresh_url", ["sqlite", "postgresql"], indirect=True)
def test_migration_matches_the_models(fresh_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    upgrade_database(Settings(database_url=fresh_url))
    engine = make_engine(fresh_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []
    finally:
        engine.dispose()


def test_migrate_works_from_another_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    upgrade_database(Settings(database_url=url))
    engine = make_engine(url)
    assert "jobs" in inspect(engine).get_table_names()
    engine.dispose()
