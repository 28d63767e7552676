"""Stale and malformed messages ahead of a real job: each is acknowledged and dropped in
milliseconds, and the real job starts within 5 s. Real PostgreSQL, Redis DB 2, a real
`tuneyard worker` process; the messages go through Celery's own client.

The test keeps to a Redis database and a queue of its own (other worker tests flush DB 2
and their workers listen on `cpu`): a message taken by another test's worker would be
dropped there as unknown, which is the behaviour under test, but not this test's count.
"""

from __future__ import annotations

import uuid

import pytest
import redis
from worker_harness import FAKE_TRAINER, events_of, insert_job, wait_for

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


def _claimed_at(job_id: str):
    starting = [e for e in events_of(job_id) if e.to_status == "starting"]
    return starting[0].created_at if starting else None


def test_real_job_behind_1000_stale_messages_starts_within_5s(project_id, procs, own_queue):
    """All messages are queued before the worker starts: the real job is claimed within 5 s
    of the worker's first heartbeat (written when it is ready to consume)."""
    finished = _finished_job(project_id)
    _send_stale(finished, own_queue)
    job_id = insert_job(project_id, {"fake": {"steps": 3, "step_seconds": 0.05}}, queue=own_queue)
    assert redis.Redis.from_url(OWN_BROKER).llen(own_queue) == STALE + 1
    procs.start("w-stale", ["worker", "-Q", own_queue, "--name", "w-stale", "-c", "1"],
                {"TUNEYARD_WORKER_TRAINER_MODULE": FAKE_TRAINER})  # fmt: skip
    claimed = wait_for(lambda: _claimed_at(job_id), 60, "real job to be claimed", procs)
    from jobs.store.engine import session_factory
    from jobs.store.tables import Worker

    with session_factory()() as session:
        ready = session.get(Worker, "w-stale").started_at
    waited = (claimed - ready).total_seconds()
    print(f"the real job behind {STALE} stale messages was claimed {waited:.2f}s after the "
          "worker was ready")  # fmt: skip
    assert waited < 5.0, f"real job claimed {waited:.1f}s after the worker was ready"
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
