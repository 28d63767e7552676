"""The Celery task `tuneyard.run_job(job_id)`: claim the job in the database, then run it.

The message is only a hint. A job that is not `queued` is left alone (a duplicate or a
redelivered message), unless it is a multi-node job still gathering its gang, which the
receiving worker then joins. The task runs the whole attempt in the pool thread that
received it; the broker message was acknowledged before it started.

A message that cannot name a runnable job (not a job id, a job this database does not have
after a restore or on a shared broker, a job already finished) is dropped in one indexed
lookup: one warning line, a count per reason in the worker's heartbeat (`dropped_messages`)
and no traceback. The check runs in the consumer, before the message takes a pool slot
(`drop_stale_strategy`): a message handed to a busy pool pauses the Redis consumer for up
to a second, so a backlog of stale messages would otherwise hold real jobs back for
minutes. The task checks again, for a message that raced a deletion.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection

from jobs.orchestration.claims import claim_job, join_gang
from jobs.orchestration.policy import Outcome, Verdict
from jobs.recipe.plan.grants import operator_grants
from jobs.store.engine import get_engine, session_scope
from jobs.store.leases import Claim, renew_lease, take_gang_slot
from jobs.store.log_context import log_context
from jobs.store.queries import JobNotFound, is_job_id, job_status, status_connection
from jobs.store.settings import get_settings
from jobs.store.status import is_terminal
from jobs.store.tables import Job
from worker.celery_app import app
from worker.config import WorkerConfig, get_worker_config
from worker.gang import free_port, wait_for_gang
from worker.launcher import LaunchSpec, write_recipe
from worker.settle import dispatch_after_commit, report_outcome
from worker.state import worker_state
from worker.supervisor import AttemptSupervisor

log = logging.getLogger("tuneyard.worker")


def drop_stale_strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Callable[..., Any]:
    """Celery's default strategy for `run_job`, with stale messages acknowledged and dropped
    in the consumer; anything the check cannot decide goes the normal way."""
    from celery.worker.strategy import default

    handle = default(task, app, consumer, **kwargs)
    probe = StatusProbe()  # the strategy runs in the consumer thread only

    def on_message(message: Any, body: Any = None, *args: Any, **extra: Any) -> Any:
        try:
            job_id = _job_id_in(message)
            reason = stale_reason(job_id, probe)
        except Exception:  # undecodable, or the database is down: the task decides
            reason = None
        if reason is None:
            return handle(message, body, *args, **extra)
        message.ack()
        drop_message(job_id, reason)
        return None

    return on_message


def _job_id_in(message: Any) -> object:
    """The one positional argument of a protocol-2 message; None when it has another shape."""
    decoded = message.decode()
    args = decoded[0] if isinstance(decoded, list | tuple) and decoded else None
    return args[0] if isinstance(args, list) and len(args) == 1 else None


@app.task(
    name="tuneyard.run_job",
    ignore_result=True,
    acks_late=False,
    Strategy="worker.tasks:drop_stale_strategy",
)
def run_job(job_id: object = None, *_: object, **__: object) -> str:
    """Run `job_id` if this worker can claim it (or a slot of its gang); returns what happened.

    Takes any arguments so that a malformed message reaches `stale_reason` and is dropped
    like any other stale one, instead of failing in Celery's argument check.
    """
    reason = stale_reason(job_id)
    if reason is not None:
        return drop_message(job_id, reason)
    with log_context(job_id=str(job_id), worker=worker_state().name):
        try:
            return execute_job(str(job_id), get_worker_config())
        except JobNotFound:  # deleted between the look-up and the claim
            return drop_message(job_id, "unknown_job")


def stale_reason(job_id: object, probe: StatusProbe | None = None) -> str | None:
    """Why a message cannot start a job (`malformed`, `unknown_job`, `finished`), or None."""
    if not isinstance(job_id, str) or not is_job_id(job_id):
        return "malformed"
    status = probe.status(job_id) if probe else job_status(get_engine(), job_id)
    if status is None:
        return "unknown_job"
    return "finished" if is_terminal(status) else None


class StatusProbe:
    """Job status look-ups for the consumer thread: one held autocommit connection on
    PostgreSQL (no pool checkout or ping per message) and a memory of finished jobs, whose
    status is final."""

    def __init__(self, remembered: int = 4096) -> None:
        self._conn: Connection | None = None
        self._finished: OrderedDict[str, str] = OrderedDict()
        self._remembered = remembered

    def status(self, job_id: str) -> str | None:
        if job_id in self._finished:
            return self._finished[job_id]
        try:
            if self._conn is None:
                self._conn = status_connection(get_engine())
            status = job_status(self._conn or get_engine(), job_id)
        except Exception:
            self.close()  # reconnect on the next message; this one goes the normal way
            raise
        if status is not None and is_terminal(status):
            self._finished[job_id] = status
            while len(self._finished) > self._remembered:
                self._finished.popitem(last=False)
        return status

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


def drop_message(job_id: object, reason: str) -> str:
    """Acknowledge-and-forget: one warning line and a count, never a traceback."""
    count = worker_state().count_dropped(reason)
    log.warning(
        "dropped a message for job %s: %s (%d dropped for this reason so far)",
        str(job_id)[:80],
        reason,
        count,
    )
    return "dropped"


def execute_job(job_id: str, config: WorkerConfig) -> str:
    worker, slices = worker_state().name, worker_state().slices
    gpus = _gpu_slice(job_id, config)
    if gpus is None:
        return "waiting_for_gpus"
    with slices.holding(job_id):
        claim = _claim_or_join(job_id, worker, config)
        if claim is None:
            log.info("job %s: nothing to do (already claimed, finished or gang full)", job_id)
            return "skipped"
        with worker_state().running(job_id), log_context(attempt=claim.attempt):
            gang = claim.nnodes > 1 and config.executor == "local"  # SLURM allocates nodes
            if gang and not _gather_gang(claim, worker, config):
                return "gang_incomplete"
            spec = launch_spec(claim, config, gpus)
            outcome = AttemptSupervisor(claim, worker, config, spec).run()
    return outcome.verdict if outcome else "lost"


def _gpu_slice(job_id: str, config: WorkerConfig) -> tuple[int, ...] | None:
    """This job's GPUs on this worker (() for CPU jobs); None: none freed up in time, and the
    message went back to the job's queue (see worker.gpu_slices)."""
    slices = worker_state().slices
    if config.executor != "local" or not slices.inventory:
        return ()
    with session_scope() as session:
        job = session.get(Job, job_id)
        if job is None or (job.resources or {}).get("accelerator") != "cuda":
            return ()
        count, queue = int(job.resources.get("nproc_per_node") or 1), job.queue
    gpus = slices.acquire(job_id, count, config.gpu_wait_seconds)
    if gpus is None:
        log.info(
            "job %s: %d GPUs not free on this worker (free: %s); back to queue %s",
            job_id,
            count,
            list(slices.free()),
            queue,
        )
        dispatch_after_commit(job_id, queue)
    return gpus


