"""Webhook subscriptions and the outbox on SQLite and PostgreSQL: URL rules, which events
make deliveries, that a delivery lives and dies with its event's transaction, replayed
checkpoints, and the claim that fences a sender whose lease ran out."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from jobs.orchestration.states import transition
from jobs.store.ingest import upsert_checkpoints
from jobs.store.settings import Settings
from jobs.store.status import JobStatus
from jobs.store.tables import Job, Project, Webhook, WebhookDelivery
from jobs.store.webhooks import (
    EVENTS,
    MAX_WEBHOOKS_PER_PROJECT,
    AttemptResult,
    claim_due_deliveries,
    create_webhook,
    delete_webhook,
    enqueue_event,
    job_event,
    private_addresses_allowed,
    record_attempt,
    url_problem,
)

SECRET = "0123456789abcdef-secret"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://ci.example.com/hook?token=1", None),
        ("http://203.0.113.7:8080/x", "private or reserved"),  # documentation range
        ("http://127.0.0.1:9000/x", "private or reserved"),
        ("http://localhost/x", "private or reserved"),
        ("http://[::1]/x", "private or reserved"),
        ("http://[::ffff:10.0.0.1]/x", "private or reserved"),
        ("http://169.254.169.254/latest", "private or reserved"),
        ("http://8.8.8.8/x", None),
        ("ftp://ci.example.com/x", "http or https"),
        ("https:///nohost", "http or https"),
        ("https://user:pw@ci.example.com/x", "credentials"),
        ("https://ci.example.com/x#frag", "#fragment"),
        ("https://ci.example.com:99999/x", "not a URL"),
        ("https://ci.example.com/a b", "spaces"),
        ("https://bücher.example/x", "non-ASCII"),
        ("https://ci.example.com/\ud800", "non-ASCII"),
        ("https://ci.example.com/" + "a" * 2000, "too long"),
    ],
)
def test_url_rules(url: str, problem: str | None) -> None:
    found = url_problem(url, allow_private=False)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.loc == "url" and problem in found.msg and found.fix


def test_private_addresses_are_the_operators_call() -> None:
    assert url_problem("http://127.0.0.1:9000/x", allow_private=True) is None
    assert url_problem("http://224.0.0.1/x", allow_private=True) is not None  # multicast
    embedded = Settings(database_url="sqlite:////tmp/x.db")
    shared = Settings(database_url="postgresql://db/tuneyard")
    assert private_addresses_allowed(embedded) and not private_addresses_allowed(shared)
    assert private_addresses_allowed(
        Settings(database_url="postgresql://db/t", webhook_allow_private=True)
    )


def test_event_names_come_from_the_status_list() -> None:
    assert {job_event(s) for s in JobStatus} <= set(EVENTS)
    assert {"checkpoint.published", "export.succeeded", "export.failed"} <= set(EVENTS)


def new_job(session: Session, project: Project) -> Job:
    job = Job(project_id=project.id, name="j")
    session.add(job)
    session.commit()
    return job


def outbox(session: Session, project: Project) -> list[WebhookDelivery]:
    stmt = (
        select(WebhookDelivery)
        .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
        .where(Webhook.project_id == project.id)
        .order_by(WebhookDelivery.id)
    )
    return list(session.scalars(stmt))


def subscribe(session: Session, project: Project, events: list[str]) -> int:
    hook = create_webhook(session, project.id, "https://ci.example.com/h", events, SECRET)
    session.commit()
    return hook.id


def test_a_transition_writes_deliveries_for_the_subscribed_events_only(session, project) -> None:
    ci = subscribe(session, project, ["job.succeeded", "job.failed"])
    every = subscribe(session, project, [job_event(s) for s in JobStatus])
    job = new_job(session, project)
    for status in (JobStatus.STARTING, JobStatus.RUNNING, JobStatus.SUCCEEDED):
        transition(session, job.id, status, reason="test")
        session.commit()
    rows = outbox(session, project)
    assert [r.event for r in rows if r.webhook_id == ci] == ["job.succeeded"]
    assert [r.event for r in rows if r.webhook_id == every] == [
        "job.starting",
        "job.running",
        "job.succeeded",
    ]
    done = rows[-1]
    assert (done.status, done.attempts, done.payload["id"]) == ("pending", 0, done.delivery_id)
    assert done.payload["project"] == project.name
    assert done.payload["data"]["job"]["id"] == job.id
    assert len({r.delivery_id for r in rows}) == len(rows)


def test_a_delivery_lives_and_dies_with_its_events_transaction(session, project) -> None:
    subscribe(session, project, ["job.cancelled"])
    job = new_job(session, project)
    transition(session, job.id, JobStatus.CANCELLED, reason="test")
    session.rollback()
    assert outbox(session, project) == []
    transition(session, job.id, JobStatus.CANCELLED, reason="test")
    session.commit()
    assert [r.event for r in outbox(session, project)] == ["job.cancelled"]


def test_a_replayed_checkpoint_is_one_delivery_per_attempt(session, project) -> None:
    subscribe(session, project, ["checkpoint.published"])
    job = new_job(session, project)
    saved = {"event": "checkpoint_saved", "step": 10, "path": "/ckpt/step_10", "size_bytes": 5}
    for attempt in (1, 1, 2):  # the worker re-reads events.jsonl, then a resumed attempt
        upsert_checkpoints(session, job.id, attempt, [saved])
        session.commit()
    rows = outbox(session, project)
    assert [(r.event, r.payload["data"]["attempt"]) for r in rows] == [
        ("checkpoint.published", 1),
        ("checkpoint.published", 2),
    ]
    assert rows[0].payload["data"]["checkpoint"]["step"] == 10


def test_unknown_events_are_a_programming_error(session, project) -> None:
    with pytest.raises(ValueError, match="EVENTS"):
        enqueue_event(session, project.id, "job.exploded", {})


def test_a_lost_claim_cannot_record_its_result(session, project) -> None:
    hook = subscribe(session, project, ["export.failed"])
    assert enqueue_event(session, project.id, "export.failed", {"export": 1}) == 1
    session.commit()
    [first] = [
        d
        for d in claim_due_deliveries(session, 50, 0.05)
        if d.url.endswith("/h") and d.payload["project"] == project.name
    ]
    session.commit()
    time.sleep(0.1)  # its lease runs out: due again
    [second] = [d for d in claim_due_deliveries(session, 50, 60) if d.row_id == first.row_id]
    session.commit()
    assert (first.attempt, second.attempt, first.delivery_id) == (1, 2, second.delivery_id)
    assert not record_attempt(session, first, AttemptResult(status_code=200), None)
    assert record_attempt(session, second, AttemptResult(status_code=500), None)
    session.commit()
    [row] = outbox(session, project)
    assert (row.status, row.attempts, row.last_status_code) == ("failed", 2, 500)
    assert delete_webhook(session, project.id, hook)
    session.commit()
    assert outbox(session, project) == []


def test_senders_side_by_side_claim_different_deliveries(session, project) -> None:
    if session.get_bind().dialect.name != "postgresql":
        pytest.skip("SKIP LOCKED is PostgreSQL's; SQLite serialises writers")
    subscribe(session, project, ["export.succeeded"])
    for n in range(4):
        enqueue_event(session, project.id, "export.succeeded", {"n": n})
    session.commit()
    with sessionmaker(bind=session.get_bind())() as other:
        mine = {d.row_id for d in claim_due_deliveries(session, 2, 60)}
        # Row locks that were waited for, not skipped, would fail here instead of hanging.
        other.execute(text("SET LOCAL lock_timeout = '2s'"))
        theirs = {d.row_id for d in claim_due_deliveries(other, 100, 60)}  # mine still held
        other.commit()
    session.commit()
    assert len(mine) == 2 and theirs and mine.isdisjoint(theirs)


def test_a_project_has_a_bounded_number_of_webhooks(session, project) -> None:
    for _ in range(MAX_WEBHOOKS_PER_PROJECT):
        subscribe(session, project, ["job.failed"])
    with pytest.raises(ValueError, match="delete one first"):
        subscribe(session, project, ["job.failed"])
    session.rollback()
