"""The broker module against a real Redis (DB 3): sending, listing, counting, refusing.

Messages are sent with the same Celery client the API and the reconciler use, then read
back the way the reconciler reads them, without consuming them.
"""

from __future__ import annotations

import uuid

import pytest
import redis
from sqlalchemy import select

from jobs.broker import (
    broker_reachable,
    dispatch_job,
    dispatch_new_job,
    enqueue_job,
    queue_lengths,
    queued_job_ids,
)
from jobs.store import queries
from jobs.store.settings import Settings
from jobs.store.tables import Job

REDIS_URL = "redis://127.0.0.1:6379/3"


@pytest.fixture
def redis_settings(tmp_path) -> Settings:
    """Every test uses queues of its own names, so nothing is flushed under another test."""
    return Settings(home=tmp_path, broker_url=REDIS_URL)


def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:6]}"


def test_sent_ids_are_listed_and_counted_without_being_consumed(redis_settings):
    queue = queue_name()
    for job_id in ("a", "b", "c"):
        enqueue_job(job_id, queue, redis_settings)
    assert queued_job_ids([queue], redis_settings) == {"a", "b", "c"}
    assert queued_job_ids([queue], redis_settings) == {"a", "b", "c"}  # still there
    assert queue_lengths([queue, "empty"], redis_settings) == {queue: 3, "empty": 0}
    assert broker_reachable(redis_settings)


def test_a_message_that_is_not_a_job_is_skipped(redis_settings):
    queue = queue_name()
    redis.Redis.from_url(REDIS_URL).lpush(queue, b"not json", b'{"body": "!!"}')
    enqueue_job("real", queue, redis_settings)
    assert queued_job_ids([queue], redis_settings) == {"real"}


def test_an_unreachable_broker_answers_none_and_false(tmp_path):
    down = Settings(home=tmp_path, broker_url="redis://127.0.0.1:1/0")
    assert queued_job_ids(["cpu"], down) is None
    assert queue_lengths(["cpu"], down) is None
    assert broker_reachable(down, timeout=0.5) is False


def test_other_transports_cannot_be_listed(tmp_path):
    embedded = Settings(home=tmp_path)  # kombu's SQLite transport
    assert queued_job_ids(["cpu"], embedded) is None


def _queued_job(session, project) -> Job:
    """A queued job on a queue of its own, so no other test's messages mix with its own."""
    job, _ = queries.create_job(session, project.id, queries.NewJob(
        name="j", spec={}, recipe={}, plan={}, resources={}, queue=queue_name()))  # fmt: skip
    return job


def test_dispatch_records_the_send(session, project, redis_settings):
    job = _queued_job(session, project)
    assert dispatch_job(session, job.id, job.queue, redis_settings)
    sent = session.scalar(select(Job.dispatched_at).where(Job.id == job.id))
    assert sent is not None
    assert job.id in queued_job_ids([job.queue], redis_settings)


def test_a_refused_dispatch_leaves_the_job_for_the_reconciler(session, project, tmp_path):
    job = _queued_job(session, project)
    down = Settings(home=tmp_path, broker_url="redis://127.0.0.1:1/0")
    assert dispatch_job(session, job.id, job.queue, down) is False
    assert session.scalar(select(Job.dispatched_at).where(Job.id == job.id)) is None


def test_a_refused_new_job_has_its_dispatch_mark_taken_back(session, project, tmp_path):
    job, _ = queries.create_job(
        session,
        project.id,
        queries.NewJob("j", spec={}, recipe={}, plan={}, resources={}, queue=queue_name()),
        dispatching=True,
    )
    session.commit()
    assert job.dispatched_at is not None
    down = Settings(home=tmp_path, broker_url="redis://127.0.0.1:1/0")
    assert dispatch_new_job(session, job, down) is False
    assert job.dispatched_at is None
    assert session.scalar(select(Job.dispatched_at).where(Job.id == job.id)) is None


def test_a_mark_that_cannot_be_taken_back_is_logged_and_left_to_the_reconciler(
    session, project, tmp_path, monkeypatch, caplog
):
    """The database is gone too: nothing raises; the reconciler's grace window still covers
    the job (its mark is older than the window by then)."""
    from sqlalchemy.exc import OperationalError

    job, _ = queries.create_job(
        session,
        project.id,
        queries.NewJob("j", spec={}, recipe={}, plan={}, resources={}, queue=queue_name()),
        dispatching=True,
    )
    session.commit()

    def lost(*args, **kwargs):
        raise OperationalError("COMMIT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(session, "commit", lost)
    down = Settings(home=tmp_path, broker_url="redis://127.0.0.1:1/0")
    assert dispatch_new_job(session, job, down) is False
    assert "could not take back its dispatch mark" in caplog.text


def test_a_sent_message_is_celery_s_task_message(redis_settings):
    """What `enqueue_job` sends is read back by kombu's own consumer as the task the
    worker runs, with the job id as its one argument."""
    from jobs.broker import RUN_JOB_TASK, _client

    queue = queue_name()
    enqueue_job("job-a", queue, redis_settings)
    try:
        with _client(REDIS_URL).connection_for_read() as conn:
            message = conn.default_channel.basic_get(queue, no_ack=True)
            assert message.headers["task"] == RUN_JOB_TASK
            assert message.decode()[0] == ["job-a"]
            assert message.delivery_info["routing_key"] == queue
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        client.close()
