"""Reading metric records back: pages after a step cursor, the SSE id cursor, the latest
record of each job, and downsampling (`max_points`).

Downsampling cuts the steps into equal buckets and keeps, per bucket, the record with the
lowest and the one with the highest loss (val_loss for `val`) and the bucket's last record.
On PostgreSQL, for a whole run, one statement reads the rollup rows the triggers keep
(`tables.MetricRollup`, one per `ROLLUP_BLOCK` steps) and fetches the chosen records by
their unique (job, kind, step) index, so a 200k-step job costs ~4k small rows instead of
200k. A cursor (`after_step`), a span too short for whole blocks, or SQLite scan the
records themselves, still in SQL. Rows come back as plain dicts for the caller to serialise.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float, Select, and_, cast, func, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from jobs.recipe.metrics_sample import SAMPLE_FIELD_NAMES
from jobs.store.engine import is_postgresql
from jobs.store.tables import ROLLUP_BLOCK, Metric

METRIC_FIELDS = SAMPLE_FIELD_NAMES
METRIC_COLUMNS = (
    Metric.id,
    Metric.kind,
    Metric.attempt,
    *(getattr(Metric, n) for n in METRIC_FIELDS),
)
_COLUMN_LIST = ", ".join(c.key for c in METRIC_COLUMNS)
# One statement: the buckets' picks from the rollups, then those records by index.
_FROM_ROLLUPS = text(f"""
WITH b AS (
  SELECT (block * {ROLLUP_BLOCK} - :origin) / :width AS bucket,
         min_value, min_step, max_value, max_step, last_step
  FROM metric_rollups WHERE job_id = :job_id AND kind = :kind
), picks AS (
  (SELECT DISTINCT ON (bucket) min_step AS step FROM b WHERE min_value IS NOT NULL
   ORDER BY bucket, min_value, min_step)
  UNION
  (SELECT DISTINCT ON (bucket) max_step FROM b WHERE max_value IS NOT NULL
   ORDER BY bucket, max_value DESC, max_step)
  UNION
  (SELECT max(last_step) FROM b GROUP BY bucket)
)
SELECT {_COLUMN_LIST} FROM metrics
WHERE job_id = :job_id AND kind = :kind AND step IN (SELECT step FROM picks)
ORDER BY step
""")  # noqa: S608 (the column list is this module's constant)


def metric_dict(m: Metric) -> dict[str, Any]:
    return {
        "id": m.id,
        "kind": m.kind,
        "attempt": m.attempt,
        **{name: getattr(m, name) for name in METRIC_FIELDS},
    }


def _rows(session: Session, stmt: Any, params: dict[str, Any] | None = None) -> list[dict]:
    return [dict(row._mapping) for row in session.execute(stmt, params or {})]


def _base(job_id: str, kind: str, after_step: int | None) -> Select[Any]:
    stmt = select(*METRIC_COLUMNS).where(Metric.job_id == job_id, Metric.kind == kind)
    return stmt if after_step is None else stmt.where(Metric.step > after_step)


def metrics_page(
    session: Session, job_id: str, kind: str, after_step: int | None, limit: int
) -> list[dict[str, Any]]:
    """Raw records ascending by step, after the cursor (one range scan of the unique index;
    a poll with nothing new finds no row)."""
    return _rows(session, _base(job_id, kind, after_step).order_by(Metric.step).limit(limit))


def metrics_after_id(
    session: Session, job_id: str, kinds: list[str], after_id: int, limit: int = 500
) -> list[dict[str, Any]]:
    """Records inserted after row id `after_id` (the SSE cursor), in insertion order."""
    stmt = (
        select(*METRIC_COLUMNS)
        .where(Metric.job_id == job_id, Metric.kind.in_(kinds), Metric.id > after_id)
        .order_by(Metric.id)
        .limit(limit)
    )
    return _rows(session, stmt)


def latest_train_metrics(session: Session, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The last train record of each job (for progress in job listings)."""
    if not job_ids:
        return {}
    last = (
        select(Metric.job_id, func.max(Metric.step).label("step"))
        .where(Metric.job_id.in_(job_ids), Metric.kind == "train")
        .group_by(Metric.job_id)
        .subquery()
    )
    stmt = (
        select(Metric.job_id.label("job_id_"), *METRIC_COLUMNS)
        .join(last, and_(Metric.job_id == last.c.job_id, Metric.step == last.c.step))
        .where(Metric.kind == "train")
    )
    return {row.pop("job_id_"): row for row in _rows(session, stmt)}


def metrics_downsampled(
    session: Session, job_id: str, kind: str, after_step: int | None, max_points: int
) -> tuple[list[dict[str, Any]], bool]:
    """At most `max_points` records after the cursor, ascending by step; (records, downsampled)."""
    where = [Metric.job_id == job_id, Metric.kind == kind]
    if after_step is not None:
        where.append(Metric.step > after_step)
    # min/max of an indexed column are two index probes; steps are unique per job and kind,
    # so a span no wider than max_points cannot hold more records than that.
    lo, hi = session.execute(
        select(func.min(Metric.step), func.max(Metric.step)).where(*where)
    ).one()
    if lo is None or hi - lo + 1 <= max_points:
        return metrics_page(session, job_id, kind, after_step, max_points), False
    buckets = max_points // 3
    if buckets == 0:  # room for the last records only
        tail = _base(job_id, kind, after_step).order_by(Metric.step.desc()).limit(max_points)
        return list(reversed(_rows(session, tail))), True
    origin = lo - lo % ROLLUP_BLOCK
    width = -(-(hi - origin + 1) // buckets)
    if after_step is None and width >= ROLLUP_BLOCK and is_postgresql(session):
        width = -(-width // ROLLUP_BLOCK) * ROLLUP_BLOCK  # whole blocks per bucket
        params = {"job_id": job_id, "kind": kind, "origin": origin, "width": width}
        return _rows(session, _FROM_ROLLUPS, params), True
    width = -(-(hi - lo + 1) // buckets)
    steps = _picked_steps(session, job_id, kind, after_step, lo, width)
    stmt = _base(job_id, kind, None).where(Metric.step.in_(sorted(steps))).order_by(Metric.step)
    return _rows(session, stmt), True


def _picked_steps(
    session: Session, job_id: str, kind: str, after_step: int | None, lo: int, width: int
) -> set[int]:
    """Each bucket's steps with the lowest and highest loss, and its last step, scanning the
    records. PostgreSQL compares arrays, so min/max of [loss, step] carry the step along;
    SQLite returns a bare column from the row a lone min() or max() picked."""
    value = Metric.val_loss if kind == "val" else Metric.loss
    bucket = (Metric.step - lo) // width
    where = [Metric.job_id == job_id, Metric.kind == kind]
    if after_step is not None:
        where.append(Metric.step > after_step)
    steps = set(session.scalars(select(func.max(Metric.step)).where(*where).group_by(bucket)))
    where.append(value.is_not(None))
    if is_postgresql(session):
        pair = postgresql.array([value, cast(Metric.step, Float)])
        stmt = select(func.min(pair), func.max(pair)).where(*where).group_by(bucket)
        return steps | {int(p[1]) for row in session.execute(stmt) for p in row}
    for extreme in (func.min, func.max):
        stmt = select(Metric.step, extreme(value)).where(*where).group_by(bucket)
        steps.update(step for step, _ in session.execute(stmt))
    return steps
