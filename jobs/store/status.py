"""The job and worker status values: the one definition every package reads.

`JobStatus` is the domain of `jobs.status` (the table's CHECK constraint is built from it),
the API's schemas, the dashboard and the CLI. `TERMINAL` statuses never change again;
`ACTIVE` ones are those in which a worker process may exist, so the lease matters. Which
moves between them are allowed is `jobs.orchestration`'s business, not this module's.
Standard library only, so the CLI can read it without the database stack.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    PAUSING = "pausing"
    PAUSED = "paused"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
ACTIVE = frozenset({JobStatus.STARTING, JobStatus.RUNNING, JobStatus.CANCELLING, JobStatus.PAUSING})
# What `tuneyard wait` stops on: the terminal statuses and `paused` (it needs a human).
SETTLED = TERMINAL | {JobStatus.PAUSED}


class WorkerStatus(StrEnum):
    """What a worker's heartbeat says of it (`lost`: the reconciler's word for a worker whose
    heartbeat stopped)."""

    ONLINE = "online"
    BUSY = "busy"
    OFFLINE = "offline"
    LOST = "lost"


LIVE_WORKERS = (WorkerStatus.ONLINE, WorkerStatus.BUSY)


def is_terminal(status: str) -> bool:
    return status in TERMINAL


class ExportStatus(StrEnum):
    """An export's lifecycle (`jobs.orchestration.export_states` says which moves are allowed):
    `queued` until a worker claims it, `running` while its subprocess writes, `cancelling`
    while a running one is being stopped, and three final statuses."""

    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


EXPORT_TERMINAL = frozenset({ExportStatus.SUCCEEDED, ExportStatus.FAILED, ExportStatus.CANCELLED})
