"""The probe files come from the real loops: the worker's heartbeat thread and the
scheduler's reconcile loop, against the real PostgreSQL, mark themselves alive and ready."""

from __future__ import annotations

import threading
import time

from worker import health


def _wait_healthy(role: str, directory, timeout: float = 10.0) -> health.Verdict:
    deadline = time.monotonic() + timeout
    verdict = health.check(role, 30, ready=True, directory=directory)
    while not verdict.healthy and time.monotonic() < deadline:
        time.sleep(0.05)
        verdict = health.check(role, 30, ready=True, directory=directory)
    return verdict


def test_the_heartbeat_thread_marks_the_worker_ready(project_id, tmp_path, monkeypatch):
    from worker.config import WorkerConfig
    from worker.state import WorkerState

    monkeypatch.setenv("TUNEYARD_HEALTH_DIR", str(tmp_path))
    state = WorkerState(WorkerConfig(name="probe-worker", heartbeat_seconds=0.1))
    state.start_heartbeat()
    try:
        assert _wait_healthy("worker", tmp_path).healthy
    finally:
        state.stop_heartbeat()


def test_the_reconcile_loop_marks_the_scheduler_ready(project_id, tmp_path, monkeypatch):
    from worker.config import WorkerConfig
    from worker.reconciler import run_forever

    monkeypatch.setenv("TUNEYARD_HEALTH_DIR", str(tmp_path))
    stop = threading.Event()
    loop = threading.Thread(
        target=run_forever, args=(WorkerConfig(reconcile_seconds=0.1), stop), daemon=True
    )
    loop.start()
    try:
        assert _wait_healthy("scheduler", tmp_path).healthy
    finally:
        stop.set()
        loop.join(5)
