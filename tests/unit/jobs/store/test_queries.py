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
