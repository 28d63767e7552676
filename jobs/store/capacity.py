"""What a queue can hold and how fast it runs, read from its workers and its finished jobs.

`queue_device_memory` is the smallest device memory the queue's live workers advertise in
their heartbeat (`device_memory_bytes`): a job is refused at submit when its estimate
cannot fit there, since any of those workers may claim it. `queue_flops_per_rank` is the
throughput the queue has shown: for each of its last succeeded jobs, the median measured
tokens/s per rank of its train steps (the first step, which pays for warm-up, left out)
times the FLOPs per token its plan estimated; the median over those jobs. None when the
queue has no live worker that says its memory, or no finished job to learn from.
`CapacityCache` keeps both per queue for a few seconds: the API asks on every submit.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.store.status import LIVE_WORKERS, JobStatus
from jobs.store.tables import Job, Metric, Worker, utcnow

LEARN_FROM_JOBS = 20  # the most recent succeeded jobs of a queue


def queue_device_memory(session: Session, queue: str, fresh_after: datetime) -> int | None:
    """The smallest `device_memory_bytes` the live workers of `queue` advertise."""
    rows = session.execute(
        select(Worker.queue, Worker.resources).where(
            Worker.last_heartbeat >= fresh_after, Worker.status.in_(LIVE_WORKERS)
        )
    ).all()
    sizes = [
        int(memory)
        for queues, resources in rows
        if queue in (resources or {}).get("queues", (queues or "").split(","))
        for memory in [(resources or {}).get("device_memory_bytes")]
        if isinstance(memory, int) and not isinstance(memory, bool) and memory > 0
    ]
    return min(sizes) if sizes else None


def _flops_per_token(plan: dict[str, Any] | None) -> float | None:
    estimate = (plan or {}).get("estimate") or {}
    value = estimate.get("flops_per_token")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def queue_flops_per_rank(session: Session, queue: str) -> float | None:
    """Measured FLOP/s per rank of the queue's recent succeeded jobs (median), or None.

    Asked on every submit, so it stays cheap: each job contributes the median of its last
    `STEPS_PER_JOB` train steps (one indexed range read, however long the job ran), and
    the answer is kept per queue until another of its jobs succeeds (one aggregate query
    tells).
    """
    version = session.execute(
        select(func.count(), func.max(Job.finished_at)).where(
            Job.queue == queue, Job.status == JobStatus.SUCCEEDED.value
        )
    ).one()
    key = (str(session.get_bind().engine.url), queue)
    cached = _RATE_CACHE.get(key)
    if cached is not None and cached[0] == tuple(version):
        return cached[1]
    rate = _measured_rate(session, queue) if version[0] else None
    if len(_RATE_CACHE) > 1024:
        _RATE_CACHE.clear()
    _RATE_CACHE[key] = (tuple(version), rate)
    return rate


STEPS_PER_JOB = 256
_RATE_CACHE: dict[tuple[str, str], tuple[tuple[Any, ...], float | None]] = {}


def _measured_rate(session: Session, queue: str) -> float | None:
    jobs = session.execute(
        select(Job.id, Job.plan)
        .where(Job.queue == queue, Job.status == JobStatus.SUCCEEDED.value)
        .order_by(Job.finished_at.desc())
        .limit(LEARN_FROM_JOBS)
    ).all()
    rates = []
    for job_id, plan in jobs:
        per_token = _flops_per_token(plan)
        if per_token is None:
            continue
        tps = (
            session.execute(
                select(Metric.tps_per_rank)
                .where(
                    Metric.job_id == job_id,
                    Metric.kind == "train",
                    Metric.step > 1,
                    Metric.tps_per_rank.is_not(None),
                )
                .order_by(Metric.step.desc())
                .limit(STEPS_PER_JOB)
            )
            .scalars()
            .all()
        )
        if tps:
            rates.append(per_token * statistics.median(tps))
    return statistics.median(rates) if rates else None


class CapacityCache:
    """`(queue_device_memory, queue_flops_per_rank)` per queue, read at most once per `ttl`
    seconds. Both change only when a worker joins, leaves or re-advertises, or a job of the
    queue succeeds; a submit sees such a change at most `ttl` seconds late, and the reads
    (a scan of the live workers, an aggregate over the queue's succeeded jobs) leave the
    submit path. `ttl <= 0` reads every time."""

    MAX_QUEUES = 1024

    def __init__(
        self, ttl: float, live_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl, self.live_seconds, self._clock = ttl, live_seconds, clock
        self._entries: dict[str, tuple[float, tuple[int | None, float | None]]] = {}

    def get(self, session: Session, queue: str) -> tuple[int | None, float | None]:
        now = self._clock()
        hit = self._entries.get(queue)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        fresh_after = utcnow() - timedelta(seconds=self.live_seconds)
        value = (
            queue_device_memory(session, queue, fresh_after),
            queue_flops_per_rank(session, queue),
        )
        if len(self._entries) >= self.MAX_QUEUES:
            self._entries.clear()
        self._entries[queue] = (now, value)
        return value
