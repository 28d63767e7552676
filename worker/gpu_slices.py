"""Splitting a worker's GPUs between the jobs it runs at once (`tuneyard worker -c N`).

Each CUDA job asks `nproc_per_node` GPUs; the worker hands it its own slice of the
inventory (lowest free ids first) as `CUDA_VISIBLE_DEVICES`, and takes the slice back when
the attempt ends. A job that does not fit the free GPUs is not claimed: the pool thread
waits up to `gpu_wait_seconds` for a slice to free up, then sends the job's message back
to its queue so any worker (this one later, or another) can take it. CPU jobs and workers
without GPUs use no slice. A job that asks more GPUs than the worker has gets all of them,
as before slicing (its queue should not route it here; torchrun then reports the mismatch).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class GpuSlices:
    def __init__(self, inventory: tuple[int, ...]) -> None:
        self.inventory = tuple(inventory)
        self._held: dict[str, tuple[int, ...]] = {}
        self._users: dict[str, int] = {}  # a duplicate message shares its job's slice
        self._freed = threading.Condition()

    def free(self) -> tuple[int, ...]:
        with self._freed:
            return self._free_locked()

    def _free_locked(self) -> tuple[int, ...]:
        taken = {gpu for ids in self._held.values() for gpu in ids}
        return tuple(gpu for gpu in self.inventory if gpu not in taken)

    def held(self) -> dict[str, list[int]]:
        with self._freed:
            return {job: list(ids) for job, ids in self._held.items()}

    def acquire(self, job_id: str, count: int, timeout: float) -> tuple[int, ...] | None:
        """`count` GPUs for `job_id`, waiting up to `timeout` s; None when none freed up."""
        if not self.inventory or count <= 0:
            return ()
        if count >= len(self.inventory):
            count = len(self.inventory)
        with self._freed:
            if job_id not in self._held:
                if not self._freed.wait_for(lambda: len(self._free_locked()) >= count, timeout):
                    return None
                self._held[job_id] = self._free_locked()[:count]
            self._users[job_id] = self._users.get(job_id, 0) + 1
            return self._held[job_id]

    def release(self, job_id: str) -> None:
        with self._freed:
            self._users[job_id] = self._users.get(job_id, 0) - 1
            if self._users[job_id] <= 0:
                self._users.pop(job_id)
                self._held.pop(job_id, None)
                self._freed.notify_all()

    @contextlib.contextmanager
    def holding(self, job_id: str) -> Iterator[None]:
        """Release `job_id`'s slice when the block ends, however it ends."""
        try:
            yield
        finally:
            self.release(job_id)
