"""What each job event means to a person reading the job's history: `pause`, `resume`,
`cancel`, `preempt`, `retry`, `fail`, `finish`, `start`, `checkpoint` or `resume_check`.

A status change is named by the rule that made it (`jobs.orchestration.states.RULES`); a
trainer event by its own name. The trainer reports every stop it is asked for as
`preempted` (it cannot tell a user's pause from a cluster's preemption), so a `preempted`
event of an attempt whose pause or cancel had been requested before it is named for that
request: a user's pause is drawn as a pause, never as a preemption.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

RULE_LABELS = {
    "claim": "start",
    "pause_before_start": "pause",
    "pause_requested": "pause",
    "paused": "pause",
    "resume": "resume",
    "cancel_before_start": "cancel",
    "cancel_requested": "cancel",
    "cancelled": "cancel",
    "cancel_paused": "cancel",
    "cancel_between_attempts": "cancel",
    "attempt_failed": "retry",
    "launch_interrupted": "retry",
    "next_attempt": "retry",
    "crashed": "fail",
    "launch_failed": "fail",
    "unschedulable": "fail",
    "failed_while_cancelling": "fail",
    "failed_while_pausing": "fail",
    "attempts_exhausted": "fail",
    "finished": "finish",
    "finished_before_pause": "finish",
}
TRAINER_LABELS = {
    "preempted": "preempt",
    "failed": "fail",
    "finished": "finish",
    "checkpoint_saved": "checkpoint",
    "resume_verified": "resume_check",
    "resume_mismatch": "resume_check",
    "rollback": "resume_check",
}
# Status changes that ask a running attempt to stop, and what its `preempted` event then is.
STOP_REQUESTS = {"pause_requested": "pause", "cancel_requested": "cancel"}


@dataclass(frozen=True)
class EventFacts:
    """The fields of one stored event that name it."""

    id: int
    attempt: int
    kind: str
    rule: str | None
    trainer_event: str | None


def label_events(events: Sequence[EventFacts], requests: Sequence[EventFacts]) -> list[str | None]:
    """The label of each event, in order; `requests` are the job's stop requests (any page:
    a request may sit on an earlier page than the `preempted` event it caused)."""
    asked = {}
    for request in sorted(requests, key=lambda r: r.id):
        asked.setdefault(request.attempt, []).append(request)
    return [_label(event, asked.get(event.attempt, [])) for event in events]


def _label(event: EventFacts, requests: list[EventFacts]) -> str | None:
    if event.rule is not None:
        return RULE_LABELS.get(event.rule)
    label = TRAINER_LABELS.get(event.trainer_event or "")
    if label == "preempt":
        earlier = [r for r in requests if r.id < event.id]
        if earlier:
            return STOP_REQUESTS.get(earlier[-1].rule or "", label)
    return label
