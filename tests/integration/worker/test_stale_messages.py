"""Stale and malformed messages ahead of a real job: each is acknowledged and dropped in
milliseconds, and the real job starts within 5 s. Real PostgreSQL, Redis DB 2, a real
`tuneyard worker` process; the messages go through Celery's own client.

The test keeps to a Redis database and a queue of its own (other worker tests flush DB 2
and their workers listen on `cpu`): a message taken by another test's worker would be
dropped there as unknown, which is the behaviour under test, but not this test's count.
"""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from worker_harness import FAKE_TRAINER, insert_job, job_row, wait_for

STALE = 1000
OWN_BROKER = "redis://127.0.0.1:6379/6"


@pytest.fixture()
def own_queue(ty_env, procs, monkeypatch) -> str:
    from jobs.store.settings import get_settings

    queue = f"stale-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TUNEYARD_BROKER_URL", OWN_BROKER)
    procs.env = {**procs.env, "TUNEYARD_BROKER_URL": OWN_BROKER}
    get_settings.cache_clear()
    yield queue
    redis.Redis.from_url(OWN_BROKER).delete(queue)
    get_settings.cache_clear()


def _worker_ready(name: str) -> bool:
    from jobs.store.engine import session_factory
    from jobs.store.tables import Worker

    with session_factory()() as session:
        return session.get(Worker, name) is not None


def _finished_job(project_id: int) -> str:
    from jobs.orchestration.states import transition
    from jobs.store.engine import session_scope

    job_id = insert_job(project_id, {"fake": {"steps": 1}}, dispatch=False)
    with session_scope() as session:
        transition(session, job_id, "cancelled", reason="test: finished before its message")
    return job_id


def _send_stale(finished: str, queue: str) -> None:
    from jobs.broker import RUN_JOB_TASK, _client, broker_url_for, enqueue_job

    app = _client(broker_url_for())
    with app.producer_or_acquire() as producer:
        for i in range(STALE):
            kind = i % 4
            if kind == 0:  # a job this database never had (restored database, shared broker)
                args: list = [str(uuid.uuid4())]
            elif kind == 1:  # a job that finished before its (redelivered) message
                args = [finished]
            elif kind == 2:  # not a job id at all
                args = [f"not-a-job-{i}"]
            else:  # malformed: no argument, or a number
                args = [] if i % 8 == 3 else [i]
            app.send_task(RUN_JOB_TASK, args=args, queue=queue, producer=producer)
    assert enqueue_job is not None


def test_real_job_behind_1000_stale_messages_starts_within_5s(project_id, procs, own_queue):
    procs.start("w-stale", ["worker", "-Q", own_queue, "--name", "w-stale", "-c", "1"],
                {"TUNEYARD_WORKER_TRAINER_MODULE": FAKE_TRAINER})  # fmt: skip
    wait_for(lambda: _worker_ready("w-stale"), 60, "worker to be ready", procs)
    finished = _finished_job(project_id)
    start = time.monotonic()
    _send_stale(finished, own_queue)
    job_id = insert_job(project_id, {"fake": {"steps": 3, "step_seconds": 0.05}}, queue=own_queue)
    row = wait_for(lambda: (r := job_row(job_id)).status != "queued" and r, 30,
                   "real job to start", procs, every=0.05)  # fmt: skip
    waited = time.monotonic() - start
    assert row.started_at is not None or row.status in {"starting", "running", "succeeded"}
    print(f"real job started {waited:.2f}s after {STALE} stale messages were queued ahead of it")
    assert waited < 5.0, f"real job started {waited:.1f}s after 1000 stale messages"
    logs = wait_for(lambda: (t := procs.logs()).count("dropped a message") and t, 10, "logs")
    assert "Traceback" not in logs and "JobNotFound" not in logs
    for reason in ("unknown_job", "finished", "malformed"):
        assert f": {reason} (" in logs, reason
    from jobs.store.engine import session_factory
    from jobs.store.tables import Worker

    def counted() -> dict | None:
        with session_factory()() as session:
            dropped = session.get(Worker, "w-stale").resources.get("dropped_messages") or {}
        return dropped if sum(dropped.values()) == STALE else None

    dropped = wait_for(counted, 10, "heartbeat to count every dropped message", procs)
    print("dropped", dropped)
    assert dropped == {"unknown_job": 250, "finished": 250, "malformed": 500}
