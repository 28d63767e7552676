"""This worker process's identity, the resources it offers, and its heartbeat thread.

The worker advertises its name, queues, host, GPU ids (from CUDA_VISIBLE_DEVICES or a
torch-free `nvidia-smi -L` probe) and how they are sliced between running jobs, the memory
of one device (`probe_device_memory`: declared, or `nvidia-smi`; submit refuses a job whose
estimate cannot fit it), CPU ranks, the optional packages it can import (a job that requires
one is claimed only by a worker that has it), the jobs it is running and the stale messages
it dropped, into the `workers` table every `heartbeat_seconds`; the reconciler marks a
worker whose heartbeat stops as lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from jobs.recipe.plan.memory_fit import parse_memory_size
from jobs.recipe.plan.requirements import worker_packages
from jobs.store.engine import session_scope
from jobs.store.leases import record_heartbeat
from jobs.store.status import WorkerStatus
from worker import health
from worker.config import WorkerConfig, get_worker_config
from worker.gpu_slices import GpuSlices

log = logging.getLogger("tuneyard.worker")


def probe_gpu_ids() -> tuple[int, ...]:
    """Visible GPU ids without importing torch: CUDA_VISIBLE_DEVICES, else nvidia-smi."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return tuple(int(x) for x in visible.split(",") if x.strip().isdigit())
    if not shutil.which("nvidia-smi"):
        return ()
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(range(sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))))


DEVICE_MEMORY_ENV = "TUNEYARD_WORKER_DEVICE_MEMORY"


def probe_device_memory() -> int | None:
    """Bytes of one device: TUNEYARD_WORKER_DEVICE_MEMORY (`80GiB`, declared by the operator),
    else the smallest GPU's total from `nvidia-smi` (no torch); None when neither says."""
    declared = os.environ.get(DEVICE_MEMORY_ENV)
    if declared:
        value = parse_memory_size(declared)
        if value is None:
            log.warning("%s=%r is not a size such as 80GiB; ignored", DEVICE_MEMORY_ENV, declared)
        return value
    if not shutil.which("nvidia-smi"):
        return None
    query = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    mib = [int(line) for line in out.stdout.split() if line.strip().isdigit()]
    return min(mib) << 20 if mib else None


class WorkerState:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.name = config.worker_name()
        self.gpu_ids = probe_gpu_ids()
        self.slices = GpuSlices(self.gpu_ids)  # each running CUDA job's share of gpu_ids
        self.packages = worker_packages()  # optional packages its trainer can import
        self.device_memory = probe_device_memory()  # per device; refuses jobs that cannot fit
        self._running: set[str] = set()
        self._dropped: dict[str, int] = {}  # stale or malformed messages, by reason
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def resources(self) -> dict[str, Any]:
        with self._lock:
            running = sorted(self._running)
            dropped = dict(self._dropped)
        return {
            "host": self.config.host_address(),
            "gpus": list(self.gpu_ids),
            "gpu_slices": self.slices.held(),
            "cpu_ranks": self.config.cpu_ranks or os.cpu_count() or 1,
            "queues": self.config.queue_list(),
            "running": running,
            "packages": list(self.packages),
            "device_memory_bytes": self.device_memory,
            "pid": os.getpid(),
            "dropped_messages": dropped,
        }

    def count_dropped(self, reason: str) -> int:
        """Count one dropped message; returns the count for `reason` so far."""
        with self._lock:
            self._dropped[reason] = self._dropped.get(reason, 0) + 1
            return self._dropped[reason]

    @contextlib.contextmanager
    def running(self, job_id: str) -> Iterator[None]:
        with self._lock:
            self._running.add(job_id)
        try:
            yield
        finally:
            with self._lock:
                self._running.discard(job_id)

    def beat(self, status: WorkerStatus | None = None) -> None:
        resources = self.resources()
        status = status or (WorkerStatus.BUSY if resources["running"] else WorkerStatus.ONLINE)
        with session_scope() as session:
            record_heartbeat(
                session, self.name, ",".join(self.config.queue_list()), resources, status
            )

    def start_heartbeat(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="tuneyard-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
                health.mark("worker", ok=True)
            except Exception as exc:  # the database may be down; try again next beat
                log.warning("heartbeat failed: %s", exc.__class__.__name__)
                health.mark("worker", ok=False, detail=f"heartbeat failed: {type(exc).__name__}")
            self._stop.wait(self.config.heartbeat_seconds)

    def stop_heartbeat(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            self.beat(WorkerStatus.OFFLINE)


@lru_cache(maxsize=1)
def worker_state() -> WorkerState:
    return WorkerState(get_worker_config())
