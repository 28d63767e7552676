"""Supervising one attempt on one node: launch, ingest, renew, stop, and settle the outcome.

`AttemptSupervisor.run()` is a single loop: every `ingest_seconds` it moves new lines of
`metrics.jsonl` / `events.jsonl` and the process's output into the database in one fenced
transaction (node 0 only; other gang nodes store their logs); every `poll_seconds` it
renews the lease and reads the job's status, which is how a cancel or pause request
arrives. A request sends SIGTERM to every process of the attempt and SIGKILL after the
grace period. When torchrun exits, the files are drained, the ranks' failure records are
read for the first cause (`worker.rank_failures`: rank 0 may have been stopped before it
could report a failure another rank saw) and the outcome is written through
`jobs.orchestration.policy`, with the attempt as fencing token. Database errors are logged and
retried: records wait in the files, log lines in memory.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from jobs.orchestration.policy import (
    FailureCause,
    Outcome,
    classify_exit,
    first_cause,
    is_outcome_event,
    launch_failure,
    stop_request,
)
from jobs.orchestration.states import TransitionRefused, transition
from jobs.store.engine import session_scope
from jobs.store.ingest import append_logs, record_trainer_events, upsert_checkpoints, upsert_metrics
from jobs.store.leases import Claim, holds_lease, job_attempt_status, renew_lease
from jobs.store.retention import record_trainer_deletions
from jobs.store.samples import ingest_samples
from jobs.store.status import ACTIVE, JobStatus
from worker import executors
from worker.artifact_uploads import (
    ArtifactUploads,
    RestoreFailed,
    restore_stored_checkpoint,
    while_renewing,
)
from worker.config import WorkerConfig
from worker.executors import AttemptHandle
from worker.launcher import LaunchSpec, write_recipe
from worker.logpump import LogPump
from worker.rank_failures import append_event, clear_failure_records, read_failure_records
from worker.settle import report_outcome
from worker.tailer import OffsetStore, read_new_lines

log = logging.getLogger("tuneyard.worker")


# The line a user's stop request adds to the job log before the trainer's own last lines.
STOP_LOG_LINES = {
    "pause": "[tuneyard] pause requested: the trainer saves a checkpoint and stops",
    "cancel": "[tuneyard] cancel requested: stopping every process of this attempt",
}


class LeaseLost(Exception):
    """This worker no longer owns the attempt: stop and write nothing."""


@dataclass
class StopRequest:
    kind: str  # "cancel" | "pause" | "lease_lost"
    sigkill_at: float
    sigterm_sent: bool = False
    sigkill_sent: bool = False


@dataclass
class AttemptState:
    last_outcome_event: dict[str, Any] | None = None
    events_launch_offset: int = 0
    stop: StopRequest | None = None
    lease_lost: bool = False
    counters: dict[str, int] = field(default_factory=lambda: {"metrics": 0, "events": 0})


class AttemptSupervisor:
    def __init__(self, claim: Claim, worker: str, config: WorkerConfig, spec: LaunchSpec) -> None:
        self.claim, self.worker, self.config, self.spec = claim, worker, config, spec
        self.run_dir = Path(claim.run_dir)
        self.is_leader = claim.node_rank == 0
        prefix = "" if self.is_leader else f"n{claim.node_rank}:"
        self.pump = LogPump(prefix=prefix)
        self.offsets = OffsetStore(self.run_dir / ".ingest_offsets.json")
        self.state = AttemptState()
        self.uploads: ArtifactUploads | None = None  # node 0, with an artifact store

    # ---- lifecycle -------------------------------------------------------------------
    def run(self) -> Outcome | None:
        """Run the attempt to its end; returns the outcome settled (None if not ours)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.is_leader:
            write_recipe(self.run_dir, self.claim.recipe)
        executors.stop_older_attempts(self.spec, self.config)
        if self.is_leader:  # after the older attempt's ranks are gone: none writes one now
            clear_failure_records(self.run_dir)
            refused = self._start_artifacts()
            if refused is not None:
                return self._settle(refused, None)
        events_path = self.run_dir / "events.jsonl"
        self.state.events_launch_offset = events_path.stat().st_size if events_path.exists() else 0
        started = self._launch()
        if started is None:
            return None  # the lease was lost while the scheduler was away: not ours now
        if isinstance(started, Outcome):
            return self._settle(started, None) if self.is_leader else started
        handle = started
        self.pump.follow("stdout", handle.stdout)
        self.pump.follow("stderr", handle.stderr)
        returncode = self._supervise(handle)
        self.pump.wait_closed()
        self._drain()
        if self.uploads is not None:  # the job settles with its checkpoints stored
            self.uploads.finish(self._keep_lease)
        if self.state.lease_lost:
            log.warning(
                "job %s attempt %s: lease lost, writing nothing",
                self.claim.job_id,
                self.claim.attempt,
            )
            return None
        cause = self._failure_cause(returncode) if self.is_leader else None
        last_event = self.state.last_outcome_event
        outcome = handle.outcome() or classify_exit(returncode, last_event, cause)
        return self._settle(outcome, returncode) if self.is_leader else outcome

    def _launch(self) -> AttemptHandle | Outcome | None:
        """Start the attempt. A scheduler that cannot take it for now is asked again with
        backoff for `launch_retry_seconds`, the lease renewed and a cancel or pause honoured
        meanwhile; any other refusal fails the launch at once. None: the lease was lost."""
        deadline, delay = time.monotonic() + self.config.launch_retry_seconds, 1.0
        while True:
            try:
                return executors.start(self.spec, self.run_dir, self.config)
            except executors.LaunchUnavailable as exc:
                if time.monotonic() + delay > deadline:
                    return launch_failure(
                        f"cannot start the attempt ({self.config.executor}) "
                        f"after {self.config.launch_retry_seconds:.0f}s of "
                        f"retries: {exc}"
                    )
                log.warning(
                    "job %s attempt %s: %s; asking again in %.0fs",
                    self.claim.job_id,
                    self.claim.attempt,
                    exc,
                    delay,
                )
            except OSError as exc:
                return launch_failure(f"cannot start the attempt ({self.config.executor}): {exc}")
            self._poll_status()
            if self.state.lease_lost:
                return None
            if self.state.stop is not None:
                return launch_failure(f"stopped ({self.state.stop.kind}) before it started")
            time.sleep(delay)
            delay = min(2 * delay, 30.0)

    def _supervise(self, handle: AttemptHandle) -> int:
        next_poll, marked = 0.0, not self.is_leader
        while (returncode := handle.poll()) is None:
            now = time.monotonic()
            if not marked and handle.started():  # a SLURM job may wait in its queue first
                self._retry_db(lambda: self._mark_running(handle))
                marked = True
            self._safe_ingest()
            if now >= next_poll:
                self._poll_status()
                next_poll = now + self.config.poll_seconds
            self._advance_stop(handle)
            time.sleep(self.config.ingest_seconds)
        handle.cleanup()
        if not marked:  # it ended before the first look: it still ran
            self._retry_db(lambda: self._mark_running(handle))
        return returncode

    def _mark_running(self, handle: AttemptHandle) -> None:
        with session_scope() as session:
            try:
                transition(
                    session,
                    self.claim.job_id,
                    JobStatus.RUNNING,
                    attempt=self.claim.attempt,
                    reason=f"{self.config.executor} attempt started on worker {self.worker}",
                    data=handle.describe(),
                )
            except TransitionRefused as exc:  # cancelled while starting: the poll sees it
                log.info("job %s not moved to running: %s", self.claim.job_id, exc)

    def _start_artifacts(self) -> Outcome | None:
        """Download the stored checkpoint the recipe restores from, if any (the lease renewed
        meanwhile), and start this attempt's uploads; an Outcome when the restore failed."""
        try:
            recipe = while_renewing(
                lambda: restore_stored_checkpoint(self.claim.recipe, self.run_dir),
                self._keep_lease,
            )
        except RestoreFailed as exc:
            return launch_failure(str(exc))
        if recipe is not self.claim.recipe:
            write_recipe(self.run_dir, recipe)
        self.uploads = self._retry_db(lambda: ArtifactUploads.for_job(self.claim.job_id))
        if self.uploads is not None:
            self._retry_db(self.uploads.submit_unstored)
        return None

    def _keep_lease(self) -> bool:
        """Renew the lease while the artifact store is busy; False once it is lost."""
        try:
            if self._renew_or_check() is None:
                self.state.lease_lost = True
        except SQLAlchemyError as exc:
            log.warning("job %s: lease renewal failed (%s)", self.claim.job_id, exc)
        return not self.state.lease_lost

    # ---- cancel, pause, lease ---------------------------------------------------------
    def _poll_status(self) -> None:
        try:
            status = self._renew_or_check()
        except SQLAlchemyError as exc:  # a status check that fails never stops the job
            log.warning("job %s: status check failed (%s); carrying on", self.claim.job_id, exc)
            return
        if status is None:
            self.state.lease_lost = True
            self._request_stop("lease_lost", grace=2.0)
        elif (kind := stop_request(status)) is not None:
            self._request_stop(kind, grace=self.config.stop_grace_seconds)

    def _renew_or_check(self) -> str | None:
        with session_scope() as session:
            if self.is_leader:
                return renew_lease(
                    session,
                    self.claim.job_id,
                    self.worker,
                    self.claim.attempt,
                    self.config.lease_seconds,
                )
            current = job_attempt_status(session, self.claim.job_id)
        if current is None or current[0] != self.claim.attempt:
            return None
        return current[1] if current[1] in ACTIVE else None

    def _request_stop(self, kind: str, grace: float) -> None:
        if self.state.stop is None:
            log.info(
                "job %s attempt %s: stopping (%s)", self.claim.job_id, self.claim.attempt, kind
            )
            self.state.stop = StopRequest(kind, time.monotonic() + grace)
            if kind in STOP_LOG_LINES:  # the job log says why the trainer is about to stop
                self.pump.add(f"{self.pump.prefix}stderr", STOP_LOG_LINES[kind])

    def _advance_stop(self, handle: AttemptHandle) -> None:
        stop = self.state.stop
        if stop is None:
            return
        if not stop.sigterm_sent:
            handle.signal_stop(signal.SIGTERM)
            stop.sigterm_sent = True
        elif time.monotonic() >= stop.sigkill_at and not stop.sigkill_sent:
            handle.signal_stop(signal.SIGKILL)
            stop.sigkill_sent = True

    # ---- ingestion --------------------------------------------------------------------
    def _safe_ingest(self) -> None:
        try:
            self.ingest_once()
        except LeaseLost:
            self.state.lease_lost = True
            self._request_stop("lease_lost", grace=2.0)
        except SQLAlchemyError as exc:
            log.warning(
                "job %s: ingestion deferred (%s)", self.claim.job_id, exc.__class__.__name__
            )

    def ingest_once(self, max_log_lines: int = 5000) -> int:
        """One fenced transaction of new metrics, events, checkpoints and log lines."""
        if self.state.lease_lost:
            return 0
        metrics = (
            read_new_lines(self.run_dir / "metrics.jsonl", self.offsets.get("metrics"))
            if self.is_leader
            else None
        )
        events = (
            read_new_lines(self.run_dir / "events.jsonl", self.offsets.get("events"))
            if self.is_leader
            else None
        )
        samples = (  # which dataset rows made each step (trainer.sample_log)
            read_new_lines(self.run_dir / "samples.jsonl", self.offsets.get("samples"))
            if self.is_leader
            else None
        )
        lines = self.pump.pending(max_log_lines)
        if not lines and not any(batch and batch.entries for batch in (metrics, events, samples)):
            self._advance_offsets(metrics, events, samples)
            return 0
        with session_scope() as session:
            if not self._fenced(session):
                raise LeaseLost()
            if metrics is not None and events is not None:
                self._write_records(session, metrics.records, events.entries)
            if samples is not None:
                ingest_samples(session, self.claim.job_id, self.claim.attempt, samples.records)
            append_logs(session, self.claim.job_id, self.claim.attempt, lines)
        self._advance_offsets(metrics, events, samples)
        self.pump.commit(len(lines))
        return len(lines) + (len(metrics.entries) if metrics else 0)

    def _fenced(self, session: Any) -> bool:
        if self.is_leader:
            return holds_lease(session, self.claim.job_id, self.worker, self.claim.attempt)
        current = job_attempt_status(session, self.claim.job_id)
        return current is not None and current[0] == self.claim.attempt

    def _write_records(
        self, session: Any, metrics: list[dict], events: list[tuple[int, dict]]
    ) -> None:
        job, attempt = self.claim.job_id, self.claim.attempt
        self.state.counters["metrics"] += upsert_metrics(session, job, attempt, metrics)
        self.state.counters["events"] += record_trainer_events(session, job, attempt, events)
        upsert_checkpoints(session, job, attempt, [record for _, record in events])
        if self.uploads is not None:
            self.uploads.submit_checkpoints([record for _, record in events])
        record_trainer_deletions(session, job, [record for _, record in events])
        if self.uploads is not None:  # their stored copies go too, after queued uploads
            self.uploads.submit_deletions([record for _, record in events])
        for offset, record in events:
            if offset >= self.state.events_launch_offset and is_outcome_event(record):
                self.state.last_outcome_event = record

    def _advance_offsets(self, metrics: Any, events: Any, samples: Any = None) -> None:
        if samples is not None:
            self.offsets.set("samples", samples.end_offset)
        if metrics is not None:
            self.offsets.set("metrics", metrics.end_offset)
        if events is not None:
            self.offsets.set("events", events.end_offset)

    def _drain(self) -> None:
        """After exit: ingest until the files and the log buffer are empty (DB retried)."""
        deadline = time.monotonic() + max(60.0, self.config.lease_seconds)
        while time.monotonic() < deadline and not self.state.lease_lost:
            self._poll_status()  # keep the lease while a database outage delays the drain
            try:
                if self.ingest_once() == 0:
                    return
            except LeaseLost:
                self.state.lease_lost = True
            except SQLAlchemyError as exc:
                log.warning(
                    "job %s: final ingestion waiting for the database (%s)",
                    self.claim.job_id,
                    exc.__class__.__name__,
                )
                time.sleep(1.0)

    # ---- outcome ----------------------------------------------------------------------
    def _failure_cause(self, returncode: int) -> FailureCause | None:
        """The first cause in the ranks' failure records; one rank 0 did not report becomes a
        `failed` event of the job too (not after a stop request: that ending is the stop)."""
        if returncode == 0:
            return None
        last = self.state.last_outcome_event
        cause = first_cause(read_failure_records(self.run_dir, self.claim.attempt), last)
        if cause is None or self.state.stop is not None or cause.reported_in(last):
            return cause
        if append_event(self.run_dir / "events.jsonl", cause.as_event(time.time())):
            self._drain()  # ingested like the trainer's own events, once
        return cause

    def _settle(self, outcome: Outcome, returncode: int | None) -> Outcome | None:
        stop_kind = self.state.stop.kind if self.state.stop else None
        settled = self._retry_db(
            lambda: report_outcome(self.claim, self.worker, outcome, stop_kind)
        )
        return outcome if settled else None

    def _retry_db(self, action: Any, attempts: int = 120) -> Any:
        for _ in range(attempts):
            try:
                return action()
            except SQLAlchemyError as exc:
                log.warning(
                    "job %s: database unavailable (%s); retrying",
                    self.claim.job_id,
                    exc.__class__.__name__,
                )
                time.sleep(1.0)
        return None
