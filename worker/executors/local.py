"""The local executor: torchrun as a child process of the worker, on this host."""

from __future__ import annotations

import signal
import subprocess

from jobs.orchestration.policy import Outcome
from worker import proctree
from worker.launcher import LaunchSpec, build_command


class LocalAttempt:
    """torchrun as a child process in its own session, its ranks found by their run tag."""

    def __init__(self, spec: LaunchSpec, proc: subprocess.Popen[bytes]) -> None:
        self.spec, self.proc = spec, proc
        self.stdout, self.stderr = proc.stdout, proc.stderr

    def poll(self) -> int | None:
        return self.proc.poll()

    def started(self) -> bool:
        return True

    def describe(self) -> dict[str, str]:
        return {"command": " ".join(build_command(self.spec))}

    def signal_stop(self, sig: signal.Signals) -> None:
        spec = self.spec
        proctree.signal_pids(proctree.tagged_pids(spec.job_id, spec.attempt, spec.node_rank), sig)

    def cleanup(self) -> None:
        # ranks of a killed torchrun may outlive it: nothing of this attempt may remain
        proctree.stop_job_processes(self.spec.job_id, self.spec.attempt, 2.0, self.spec.node_rank)

    def outcome(self) -> Outcome | None:
        return None
