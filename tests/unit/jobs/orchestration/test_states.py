"""The state machine: every rule moves and logs an event; everything else is refused."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from jobs.orchestration.states import (
    RULES,
    IllegalTransition,
    StaleAttempt,
    allowed_targets,
    transition,
)
from jobs.store.queries import JobNotFound
from jobs.store.status import TERMINAL, JobStatus
from jobs.store.tables import Job, JobEvent, Project

ALL = list(JobStatus)


def make_job(session: Session, project: Project, status: str = "queued", **kw) -> Job:
    job = Job(project_id=project.id, name="j", status=status, **kw)
    session.add(job)
    session.commit()
    return job


def events(session: Session, job_id: str) -> list[JobEvent]:
    stmt = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
    return list(session.scalars(stmt))


@pytest.mark.parametrize("pair", sorted(RULES), ids=lambda p: f"{p[0]}->{p[1]}")
def test_every_rule_moves_and_writes_an_event(session, project, pair) -> None:
    frm, to = pair
    job = make_job(session, project, frm)
    moved = transition(session, job.id, to, reason="test")
    session.commit()
    assert moved.status == to
    [event] = events(session, job.id)
    assert (event.from_status, event.to_status, event.message) == (frm, to, "test")
    assert event.data["rule"] == RULES[pair].name


ILLEGAL = [(a, b) for a in ALL for b in ALL if (a, b) not in RULES]


@pytest.mark.parametrize("pair", ILLEGAL, ids=lambda p: f"{p[0]}->{p[1]}")
def test_moves_outside_the_table_are_refused(session, project, pair) -> None:
    frm, to = pair
    job = make_job(session, project, frm)
    with pytest.raises(IllegalTransition) as info:
        transition(session, job.id, to, reason="test")
    assert (info.value.current_status, info.value.requested) == (frm, to)
    session.rollback()
    assert session.get(Job, job.id).status == frm
    assert events(session, job.id) == []


def test_terminal_states_have_no_way_out() -> None:
    for status in TERMINAL:
        assert allowed_targets(status) == []


def test_claim_starts_a_new_attempt_and_fences_the_old_one(session, project) -> None:
    job = make_job(session, project)
    expires = datetime.now(UTC) + timedelta(seconds=30)
    transition(session, job.id, "starting", reason="claimed", lease_owner="w1",
               lease_expires_at=expires)  # fmt: skip
    session.commit()
    assert (job.attempt, job.lease_owner) == (1, "w1")
    transition(session, job.id, "queued", reason="lease lost", attempt=1)
    transition(session, job.id, "starting", reason="claimed again", lease_owner="w2")
    session.commit()
    assert job.attempt == 2 and job.dispatched_at is None
    with pytest.raises(StaleAttempt) as info:
        transition(session, job.id, "running", reason="old worker", attempt=1)
    assert info.value.current_attempt == 2
    session.rollback()
    transition(session, job.id, "running", reason="new worker", attempt=2)
    session.commit()
    assert job.status == "running" and job.started_at is not None


def test_terminal_move_sets_finished_and_clears_lease(session, project) -> None:
    job = make_job(session, project, "running", lease_owner="w", attempt=1,
                   lease_expires_at=datetime.now(UTC))  # fmt: skip
    transition(session, job.id, "failed", reason="crash", error_code="crash",
               error_message="boom")  # fmt: skip
    session.commit()
    assert job.finished_at is not None and job.lease_owner is None
    assert (job.error_code, job.error_message) == ("crash", "boom")
    assert job.finished_at.tzinfo is not None


def test_unknown_job_and_unknown_fields(session, project) -> None:
    with pytest.raises(JobNotFound):
        transition(session, "no-such-job", "starting", reason="x")
    job = make_job(session, project)
    with pytest.raises(TypeError):
        transition(session, job.id, "starting", reason="x", status="running")
    with pytest.raises(ValueError):
        transition(session, job.id, "exploded", reason="x")


def test_concurrent_claims_let_exactly_one_win(migrated_engine, project) -> None:
    factory = sessionmaker(bind=migrated_engine, expire_on_commit=False)
    with factory() as s:
        job = make_job(s, s.merge(project))
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def claim(worker: str) -> None:
        with factory() as s:
            barrier.wait()
            try:
                transition(s, job.id, "starting", reason="claim", lease_owner=worker)
                s.commit()
                outcomes.append("won")
            except IllegalTransition:
                s.rollback()
                outcomes.append("lost")

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["lost"] * 7 + ["won"]
    with factory() as s:
        assert s.get(Job, job.id).attempt == 1
        assert len(events(s, job.id)) == 1
