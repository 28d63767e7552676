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


def _normalized(raw: bytes) -> dict:
    """A kombu Redis message with its per-message ids blanked and its body decoded."""
    import base64
    import json

    message = json.loads(raw)
    task_id = message["headers"]["id"]
    for where, key in (("headers", "id"), ("headers", "root_id"),
                       ("properties", "correlation_id"), ("properties", "delivery_tag")):  # fmt: skip
        assert message[where][key], key
        message[where][key] = "<id>"
    assert message["properties"]["correlation_id"] == "<id>" and task_id
    message["body"] = json.loads(base64.b64decode(message["body"]))
    message["body"][0] = ["<job>"]
    message["headers"]["argsrepr"] = message["headers"]["argsrepr"].replace("job-a", "job-b")
    return message


def test_a_direct_send_is_the_message_celery_writes(redis_settings):
    """A queue's first send goes through Celery (which declares the queue); the next is one
    LPUSH of the same message, field for field, that kombu's consumer decodes."""
    from jobs.broker import _client, _publishers

    queue = queue_name()
    enqueue_job("job-a", queue, redis_settings)
    enqueue_job("job-b", queue, redis_settings)
    assert queue in _publishers[REDIS_URL].declared
    client = redis.Redis.from_url(REDIS_URL)
    try:
        direct, celery = client.lrange(queue, 0, -1)  # LPUSH: newest first
        assert client.smembers(f"_kombu.binding.{queue}")  # declared by Celery's send
    finally:
        client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        client.close()
    assert b"job-a" in celery and b"job-b" in direct
    assert _normalized(direct) == _normalized(celery)
    # and kombu's own consumer reads it back as Celery's task message
    client = redis.Redis.from_url(REDIS_URL)
    client.lpush(queue, direct)
    try:
        with _client(REDIS_URL).connection_for_read() as conn:
            message = conn.default_channel.basic_get(queue, no_ack=True)
            assert message.headers["task"] == "tuneyard.run_job"
            assert message.decode()[0] == ["job-b"]
            assert message.delivery_info["routing_key"] == queue
    finally:
        client.delete(queue)
        client.close()


def test_only_plain_redis_urls_are_sent_directly(tmp_path):
    from jobs.broker import _publisher_for

    assert _publisher_for(REDIS_URL) is not False
    for url in (f"{REDIS_URL}?socket_timeout=3", "rediss://127.0.0.1:6379/3",
                f"sqla+sqlite:///{tmp_path / 'b.db'}"):  # fmt: skip
        assert _publisher_for(url) is False, url


def test_a_refused_direct_send_raises_and_the_dispatch_says_so(
    session, project, tmp_path, monkeypatch, caplog
):
    """The broker went away after the queue's first send: the LPUSH is retried, then the
    send raises, and `dispatch_job` leaves the job for the reconciler."""
    from jobs import broker

    down = "redis://127.0.0.1:1/0"
    publisher = broker._RedisPublisher(down, broker._client(down))
    publisher.declared.add("cpu")
    monkeypatch.setitem(broker._publishers, down, publisher)
    settings = Settings(home=tmp_path, broker_url=down)
    with pytest.raises(redis.ConnectionError):
        enqueue_job("x", "cpu", settings)
    job = _queued_job(session, project)
    assert dispatch_job(session, job.id, "cpu", settings) is False
    assert "broker refused" in caplog.text
