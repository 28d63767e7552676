"""Fixtures for persistence tests: a migrated SQLite file and a migrated PostgreSQL database.

PostgreSQL databases come from `tests/pg_databases.py` and are dropped afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from pg_databases import create_pg_database, drop_pg_database
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from jobs.store.engine import make_engine, upgrade_database
from jobs.store.settings import Settings
from jobs.store.tables import Project


@pytest.fixture
def fresh_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """An empty database URL (not migrated); the test's `backend` param picks the kind."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    url = create_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def migrated_engine(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Engine]:
    """One migrated database per backend for the whole session; tests use fresh projects."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'tuneyard.db'}"
    else:
        url = create_pg_database()
    upgrade_database(Settings(database_url=url))
    engine = make_engine(url)
    yield engine
    engine.dispose()
    if request.param == "postgresql":
        drop_pg_database(url)


@pytest.fixture
def session(migrated_engine: Engine) -> Iterator[Session]:
    with sessionmaker(bind=migrated_engine, expire_on_commit=False)() as session:
        yield session


@pytest.fixture
def project(session: Session) -> Project:
    project = Project(name=f"p-{uuid.uuid4().hex[:8]}")
    session.add(project)
    session.commit()
    return project
