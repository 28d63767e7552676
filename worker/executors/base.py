"""What every executor gives the supervisor for one attempt: the `AttemptHandle` protocol,
and `LaunchUnavailable` for a scheduler that cannot take the attempt for now."""

from __future__ import annotations

import signal
from typing import IO, Protocol

from jobs.orchestration.policy import Outcome


class LaunchUnavailable(OSError):
    """The scheduler could not take the attempt for now (SLURM's controller down or busy):
    worth asking again, unlike a refusal of the job itself."""


class AttemptHandle(Protocol):
    stdout: IO[bytes]
    stderr: IO[bytes]

    def poll(self) -> int | None: ...
    def started(self) -> bool: ...
    def describe(self) -> dict[str, str]: ...
    def signal_stop(self, sig: signal.Signals) -> None: ...
    def cleanup(self) -> None: ...
    def outcome(self) -> Outcome | None: ...
