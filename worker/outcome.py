"""Deciding how an attempt ended, from torchrun's exit code and the trainer's events.

torchrun reports a failed rank as its own exit code 1, so the trainer's `failed` event
(`code`, `exit_code`, `message`) is the better witness; the exit code is the fallback.
User errors (jobs.recipe.exit_codes.USER_ERRORS) fail the job at once; everything else (crash,
killed rank, rendezvous timeout, preemption) is an infrastructure error, retried as a new
attempt that resumes from LATEST while attempts remain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.recipe.exit_codes import FAILURE_CODES, ExitCode, is_user_error

SUCCEEDED, FAILED, RETRY = "succeeded", "failed", "retry"


@dataclass(frozen=True)
class Outcome:
    verdict: str  # succeeded | failed | retry
    code: str | None = None  # a FAILURE_CODES value, or an infrastructure code
    message: str = ""
    exit_code: int | None = None


def _code_name(exit_code: int) -> str:
    try:
        return FAILURE_CODES.get(ExitCode(exit_code), f"exit_{exit_code}")
    except ValueError:
        if exit_code < 0:
            return "killed"
        return f"exit_{exit_code}"


def classify_exit(returncode: int, last_event: dict[str, Any] | None) -> Outcome:
    """The outcome of an attempt nobody asked to stop."""
    event_name = (last_event or {}).get("event")
    if event_name == "failed":
        exit_code = int(last_event.get("exit_code", returncode or ExitCode.CRASH))
        code = str(last_event.get("code") or _code_name(exit_code))
        message = str(last_event.get("message") or "")
        verdict = FAILED if is_user_error(exit_code) else RETRY
        return Outcome(verdict, code, message, exit_code)
    if event_name == "preempted" or returncode == ExitCode.PREEMPTED:
        return Outcome(RETRY, "preempted", "the trainer was preempted", returncode)
    if returncode == 0:
        return Outcome(SUCCEEDED, exit_code=0)
    if is_user_error(returncode):
        return Outcome(FAILED, _code_name(returncode), f"trainer exited with {returncode}",
                       returncode)  # fmt: skip
    reason = f"torchrun exited with {returncode}" + (
        " (killed by a signal)" if returncode < 0 else ""
    )
    return Outcome(RETRY, _code_name(returncode), reason, returncode)


def is_outcome_event(record: dict[str, Any]) -> bool:
    """Trainer events that decide an attempt's outcome."""
    return record.get("event") in {"failed", "preempted", "finished"}
