"""Idempotent writes of what the trainer produced: metrics, trainer events, checkpoints, logs.

Every function here can be called again with the same input without changing the result,
which is what lets the worker re-read its files after a restart or a database outage:
metrics upsert on (job, kind, step), a later attempt's sample replacing an earlier one's
(a resumed run re-does the steps after its checkpoint); checkpoints upsert on (job, step)
(and enqueue `checkpoint.published` once per job, attempt and step: `jobs.store.webhooks`);
trainer events are keyed by their byte offset in `events.jsonl`; log lines by (job,
attempt, stream, seq). The caller owns the transaction and fences it first
(`jobs.store.leases.holds_lease`).
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from jobs.recipe.metrics_sample import FLOAT_FIELDS, INT_FIELDS, METRIC_KINDS
from jobs.store.engine import copy_rows, is_postgresql
from jobs.store.tables import Checkpoint, JobEvent, JobLog, Metric
from jobs.store.webhooks import enqueue_checkpoint_events

TRAINER_EVENT = "trainer"
METRIC_KEY = ("job_id", "kind", "step")
METRIC_INTS = tuple(name for name in INT_FIELDS if name != "step")
METRIC_VALUES = ("attempt", *METRIC_INTS, *FLOAT_FIELDS)  # what a replayed sample replaces
METRIC_COLUMNS = (*METRIC_KEY, *METRIC_VALUES)
COPY_THRESHOLD = 200  # rows; smaller batches (the live case) take the plain upsert


def _insert(session: Session, table: Any) -> Any:
    if is_postgresql(session):
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) else None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def metric_row(job_id: str, attempt: int, record: dict[str, Any]) -> dict[str, Any] | None:
    """The metrics-table row for one MetricsSample line, or None if it is not one."""
    kind, step = record.get("kind"), _as_int(record.get("step"))
    if kind not in METRIC_KINDS or step is None:
        return None
    row: dict[str, Any] = {"job_id": job_id, "attempt": attempt, "kind": kind, "step": step}
    for name in METRIC_INTS:
        row[name] = _as_int(record.get(name))
    for name in FLOAT_FIELDS:
        row[name] = _as_float(record.get(name))
    return row


def upsert_metrics(
    session: Session, job_id: str, attempt: int, records: list[dict[str, Any]]
) -> int:
    """Upsert MetricsSample records; returns how many rows were given to the database."""
    rows = {}
    for record in records:
        row = metric_row(job_id, attempt, record)
        if row is not None:
            rows[(row["kind"], row["step"])] = row  # last line for a step wins within a batch
    if not rows:
        return 0
    if len(rows) >= COPY_THRESHOLD and is_postgresql(session):
        _copy_upsert_metrics(session, list(rows.values()))
        return len(rows)
    stmt = _insert(session, Metric.__table__)
    changed = {c: stmt.excluded[c] for c in METRIC_VALUES}
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "kind", "step"],
        set_=changed,
        where=Metric.__table__.c.attempt <= stmt.excluded.attempt,
    )
    session.connection().execute(stmt, list(rows.values()))
    return len(rows)


def _copy_upsert_metrics(session: Session, rows: list[dict[str, Any]]) -> None:
    """PostgreSQL bulk path: COPY into a session-local staging table, then one upsert."""
    cols = ", ".join(METRIC_COLUMNS)
    updates = ", ".join(f"{c} = excluded.{c}" for c in METRIC_COLUMNS if c not in METRIC_KEY)
    session.execute(
        text(
            "CREATE TEMP TABLE IF NOT EXISTS tuneyard_metrics_stage ON COMMIT DELETE ROWS AS "
            f"SELECT {cols} FROM metrics WITH NO DATA"
        )
    )
    session.execute(text("TRUNCATE tuneyard_metrics_stage"))
    copy_rows(
        session,
        "tuneyard_metrics_stage",
        METRIC_COLUMNS,
        ([row[c] for c in METRIC_COLUMNS] for row in rows),
    )
    session.execute(
        text(
            f"INSERT INTO metrics ({cols}) SELECT {cols} FROM tuneyard_metrics_stage "
            f"ON CONFLICT (job_id, kind, step) DO UPDATE SET {updates} "
            "WHERE metrics.attempt <= excluded.attempt"
        )
    )


def record_trainer_events(
    session: Session, job_id: str, attempt: int, events: list[tuple[int, dict[str, Any]]]
) -> int:
    """Store trainer lifecycle events (offset, record) as job events, once per offset."""
    if not events:
        return 0
    seen = {
        (data or {}).get("file_offset")
        for data in session.execute(
            select(JobEvent.data).where(JobEvent.job_id == job_id, JobEvent.kind == TRAINER_EVENT)
        ).scalars()
    }
    added = 0
    for offset, record in events:
        if offset in seen:
            continue
        name = str(record.get("event", "unknown"))
        step = record.get("step")
        message = f"{name} at step {step}" if step is not None else name
        if record.get("message"):
            message += f": {record['message']}"
        data = {**record, "file_offset": offset}
        session.add(
            JobEvent(job_id=job_id, attempt=attempt, kind=TRAINER_EVENT, message=message, data=data)
        )
        added += 1
    session.flush()
    return added


def upsert_checkpoints(
    session: Session, job_id: str, attempt: int, events: list[dict[str, Any]]
) -> int:
    """Register `checkpoint_saved` events as checkpoint rows (one per job and step)."""
    rows = {}
    for record in events:
        step = _as_int(record.get("step"))
        if record.get("event") != "checkpoint_saved" or step is None or not record.get("path"):
            continue
        rows[step] = {
            "job_id": job_id,
            "attempt": attempt,
            "step": step,
            "path": str(record["path"]),
            "size_bytes": _as_int(record.get("size_bytes")),
            "metrics": record.get("metrics") if isinstance(record.get("metrics"), dict) else {},
        }
    if not rows:
        return 0
    stmt = _insert(session, Checkpoint.__table__)
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "step"],
        set_={c: stmt.excluded[c] for c in ("attempt", "path", "size_bytes", "metrics")},
    )
    session.connection().execute(stmt, list(rows.values()))
    enqueue_checkpoint_events(session, job_id, attempt, list(rows.values()))
    return len(rows)


def append_logs(
    session: Session, job_id: str, attempt: int, lines: list[tuple[str, int, str]]
) -> int:
    """Insert (stream, seq, text) log lines; a line already stored is skipped."""
    if not lines:
        return 0
    rows = [
        {"job_id": job_id, "attempt": attempt, "stream": stream[:16], "seq": seq, "text": text}
        for stream, seq, text in lines
    ]
    stmt = (
        _insert(session, JobLog)
        .values(rows)
        .on_conflict_do_nothing(index_elements=["job_id", "attempt", "stream", "seq"])
    )
    session.execute(stmt)
    return len(rows)
