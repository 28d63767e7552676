"""`DriverStatement`: on a psycopg connection in autocommit the statement runs on the
driver's connection and writes and reads what Core would; in a transaction, and on SQLite,
it is Core's execute; errors are SQLAlchemy's; a killed backend is invalidated."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import (
    Column,
    Connection,
    Integer,
    MetaData,
    String,
    Table,
    event,
    insert,
    select,
    text,
)
from sqlalchemy.exc import IntegrityError, OperationalError

from jobs.store import engine as engines
from jobs.store.driver import DriverStatement
from jobs.store.tables import JSONType, UTCDateTime

META = MetaData()
ROWS = Table(
    "driver_rows", META,
    Column("id", Integer, primary_key=True),
    Column("name", String(20), unique=True),
    Column("data", JSONType),
    Column("at", UTCDateTime()),
)  # fmt: skip
INSERT = DriverStatement(insert(ROWS))
BY_ID = DriverStatement(select(ROWS.c.name, ROWS.c.data, ROWS.c.at).where(ROWS.c.id == 1))
VALUES = {"id": 1, "name": "one", "data": {"a": [1, 2.5, None], "b": "é"},
          "at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)}  # fmt: skip


@pytest.fixture(params=["postgresql", "sqlite"])
def engine(request, tmp_path):
    if request.param == "sqlite":
        made = engines.make_engine(f"sqlite:///{tmp_path / 'd.db'}")
        META.create_all(made)
        yield made
        made.dispose()
        return
    from pg_databases import create_pg_database, drop_pg_database

    url = create_pg_database()
    made = engines.make_engine(url, pool_size=1, max_overflow=0)
    META.create_all(made)
    try:
        yield made
    finally:
        made.dispose()
        drop_pg_database(url)


def _autocommit(engine):
    """PostgreSQL: autocommit (the API's `read_session`). SQLite keeps its transactions
    (its engine begins them itself): the tests commit."""
    if engine.dialect.name == "sqlite":
        return engine.connect()
    return engine.connect().execution_options(isolation_level="AUTOCOMMIT")


def test_it_writes_and_reads_what_core_does(engine):
    heard: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda c, cur, sql, *a: heard.append(sql))
    with _autocommit(engine) as conn:
        INSERT.run(conn, VALUES)
        conn.commit()
        assert BY_ID.first(conn, {}) == ("one", VALUES["data"], VALUES["at"])
        assert DriverStatement(select(ROWS.c.id).where(ROWS.c.id == 2)).first(conn, {}) is None
    with engine.connect() as conn:  # Core reads back the same values
        row = conn.execute(select(ROWS.c.data, ROWS.c.at)).one()
    assert (row.data, row.at) == (VALUES["data"], VALUES["at"])
    assert [s.split()[0] for s in heard if s.split()[0] in {"INSERT", "SELECT"}][-4:] == [
        "INSERT",
        "SELECT",
        "SELECT",
        "SELECT",
    ]


def test_on_postgresql_in_autocommit_core_is_bypassed(engine, monkeypatch):
    if engine.dialect.name != "postgresql":
        pytest.skip("the driver path is psycopg's")
    core: list[object] = []
    monkeypatch.setattr(Connection, "execute", lambda self, *a, **k: core.append(a))
    with _autocommit(engine) as conn:
        INSERT.run(conn, VALUES)
        assert BY_ID.first(conn, {})[0] == "one"
    assert core == []


def test_inside_a_transaction_it_is_cores_and_rolls_back(engine):
    with engine.connect() as conn:
        INSERT.run(conn, VALUES)
        assert conn.in_transaction()
        conn.rollback()
    with engine.connect() as conn:
        assert conn.execute(select(ROWS.c.id)).all() == []
        INSERT.run(conn, VALUES)
        conn.commit()
    with engine.connect() as conn:
        assert conn.execute(select(ROWS.c.id)).scalars().all() == [1]


def test_a_unique_violation_is_sqlalchemys_integrity_error(engine):
    with _autocommit(engine) as conn:
        INSERT.run(conn, VALUES)
        conn.commit()
        with pytest.raises(IntegrityError):
            INSERT.run(conn, {**VALUES, "id": 2})
        assert BY_ID.first(conn, {})[0] == "one"  # the connection is still usable


def test_a_killed_backend_is_invalidated_and_the_pool_connects_afresh(engine):
    if engine.dialect.name != "postgresql":
        pytest.skip("a PostgreSQL backend to kill")
    with _autocommit(engine) as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        admin = engines.make_engine(engine.url.render_as_string(hide_password=False))
        with admin.connect() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            other.commit()
        admin.dispose()
        with pytest.raises(OperationalError):
            BY_ID.first(conn, {})
        assert conn.invalidated
    with _autocommit(engine) as conn:
        assert conn.execute(text("SELECT pg_backend_pid()")).scalar() != pid
        assert BY_ID.first(conn, {}) is None
