"""The store's job queries (create, replay, downsampling, cursors) on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import insert

from jobs.store import metric_reads as reads
from jobs.store import queries as store
from jobs.store.tables import Metric


def _job(session, project) -> str:
    job, _ = store.create_job(
        session,
        project.id,
        store.NewJob("j", spec={}, recipe={}, plan={}, resources={}, queue="cpu"),
    )
    session.commit()
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
    """A key used before is found by the unique constraint: the same body answers the stored
    job, another is a conflict, and nothing new is stored either way."""
    from sqlalchemy import func, select

    from jobs.store.tables import Job

    new = store.NewJob(
        name="j", spec={"a": 1}, recipe={}, plan={}, resources={}, queue="cpu",
        idempotency_key=f"k-{uuid.uuid4().hex[:8]}", request_hash=store.request_hash({"a": 1}),
    )  # fmt: skip
    first, created = store.create_job(session, project.id, new)
    session.commit()
    again, created_again = store.create_job(session, project.id, new)
    assert created and not created_again and again.id == first.id
    new.request_hash = store.request_hash({"a": 2})
    with pytest.raises(store.IdempotencyConflict):
        store.create_job(session, project.id, new)
    count = select(func.count()).select_from(Job).where(Job.project_id == project.id)
    assert session.scalar(count) == 1


def test_cursor_rejects_forgeries() -> None:
    for bad in ("", "zzz", "W10", "WyIyMDI2LTAxLTAxIiwgIngiXQ"):
        with pytest.raises(ValueError):
            store.decode_cursor(bad)


def test_create_job_adds_the_job_and_its_event_to_the_callers_transaction(
    migrated_engine, session, project
) -> None:
    """Nothing is visible to another connection until the caller commits; then the job and
    its `submitted` event both are. A rollback keeps neither."""
    from sqlalchemy import select
    from sqlalchemy.orm import sessionmaker

    from jobs.store.tables import Job, JobEvent

    other = sessionmaker(bind=migrated_engine)
    new = store.NewJob(name="a", spec={}, recipe={}, plan={}, resources={}, queue="cpu")
    kept, created = store.create_job(session, project.id, new)
    assert created and session.in_transaction()
    session.commit()
    kept_id = kept.id
    dropped_id = store.create_job(session, project.id, new)[0].id
    session.rollback()
    with other() as reader:
        assert reader.get(Job, kept_id).status == "queued"
        events = reader.scalars(select(JobEvent).where(JobEvent.job_id == kept_id)).all()
        assert [(e.kind, e.to_status) for e in events] == [("submitted", "queued")]
        assert reader.get(Job, dropped_id) is None


def test_a_concurrent_twin_on_one_idempotency_key_answers_the_winners_job(
    migrated_engine, project, monkeypatch
) -> None:
    """Two sessions create with one key, the twin after the winner committed: its insert hits
    the unique constraint and it answers the winner's job, looking the key up once (after
    the refusal, not before the insert)."""
    from sqlalchemy.orm import sessionmaker

    factory = sessionmaker(bind=migrated_engine, expire_on_commit=False)
    key = f"twin-{uuid.uuid4().hex[:8]}"
    hashed = store.request_hash({"a": 1})

    def twin(name: str) -> store.NewJob:
        return store.NewJob(
            name=name, spec={}, recipe={}, plan={}, resources={}, queue="cpu",
            idempotency_key=key, request_hash=hashed,
        )  # fmt: skip

    with factory() as first:
        winner, created = store.create_job(first, project.id, twin("a"))
        first.commit()
    looks: list[str] = []
    original = store.find_by_idempotency_key
    monkeypatch.setattr(
        store, "find_by_idempotency_key", lambda *a: looks.append(a[2]) or original(*a)
    )
    with factory() as second:
        answer, created_again = store.create_job(second, project.id, twin("b"))
    assert created and not created_again and answer.id == winner.id
    assert looks == [key]
