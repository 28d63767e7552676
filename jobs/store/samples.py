"""Which dataset rows made each step: ingestion of the trainer's `samples.jsonl`, and reads.

The file has two line kinds (`trainer.sample_log`): `step` lines (the rows of one step,
indices and the dataset's own ids) and `row` lines (one preview per dataset index). Step
lines upsert on (job, step) fenced by attempt like metrics: a resumed attempt's rows
replace the earlier attempt's for the steps it re-ran, an older attempt's replay never
overwrites a newer one's (a line names the attempt whose trainer wrote it, so a line
of an interrupted attempt that the next attempt's worker ingests keeps its number, never
more than the ingesting attempt), and within one attempt the last line wins (a step re-run after a
divergence rollback). Row previews insert once per (job, index). The caller owns the
transaction and fences it first, as for every ingestion.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.store.ingest import _as_int, _insert
from jobs.store.tables import DatasetRow, StepSample

MAX_ROWS_PER_STEP = 100_000  # a step line beyond this is cut (bounded input)
MAX_PREVIEW_CHARS = 1000


def _step_row(job_id: str, attempt: int, record: dict[str, Any]) -> dict[str, Any] | None:
    step, rows = _as_int(record.get("step")), record.get("rows")
    if step is None or not isinstance(rows, list):
        return None
    written_by = _as_int(record.get("attempt"))
    if written_by is not None and 0 <= written_by < attempt:
        attempt = written_by  # an earlier attempt's trainer wrote it (ingested late)
    clean = [r for r in rows[:MAX_ROWS_PER_STEP] if isinstance(r, dict) and "index" in r]
    return {
        "job_id": job_id,
        "attempt": attempt,
        "step": step,
        "epoch": _as_int(record.get("epoch")),
        "rows": {"rows": clean},
    }


def _preview_row(job_id: str, record: dict[str, Any]) -> dict[str, Any] | None:
    index = _as_int(record.get("index"))
    if index is None:
        return None
    preview = record.get("preview")
    row_id = record.get("id")
    return {
        "job_id": job_id,
        "row_index": index,
        "row_id": None if row_id is None else str(row_id)[:256],
        "tokens": _as_int(record.get("tokens")),
        "preview": str(preview)[:MAX_PREVIEW_CHARS] if preview is not None else None,
    }


def ingest_samples(
    session: Session, job_id: str, attempt: int, records: list[dict[str, Any]]
) -> int:
    """Upsert step lines and insert new row previews; returns the step rows given."""
    steps: dict[int, dict[str, Any]] = {}
    previews: dict[int, dict[str, Any]] = {}
    for record in records:
        if record.get("kind") == "step" and (row := _step_row(job_id, attempt, record)):
            steps[row["step"]] = row  # the last line for a step wins within a batch
        elif record.get("kind") == "row" and (row := _preview_row(job_id, record)):
            previews.setdefault(row["row_index"], row)
    if previews:
        stmt = _insert(session, DatasetRow.__table__).on_conflict_do_nothing(
            index_elements=["job_id", "row_index"]
        )
        session.connection().execute(stmt, list(previews.values()))
    if steps:
        stmt = _insert(session, StepSample.__table__)
        stmt = stmt.on_conflict_do_update(
            index_elements=["job_id", "step"],
            set_={c: stmt.excluded[c] for c in ("attempt", "epoch", "rows")},
            where=StepSample.__table__.c.attempt <= stmt.excluded.attempt,
        )
        session.connection().execute(stmt, list(steps.values()))
    return len(steps)


def step_samples(session: Session, job_id: str, step: int) -> dict[str, Any] | None:
    """The rows of one step with their previews, or None when the step has none stored."""
    sample = session.execute(
        select(StepSample).where(StepSample.job_id == job_id, StepSample.step == step)
    ).scalar_one_or_none()
    if sample is None:
        return None
    rows = list((sample.rows or {}).get("rows") or [])
    indices = sorted({int(r["index"]) for r in rows})
    previews = {
        p.row_index: p
        for p in session.execute(
            select(DatasetRow).where(DatasetRow.job_id == job_id, DatasetRow.row_index.in_(indices))
        ).scalars()
    }
    data = []
    for row in rows:
        preview = previews.get(int(row["index"]))
        data.append(
            {
                "index": int(row["index"]),
                "id": row.get("id", preview.row_id if preview else None),
                "dp_rank": row.get("dp_rank"),
                "micro_batch": row.get("micro_batch"),
                "tokens": preview.tokens if preview else None,
                "preview": preview.preview if preview else None,
            }
        )
    return {"step": sample.step, "epoch": sample.epoch, "attempt": sample.attempt, "data": data}
