"""The store's job queries (create, replay, downsampling, cursors) on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import insert

from jobs.store import metric_reads as reads
from jobs.store import queries as store
from jobs.store.tables import Metric


def _job(session, project) -> str:
    job, _ = store.create_job(session, project.id, store.NewJob(
        name="j", spec={}, recipe={}, plan={}, resources={}, queue="cpu"))  # fmt: skip
    return job.id


def _metrics(session, job_id: str, rows: list[dict]) -> None:
    session.execute(insert(Metric), [{"job_id": job_id, "attempt": 1, **r} for r in rows])
    session.commit()


def test_downsampling_val_kind_after_cursor_and_null_losses(session, project) -> None:
    job_id = _job(session, project)
    rows = [{"kind": "val", "step": s, "val_loss": float(s % 9)} for s in range(1, 301)]
    rows += [{"kind": "train", "step": s, "loss": None} for s in range(1, 301)]
    _metrics(session, job_id, rows)
    got, downsampled = reads.metrics_downsampled(session, job_id, "val", 100, 21)
    steps = [r["step"] for r in got]
    assert downsampled and len(steps) <= 21 and steps[0] > 100 and steps[-1] == 300
    assert {r["val_loss"] for r in got} >= {0.0, 8.0}
    nulls, _ = reads.metrics_downsampled(session, job_id, "train", None, 11)
    # No loss to rank: each of the 3 buckets keeps its last record only.
    assert len(nulls) == 3 and nulls[-1]["step"] == 300
    none, downsampled = reads.metrics_downsampled(session, str(uuid.uuid4()), "train", None, 10)
    assert none == [] and not downsampled


def test_create_job_replays_and_conflicts(session, project) -> None:
    new = store.NewJob(name="j", spec={"a": 1}, recipe={}, plan={}, resources={}, queue="cpu",
                       idempotency_key="k1", request_hash=store.request_hash({"a": 1}))  # fmt: skip
    first, created = store.create_job(session, project.id, new)
    again, created_again = store.create_job(session, project.id, new)
    assert created and not created_again and again.id == first.id
    new.request_hash = store.request_hash({"a": 2})
    with pytest.raises(store.IdempotencyConflict):
        store.create_job(session, project.id, new)


def test_cursor_rejects_forgeries() -> None:
    for bad in ("", "zzz", "W10", "WyIyMDI2LTAxLTAxIiwgIngiXQ"):
        with pytest.raises(ValueError):
            store.decode_cursor(bad)


def test_a_guarded_create_checks_the_key_and_the_grant(session, project) -> None:
    """In a transaction (Core's path on PostgreSQL; SQLite's check-then-write) the guard
    refuses a revoked key, another project's and a changed grant, and writes nothing."""
    from sqlalchemy import func, select

    from jobs.store.api_keys import KeyGuard, create_api_key, hash_key, revoke_api_key
    from jobs.store.tables import Job, JobEvent

    key, raw = create_api_key(session, project.name, "submit")
    session.commit()
    new = store.NewJob(name="g", spec={}, recipe={}, plan={}, resources={}, queue="cpu")
    guard = KeyGuard(hash_key(raw), project.id, False)
    job, created = store.create_job(session, project.id, new, guard=guard)
    assert created and session.get(Job, job.id) is not None

    def refused(guard: KeyGuard) -> None:
        jobs = session.scalar(select(func.count()).select_from(Job))
        events = session.scalar(select(func.count()).select_from(JobEvent))
        with pytest.raises(store.KeyRefused):
            store.create_job(session, guard.project_id, new, guard=guard)
        assert session.scalar(select(func.count()).select_from(Job)) == jobs
        assert session.scalar(select(func.count()).select_from(JobEvent)) == events

    refused(KeyGuard(guard.key_hash, project.id, True))  # the grant validation assumed
    refused(KeyGuard(guard.key_hash, project.id + 1000, False))  # another project
    refused(KeyGuard(hash_key(raw + "x"), project.id, False))  # no such key
    revoke_api_key(session, key.id)
    session.commit()
    refused(guard)


def test_a_create_on_an_autocommit_connection_begins_no_session_transaction(
    migrated_engine, session, project
) -> None:
    """The API's `read_session` on PostgreSQL: the one insert statement is the whole
    transaction, so the session begins none around it; an ordinary session (and SQLite's
    `read_session`) begins one and commits the job in it."""
    from sqlalchemy import event
    from sqlalchemy.orm import sessionmaker

    from api.deps import read_session
    from jobs.store.tables import Job

    begun: list[bool] = []
    factory = sessionmaker(bind=migrated_engine, expire_on_commit=False)
    new = store.NewJob(name="a", spec={}, recipe={}, plan={}, resources={}, queue="cpu")
    with read_session(factory) as reading:
        event.listen(reading, "after_begin", lambda *_: begun.append(True))
        job, created = store.create_job(reading, project.id, new, looked_up=True)
        assert created and not reading.in_transaction()
    assert begun == ([] if migrated_engine.dialect.name == "postgresql" else [True])
    assert session.get(Job, job.id).name == "a"  # committed, seen from another connection
    session.commit()
    event.listen(session, "after_begin", lambda *_: begun.append(True))
    begun.clear()
    store.create_job(session, project.id, new)
    assert begun == [True] and not session.in_transaction()
