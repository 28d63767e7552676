"""Database engines, sessions and migrations, built from `Settings`.

`get_engine(settings)` returns one engine per database URL. PostgreSQL URLs are pinned to
psycopg 3 (`postgresql+psycopg://`). SQLite (the embedded default) gets WAL, foreign keys
and a busy timeout on every connection, and each transaction starts with `BEGIN IMMEDIATE`
so writers queue on the busy timeout instead of failing mid-transaction: SQLite's single
write lock is what serialises `jobs.orchestration.states.transition` there (PostgreSQL uses row locks).
`upgrade_database` / `downgrade_database` run Alembic from any working directory.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from jobs.store.settings import Settings, get_settings

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000

_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def normalize_url(url: str) -> str:
    """`postgres://` and `postgresql://` mean psycopg 3 here (not psycopg2)."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def database_url(settings: Settings | None = None) -> str:
    return normalize_url((settings or get_settings()).resolved_database_url)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below)
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def json_text(value: Any) -> str:
    """A JSON column's text: orjson (a submit writes its spec, recipe and plan, a few KB,
    in a seventh of the standard library's time); the standard library for what orjson
    refuses (integers past 64 bits, keys of other types than str, int, float, bool, None)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(value)


def json_value(text: str | bytes) -> Any:
    """A JSON column's value. Stored numbers are int64-bounded (`jobs.recipe.load.bounds`), which
    orjson reads exactly; what it refuses (a `NaN` token in an old SQLite row) is read by
    the standard library."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """A new engine for `url` with tuneyard's connection settings (not cached)."""
    url = normalize_url(url)
    parsed = make_url(url)
    if "poolclass" not in kwargs and parsed.database != ":memory:":
        kwargs.setdefault("pool_size", 10)
        kwargs.setdefault("max_overflow", 30)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        kwargs.setdefault("json_serializer", json_text)
        kwargs.setdefault("json_deserializer", json_value)
        engine = create_engine(url, connect_args={"check_same_thread": False}, **kwargs)
        _configure_sqlite(engine)
        return engine
    kwargs.setdefault("json_serializer", json_text)
    kwargs.setdefault("json_deserializer", json_value)
    # A pooled connection is pinged when checked out: after a database restart the pool
    # connects afresh instead of answering a request with a dead connection's error.
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


POOL_SPARE = 4  # connections beyond the API's threadpool: its background loops, /metrics


def pool_size_for(settings: Settings) -> int:
    """Connections the pool keeps open: one per API thread and a few spare. A connection
    beyond `pool_size` is closed when it is handed back, so a pool smaller than the
    threadpool connects afresh (a new PostgreSQL backend) for a fraction of requests
    under load: ~90 new connections per 1,600 submits at 16 threads and a pool of 10."""
    return max(10, settings.api_threads + POOL_SPARE)


def get_engine(settings: Settings | None = None) -> Engine:
    """The process-wide engine for the configured database (one per URL)."""
    settings = settings or get_settings()
    url = database_url(settings)
    with _lock:
        if url not in _engines:
            _engines[url] = make_engine(url, pool_size=pool_size_for(settings))
        return _engines[url]


def dispose_engines() -> None:
    """Close every cached engine's pool (tests, forked workers)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


def session_factory(settings: Settings | None = None) -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(settings), expire_on_commit=False)


@contextmanager
def session_scope(settings: Settings | None = None) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = session_factory(settings)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def copy_rows(
    session: Session, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> None:
    """PostgreSQL's `COPY table (columns) FROM STDIN` on the session's connection, inside its
    transaction: bulk ingestion's fast path. SQLAlchemy has no COPY, so this is the one
    place tuneyard drives psycopg's connection itself."""
    cursor = session.connection().connection.driver_connection.cursor()
    with cursor, cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def is_postgresql(session_or_engine: Session | Engine) -> bool:
    bind = (
        session_or_engine.get_bind()
        if isinstance(session_or_engine, Session)
        else session_or_engine
    )
    return bind.dialect.name == "postgresql"


def alembic_config(url: str | None = None) -> Any:
    """An Alembic `Config` pointing at this repo's migrations, usable from any cwd."""
    from alembic.config import Config

    config = Config(str(MIGRATIONS_DIR.parent / "alembic.ini"))
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url:
        # ConfigParser interpolation: a literal % in a password must be doubled.
        config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


def upgrade_database(settings: Settings | None = None, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(database_url(settings)), revision)


def downgrade_database(settings: Settings | None = None, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(database_url(settings)), revision)


def wait_for_database(settings: Settings | None = None, timeout: float = 60.0) -> None:
    """Return once `SELECT 1` succeeds; raise TimeoutError after `timeout` seconds."""

    from sqlalchemy import text
    from sqlalchemy.pool import NullPool

    engine = make_engine(database_url(settings), poolclass=NullPool)
    deadline, last_error = time.monotonic() + timeout, "no attempt"
    try:
        while True:
            try:
                with engine.connect() as conn:
                    conn.execute(text("SELECT 1"))
                return
            except Exception as exc:  # the server is starting: refused, not accepting yet
                last_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            if time.monotonic() >= deadline:
                raise TimeoutError(f"database not reachable after {timeout:.0f}s ({last_error})")
            time.sleep(1.0)
    finally:
        engine.dispose()
