"""Fixtures for persistence tests: a migrated SQLite file and a migrated PostgreSQL database.

PostgreSQL databases are named `tuneyard_api_test_<random>`, created through the
`postgres` database on 127.0.0.1:5432 and dropped afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from jobs.store.engine import make_engine, upgrade_database
from jobs.store.settings import Settings
from jobs.store.tables import Project

PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def create_pg_database() -> str:
    name = f"tuneyard_api_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def drop_pg_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
