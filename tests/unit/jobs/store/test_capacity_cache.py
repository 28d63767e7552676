"""The API's per-queue capacity cache: a read is kept for `ttl` seconds, then read again;
a ttl of 0 reads every time; each queue is kept apart."""

from __future__ import annotations

import uuid

from jobs.store.capacity import CapacityCache
from jobs.store.leases import record_heartbeat


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _worker(session, queue: str, memory: int) -> None:
    resources = {"queues": [queue], "packages": [], "device_memory_bytes": memory}
    record_heartbeat(session, f"w-{uuid.uuid4().hex[:8]}", queue, resources, "online")
    session.commit()


def test_a_read_is_kept_for_the_ttl_then_read_again(session):
    queue, clock = f"gpu-q{uuid.uuid4().hex[:6]}", Clock()
    cache = CapacityCache(ttl=2.0, live_seconds=30.0, clock=clock)
    assert cache.get(session, queue) == (None, None)  # no worker has said its memory
    _worker(session, queue, 80 << 30)
    clock.now += 1.9
    assert cache.get(session, queue) == (None, None)  # within the ttl: the kept answer
    clock.now += 0.2
    assert cache.get(session, queue) == (80 << 30, None)
    _worker(session, queue, 24 << 30)  # the smallest device decides
    clock.now += 2.5
    assert cache.get(session, queue) == (24 << 30, None)


def test_ttl_zero_reads_every_time_and_queues_are_kept_apart(session):
    first, second = (f"gpu-q{uuid.uuid4().hex[:6]}" for _ in range(2))
    cache = CapacityCache(ttl=0, live_seconds=30.0, clock=Clock())
    assert cache.get(session, first) == (None, None)
    _worker(session, first, 40 << 30)
    assert cache.get(session, first) == (40 << 30, None)
    assert cache.get(session, second) == (None, None)
