"""Export states: the rule table moves and logs, everything else is refused; how a
subprocess exit, an expired lease and a user's cancel settle an export; a stale attempt
writes nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.orchestration.export_states import (
    RULES,
    claim_export,
    request_cancel,
    settle_exit,
    settle_expired_export,
    transition_export,
)
from jobs.orchestration.states import IllegalTransition, StaleAttempt
from jobs.recipe.exit_codes import ExitCode
from jobs.store.exports import create_export, expired_export_leases
from jobs.store.status import ExportStatus
from jobs.store.tables import Export, ExportEvent, Job, Project

S = ExportStatus


def make_export(session: Session, project: Project, status: S = S.QUEUED, **kw) -> Export:
    job = Job(project_id=project.id, name="j")
    session.add(job)
    session.flush()
    export = create_export(session, job, 10, "merged", True, "float32")
    export.status = status.value
    for name, value in kw.items():
        setattr(export, name, value)
    session.commit()
    return export


def transitions(session: Session, export_id: str) -> list[tuple[str | None, str | None]]:
    stmt = select(ExportEvent).where(ExportEvent.export_id == export_id).order_by(ExportEvent.id)
    return [(e.from_status, e.to_status) for e in session.scalars(stmt) if e.kind == "transition"]


@pytest.mark.parametrize("pair", sorted(RULES), ids=lambda p: f"{p[0]}->{p[1]}")
def test_every_rule_moves_and_writes_an_event(session, project, pair) -> None:
    frm, to = pair
    export = make_export(session, project, frm)
    assert transition_export(session, export.id, to, reason="test").status == to
    session.commit()
    assert transitions(session, export.id) == [(frm, to)]


@pytest.mark.parametrize(
    "pair", [(a, b) for a in S for b in S if (a, b) not in RULES], ids=lambda p: f"{p[0]}->{p[1]}"
)
def test_every_other_move_is_refused(session, project, pair) -> None:
    export = make_export(session, project, pair[0])
    with pytest.raises(IllegalTransition):
        transition_export(session, export.id, pair[1], reason="test")


def test_claim_then_a_crash_retries_until_the_attempts_are_spent(session, project) -> None:
    export = make_export(session, project, max_attempts=2)
    for attempt, requeued in [(1, True), (2, False)]:
        assert claim_export(session, export.id, "w", 60) == attempt
        assert claim_export(session, export.id, "w", 60) is None  # a duplicate message
        assert settle_exit(session, export.id, attempt, ExitCode.CRASH, "boom") is requeued
        session.commit()
    row = session.get(Export, export.id)
    assert (row.status, row.error_code, row.lease_owner) == ("failed", "crash", None)


def test_a_refusal_fails_at_once_and_success_publishes(session, project) -> None:
    refused = make_export(session, project)
    attempt = claim_export(session, refused.id, "w", 60)
    assert not settle_exit(session, refused.id, attempt, ExitCode.UNSUPPORTED, "DoRA")
    assert (refused.status, refused.error_code, refused.attempt) == ("failed", "unsupported", 1)
    done = make_export(session, project)
    attempt = claim_export(session, done.id, "w", 60)
    settle_exit(session, done.id, attempt, 0, "", path="/runs/x/exports/y", size_bytes=5)
    assert (done.status, done.path, done.size_bytes) == ("succeeded", "/runs/x/exports/y", 5)


def test_a_stale_attempt_writes_nothing(session, project) -> None:
    export = make_export(session, project)
    claim_export(session, export.id, "w", 60)
    with pytest.raises(StaleAttempt):
        settle_exit(session, export.id, 0, 0, "")
    assert export.status == "running"


def test_cancel_ends_queued_at_once_and_stops_a_running_one(session, project) -> None:
    queued = make_export(session, project)
    assert request_cancel(session, queued.id)[0].status == "cancelled"
    with pytest.raises(IllegalTransition):
        request_cancel(session, queued.id)
    running = make_export(session, project)
    attempt = claim_export(session, running.id, "w", 60)
    assert request_cancel(session, running.id)[0].status == "cancelling"
    assert request_cancel(session, running.id)[1] is False  # already in effect
    assert not settle_exit(session, running.id, attempt, -15, "")
    assert running.status == "cancelled"


def test_an_expired_lease_requeues_or_ends_the_export(session, project) -> None:
    lost = make_export(session, project)
    claim_export(session, lost.id, "gone", -1)
    cancelling = make_export(session, project)
    claim_export(session, cancelling.id, "gone", -1)
    request_cancel(session, cancelling.id)
    fresh = make_export(session, project)
    claim_export(session, fresh.id, "alive", 60)
    session.commit()
    expired = {e.id for e in expired_export_leases(session)}
    assert {lost.id, cancelling.id} <= expired and fresh.id not in expired
    assert settle_expired_export(session, lost) is True
    assert settle_expired_export(session, cancelling) is False
    session.commit()
    assert (lost.status, lost.lease_owner, cancelling.status) == ("queued", None, "cancelled")
