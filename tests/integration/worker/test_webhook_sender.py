"""The webhook sender against a real receiver on loopback and a real PostgreSQL database.

Jobs move through `jobs.orchestration` transitions (no trainer needed); the receiver
(`webhook_receiver`) checks every signature the way docs/webhooks.md says and answers what
each test scripts. Backoff is shrunk to tens of milliseconds through the sender's config.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from webhook_receiver import Receiver, start_receiver, stop_receiver, verify
from worker_harness import REPO, wait_for

from jobs.orchestration.states import transition
from jobs.store.engine import session_scope
from jobs.store.status import JobStatus
from jobs.store.tables import Job, Project, WebhookDelivery
from jobs.store.webhooks import JOB_EVENTS, DueDelivery, claim_due_deliveries, create_webhook
from worker.webhook_sender import (
    WebhookSender,
    WebhookSenderConfig,
    backoff_delay,
    body_bytes,
    checked_addresses,
    post_delivery,
    retry_at,
    sign,
    signed_headers,
)

S = JobStatus
FAST = WebhookSenderConfig(
    timeout_seconds=3,
    max_attempts=4,
    backoff_seconds=0.05,
    backoff_max_seconds=0.2,
    poll_seconds=0.05,
    batch_size=8,
)


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    server = start_receiver()
    yield server
    stop_receiver(server)


@pytest.fixture()
def project(ty_env: dict[str, str]) -> int:
    with session_scope() as session:
        row = Project(name=f"hooks-{uuid.uuid4().hex[:8]}")
        session.add(row)
        session.flush()
        return row.id


@pytest.fixture()
def sender(ty_env: dict[str, str]) -> Iterator[WebhookSender]:
    service = WebhookSender(FAST, allow_private=True)
    yield service
    service.close()


def subscribe(
    project: int, receiver: Receiver, path: str, events: list[str], host: str = ""
) -> int:
    secret = f"secret-of-{path.strip('/')}-0123456789"
    receiver.secrets[path] = secret
    url = receiver.base_url.replace("127.0.0.1", host) if host else receiver.base_url
    with session_scope() as session:
        return create_webhook(session, project, url + path, events, secret).id


def new_job(project: int) -> str:
    with session_scope() as session:
        job = Job(project_id=project, name="hooked")
        session.add(job)
        session.flush()
        return job.id


def move(job_id: str, *statuses: JobStatus) -> None:
    for status in statuses:
        with session_scope() as session:
            transition(session, job_id, status, reason=f"test moves it to {status}")


def deliveries(webhook_id: int) -> list[WebhookDelivery]:
    with session_scope() as session:
        stmt = select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id)
        return list(session.scalars(stmt.order_by(WebhookDelivery.id)))


def drain(sender: WebhookSender, timeout: float = 15.0) -> None:
    """Pass after pass until no delivery is pending."""

    def settled() -> bool:
        sender.send_due()
        with session_scope() as session:
            stmt = select(WebhookDelivery.id).where(WebhookDelivery.status == "pending")
            return session.scalars(stmt).first() is None

    wait_for(settled, timeout, "the outbox to drain", every=0.05)


def test_the_receiver_gets_exactly_the_subscribed_events_signed(project, receiver, sender) -> None:
    ci = subscribe(project, receiver, "/ci", ["job.succeeded", "job.failed", "job.cancelled"])
    subscribe(project, receiver, "/all", list(JOB_EVENTS), host="localhost")
    done, dropped = new_job(project), new_job(project)
    move(done, S.STARTING, S.RUNNING, S.SUCCEEDED)
    move(dropped, S.CANCELLED)
    drain(sender)

    got = {(r.body["data"]["job"]["id"], r.event) for r in receiver.got("/ci")}
    assert got == {(done, "job.succeeded"), (dropped, "job.cancelled")}
    assert len(receiver.got("/ci")) == 2  # once each
    seen = sorted((r.body["data"]["job"]["id"] == done, r.event) for r in receiver.got("/all"))
    assert seen == [
        (False, "job.cancelled"),
        (True, "job.running"),
        (True, "job.starting"),
        (True, "job.succeeded"),
    ]
    for request in receiver.got():
        assert request.verified, request
        assert request.body["id"] == request.delivery_id and request.body["event"] == request.event
        assert request.attempt == "1"
    [succeeded] = [r for r in receiver.got("/ci") if r.event == "job.succeeded"]
    assert succeeded.body["data"]["from_status"] == "running"
    assert succeeded.body["data"]["job"]["status"] == "succeeded"
    assert {d.status for d in deliveries(ci)} == {"succeeded"}


def test_a_receiver_that_answers_500_twice_gets_the_retry_under_the_same_id(
    project, receiver, sender
) -> None:
    hook = subscribe(project, receiver, "/flaky", ["job.failed"])
    receiver.script["/flaky"] = [500, 500]
    move(new_job(project), S.FAILED)
    drain(sender)

    got = receiver.got("/flaky")
    assert [r.answered for r in got] == [500, 500, 200]
    assert len({r.delivery_id for r in got}) == 1
    assert [r.attempt for r in got] == ["1", "2", "3"]
    assert all(r.verified for r in got)
    [row] = deliveries(hook)
    assert (row.status, row.attempts, row.last_status_code, row.last_response) == (
        "succeeded",
        3,
        200,
        "ok",
    )
    assert row.delivered_at is not None and row.next_attempt_at is None


def test_spent_attempts_leave_the_delivery_failed_with_the_last_answer(
    project, receiver, sender
) -> None:
    hook = subscribe(project, receiver, "/down", ["job.cancelled"])
    receiver.script["/down"] = [503] * 10
    move(new_job(project), S.CANCELLED)
    drain(sender)

    assert len(receiver.got("/down")) == FAST.max_attempts
    [row] = deliveries(hook)
    assert (row.status, row.attempts, row.last_status_code) == ("failed", 4, 503)
    assert row.last_response.startswith("receiver says no") and len(row.last_response) == 1000
    assert row.next_attempt_at is None and row.delivered_at is None


def test_a_sender_lost_mid_post_leads_to_a_duplicate_with_the_same_id(
    project, receiver, sender
) -> None:
    hook = subscribe(project, receiver, "/dup", ["job.cancelled"])
    move(new_job(project), S.CANCELLED)
    with session_scope() as session:
        [claimed] = claim_due_deliveries(session, limit=5, lease_seconds=0.2)
    assert post_delivery(sender.client, claimed, allow_private=True).ok  # then it "dies"
    time.sleep(0.3)  # the claim's lease runs out
    drain(sender)

    got = receiver.got("/dup")
    assert len(got) == 2 and got[0].delivery_id == got[1].delivery_id == claimed.delivery_id
    [row] = deliveries(hook)
    assert (row.status, row.attempts) == ("succeeded", 2)


def test_a_name_resolving_to_a_private_address_is_refused_at_send(project, receiver) -> None:
    hook = subscribe(project, receiver, "/private", ["job.cancelled"], host="localhost")
    move(new_job(project), S.CANCELLED)
    strict = WebhookSender(FAST, allow_private=False)
    try:
        strict.send_due()
    finally:
        strict.close()
    assert receiver.got("/private") == []
    [row] = deliveries(hook)
    assert row.status == "pending" and row.attempts == 1 and row.last_status_code is None
    assert "private or reserved address" in row.last_error
    with pytest.raises(ValueError, match="TUNEYARD_WEBHOOK_ALLOW_PRIVATE"):
        checked_addresses("http://localhost:9/x", allow_private=False)


def test_tuneyard_scheduler_sends_the_outbox(project, receiver, procs, monkeypatch) -> None:
    monkeypatch.setenv("TUNEYARD_WEBHOOK_ALLOW_PRIVATE", "1")
    monkeypatch.setenv("TUNEYARD_WEBHOOK_POLL_SECONDS", "0.2")
    subscribe(project, receiver, "/scheduled", ["job.paused"])
    procs.scheduler()
    move(new_job(project), S.PAUSED)
    [request] = wait_for(lambda: receiver.got("/scheduled"), 30, "the scheduler's delivery", procs)
    assert request.verified and request.event == "job.paused"


def test_signature_and_backoff() -> None:
    body = b'{"event":"job.failed"}'
    header = f"t=1700000000,v1={sign('s3cret-s3cret-s3cret', 1700000000, body)}"
    assert verify("s3cret-s3cret-s3cret", header, body, now=1700000010)
    assert not verify("another-secret-value", header, body, now=1700000010)
    assert not verify("s3cret-s3cret-s3cret", header, body + b" ", now=1700000010)
    assert not verify("s3cret-s3cret-s3cret", header, body, now=1700009999)  # too old
    config = WebhookSenderConfig(backoff_seconds=10, backoff_max_seconds=60, max_attempts=3)
    assert 8 <= backoff_delay(1, config) <= 12 and 16 <= backoff_delay(2, config) <= 24
    assert 48 <= backoff_delay(9, config) <= 72  # capped, then spread
    assert retry_at(2, config) > datetime.now(UTC) and retry_at(3, config) is None


def test_the_documented_check_accepts_what_the_sender_signs() -> None:
    docs = (REPO / "docs" / "webhooks.md").read_text()
    namespace: dict = {}
    exec(docs.split("```python\n", 1)[1].split("```", 1)[0], namespace)  # the docs' snippet
    check = namespace["verify_tuneyard_signature"]
    delivery = DueDelivery(
        1,
        "d-1",
        "job.failed",
        "https://ci.example.com/h",
        "the-webhooks-secret-value",
        {"id": "d-1", "event": "job.failed"},
        1,
    )
    body = body_bytes(delivery.payload)
    header = signed_headers(delivery, body)["Tuneyard-Signature"]
    assert check(delivery.secret, header, body)
    assert not check(delivery.secret, header, body.replace(b"failed", b"passed"))
    assert not check("another-secret-value-here", header, body)
    assert not check(delivery.secret, "t=1,v1=" + header.split("v1=")[1], body)  # stale t