def _claim_or_join(job_id: str, worker: str, config: WorkerConfig) -> Claim | None:
    settings = get_settings()
    run_dir = str(settings.resolved_runs_dir / job_id)
    with session_scope() as session:
        claim = claim_job(
            session,
            job_id,
            worker,
            config.lease_seconds,
            run_dir,
            packages=worker_state().packages,
            operator_grants=operator_grants(settings),
        )
        if claim is not None and claim.nnodes > 1 and config.executor == "local":
            endpoint = f"{config.host_address()}:{free_port(config.host_address())}"
            claim = take_gang_slot(session, job_id, worker, endpoint=endpoint)
            if claim is None:
                raise RuntimeError(f"job {job_id}: claimed but could not take gang slot 0")
            return claim
        if claim is not None:
            return claim
    with session_scope() as session:
        return join_gang(session, job_id, worker, packages=worker_state().packages)


def _gather_gang(claim: Claim, worker: str, config: WorkerConfig) -> bool:
    """Node 0 asks for the other nodes and waits for them; the others wait for the gang."""
    if claim.node_rank == 0:
        write_recipe(Path(claim.run_dir), claim.recipe)  # before any other node starts
        for _ in range(claim.nnodes - 1):
            dispatch_after_commit(claim.job_id, claim.queue)

    def renew() -> bool:
        if claim.node_rank != 0:
            return True
        with session_scope() as session:
            return (
                renew_lease(session, claim.job_id, worker, claim.attempt, config.lease_seconds)
                is not None
            )

    if wait_for_gang(claim.job_id, claim.attempt, claim.nnodes, config.gang_wait_seconds, renew):
        return True
    if claim.node_rank == 0:
        outcome = Outcome(
            Verdict.RETRY, "gang_timeout", f"{claim.nnodes} nodes did not gather in time"
        )
        report_outcome(claim, worker, outcome, None)
    return False


def launch_spec(claim: Claim, config: WorkerConfig, gpus: tuple[int, ...] = ()) -> LaunchSpec:
    res = claim.resources
    return LaunchSpec(
        job_id=claim.job_id,
        attempt=claim.attempt,
        run_dir=Path(claim.run_dir),
        nnodes=claim.nnodes,
        nproc_per_node=int(res.get("nproc_per_node") or 1),
        accelerator=str(res.get("accelerator") or "cpu"),
        rdzv_endpoint=claim.endpoint,
        gpu_ids=gpus or worker_state().gpu_ids,
        node_rank=claim.node_rank,
        trainer_module=config.trainer_module,
        rdzv_timeout_s=int(config.gang_wait_seconds),
    )
