"""A pooled PostgreSQL connection whose backend died (a database restart, an idle-session
kill) is replaced on checkout (`pool_pre_ping`), and the pool holds a connection per API
thread."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from jobs.store import engine as engines


@pytest.fixture
def pg_engine(monkeypatch):
    from pg_databases import create_pg_database, drop_pg_database

    url = create_pg_database()
    engine = engines.make_engine(url, pool_size=1, max_overflow=0)
    try:
        yield engine
    finally:
        engine.dispose()
        drop_pg_database(url)


def _backend_pid(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT pg_backend_pid()")).scalar()


def test_a_dead_pooled_connection_is_replaced_on_checkout(pg_engine):
    first = _backend_pid(pg_engine)
    admin = engines.make_engine(pg_engine.url.render_as_string(hide_password=False))
    try:
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
            conn.commit()
    finally:
        admin.dispose()
    second = _backend_pid(pg_engine)
    assert second != first


def test_the_pool_keeps_a_connection_per_api_thread(monkeypatch):
    """Every API thread holding a connection at once, twice over: the second round reuses
    the first round's connections (a pool smaller than the threadpool closes the extras on
    check-in and connects afresh the next time)."""
    import threading

    from pg_databases import create_pg_database, drop_pg_database
    from sqlalchemy import event

    from jobs.store.settings import Settings

    url = create_pg_database()
    settings = Settings(database_url=url, api_threads=16)
    assert engines.pool_size_for(settings) >= 16
    monkeypatch.setattr(engines, "_engines", {})
    engine = engines.get_engine(settings)
    connects: list[int] = []
    event.listen(engine, "connect", lambda *_: connects.append(1))
    try:
        for _ in range(2):
            barrier = threading.Barrier(16)

            def hold(barrier: threading.Barrier) -> None:
                with engine.connect() as conn:
                    conn.execute(text("SELECT 1"))
                    barrier.wait(timeout=30)

            threads = [threading.Thread(target=hold, args=(barrier,)) for _ in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert len(connects) == 16
    finally:
        engine.dispose()
        drop_pg_database(url)
