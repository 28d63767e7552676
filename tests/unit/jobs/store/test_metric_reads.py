"""Metric reads: the rollup-served downsampling on PostgreSQL picks exactly each bucket's
lowest, highest and last record, stays right after replays (upserts) and COPY-sized
batches, and agrees with the record scan on what it keeps."""

from __future__ import annotations

import math
import random

import pytest
from sqlalchemy import insert, select, update

from jobs.store import metric_reads as reads
from jobs.store import queries as store
from jobs.store.tables import ROLLUP_BLOCK, Metric, MetricRollup


def _job(session, project) -> str:
    job, _ = store.create_job(session, project.id, store.NewJob(
        name="j", spec={}, recipe={}, plan={}, resources={}, queue="cpu"))  # fmt: skip
    return job.id


def _expected(losses: dict[int, float | None], max_points: int) -> list[int]:
    """The same buckets the rollup path uses, computed in Python from every record."""
    lo, hi, buckets = min(losses), max(losses), max_points // 3
    origin = lo - lo % ROLLUP_BLOCK
    width = math.ceil(math.ceil((hi - origin + 1) / buckets) / ROLLUP_BLOCK) * ROLLUP_BLOCK
    picked: set[int] = set()
    by_bucket: dict[int, list[int]] = {}
    for step in sorted(losses):
        by_bucket.setdefault((step - origin) // width, []).append(step)
    for steps in by_bucket.values():
        valued = [s for s in steps if losses[s] is not None]
        picked.add(steps[-1])
        if valued:
            picked |= {min(valued, key=losses.get), max(valued, key=losses.get)}
    return sorted(picked)


@pytest.fixture
def pg_only(session):
    if session.get_bind().dialect.name != "postgresql":
        pytest.skip("rollups are kept by PostgreSQL triggers")


def test_rollup_downsampling_picks_each_buckets_extremes_and_last(session, project, pg_only):
    job_id, rng = _job(session, project), random.Random(7)
    losses: dict[int, float | None] = {
        s: (None if s % 97 == 0 else rng.random()) for s in range(3, 20_004)
    }
    rows = [{"job_id": job_id, "attempt": 1, "kind": "train", "step": s, "loss": v}
            for s, v in losses.items()]  # fmt: skip
    for start in range(0, len(rows), 5000):  # several statements, like ingestion batches
        session.execute(insert(Metric), rows[start : start + 5000])
    session.commit()
    got, downsampled = reads.metrics_downsampled(session, job_id, "train", None, 300)
    assert downsampled and len(got) <= 300
    assert [r["step"] for r in got] == _expected(losses, 300)
    # A replay rewrites values (an upsert's UPDATE): the rollups follow.
    for step in (10, 5_000, 15_000):
        losses[step] = -1.0 - step
    session.execute(update(Metric).where(Metric.job_id == job_id, Metric.step.in_([10, 5_000,
                    15_000])).values(loss=-1.0 - Metric.step))  # fmt: skip
    session.commit()
    got, _ = reads.metrics_downsampled(session, job_id, "train", None, 300)
    assert [r["step"] for r in got] == _expected(losses, 300)
    blocks = session.scalar(select(MetricRollup.block).where(MetricRollup.job_id == job_id)
                            .order_by(MetricRollup.block.desc()).limit(1))  # fmt: skip
    assert blocks == 20_003 // ROLLUP_BLOCK


def test_ties_go_to_the_lowest_step(session, project, pg_only):
    job_id = _job(session, project)
    losses = {s: float(s % 5) for s in range(1, 3_001)}  # many equal values in each block
    session.execute(insert(Metric), [{"job_id": job_id, "attempt": 1, "kind": "train",
                                      "step": s, "loss": v} for s, v in losses.items()])  # fmt: skip
    session.commit()
    got, _ = reads.metrics_downsampled(session, job_id, "train", None, 90)
    assert [r["step"] for r in got] == _expected(losses, 90)


def test_scan_path_keeps_the_same_kind_of_points(session, project):
    job_id = _job(session, project)
    rows = [{"job_id": job_id, "attempt": 1, "kind": "val", "step": s, "val_loss": float(s % 13)}
            for s in range(1, 2_001)]  # fmt: skip
    session.execute(insert(Metric), rows)
    session.commit()
    got, downsampled = reads.metrics_downsampled(session, job_id, "val", 0, 90)
    steps = [r["step"] for r in got]
    assert downsampled and len(steps) <= 90 and steps == sorted(steps) and steps[-1] == 2_000
    assert {r["val_loss"] for r in got} >= {0.0, 12.0}


def test_page_and_latest_return_plain_rows(session, project):
    job_id = _job(session, project)
    session.execute(insert(Metric), [{"job_id": job_id, "attempt": 1, "kind": "train",
                                      "step": s, "loss": 1.0 / s} for s in range(1, 11)])  # fmt: skip
    session.commit()
    page = reads.metrics_page(session, job_id, "train", 8, 100)
    assert [r["step"] for r in page] == [9, 10] and isinstance(page[0], dict)
    assert reads.metrics_page(session, job_id, "train", 10, 100) == []
    assert reads.latest_train_metrics(session, [job_id])[job_id]["step"] == 10
