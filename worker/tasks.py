"""The Celery task `tuneyard.run_job(job_id)`: claim the job in the database, then run it.

The message is only a hint. A job that is not `queued` is left alone (a duplicate or a
redelivered message), unless it is a multi-node job still gathering its gang, which the
receiving worker then joins. The task runs the whole attempt in the pool thread that
received it; the broker message was acknowledged before it started.
"""

from __future__ import annotations

import logging
from pathlib import Path

from jobs.orchestration.claims import claim_job, join_gang
from jobs.orchestration.policy import Outcome, Verdict
from jobs.store.engine import session_scope
from jobs.store.leases import Claim, renew_lease, take_gang_slot
from jobs.store.settings import get_settings
from worker.celery_app import app
from worker.config import WorkerConfig, get_worker_config
from worker.gang import free_port, wait_for_gang
from worker.launcher import LaunchSpec, write_recipe
from worker.settle import dispatch_after_commit, report_outcome
from worker.state import worker_state
from worker.supervisor import AttemptSupervisor

log = logging.getLogger("tuneyard.worker")


@app.task(name="tuneyard.run_job", ignore_result=True, acks_late=False)
def run_job(job_id: str) -> str:
    """Run `job_id` if this worker can claim it (or a slot of its gang); returns what happened."""
    return execute_job(str(job_id), get_worker_config())


def execute_job(job_id: str, config: WorkerConfig) -> str:
    worker = worker_state().name
    claim = _claim_or_join(job_id, worker, config)
    if claim is None:
        log.info("job %s: nothing to do (already claimed, finished or gang full)", job_id)
        return "skipped"
    with worker_state().running(job_id):
        if claim.nnodes > 1 and not _gather_gang(claim, worker, config):
            return "gang_incomplete"
        outcome = AttemptSupervisor(claim, worker, config, launch_spec(claim, config)).run()
    return outcome.verdict if outcome else "lost"


def _claim_or_join(job_id: str, worker: str, config: WorkerConfig) -> Claim | None:
    run_dir = str(get_settings().resolved_runs_dir / job_id)
    with session_scope() as session:
        claim = claim_job(session, job_id, worker, config.lease_seconds, run_dir,
                          packages=worker_state().packages)  # fmt: skip
        if claim is not None and claim.nnodes > 1:
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
            return renew_lease(session, claim.job_id, worker, claim.attempt,
                               config.lease_seconds) is not None  # fmt: skip

    if wait_for_gang(claim.job_id, claim.attempt, claim.nnodes, config.gang_wait_seconds, renew):
        return True
    if claim.node_rank == 0:
        outcome = Outcome(
            Verdict.RETRY, "gang_timeout", f"{claim.nnodes} nodes did not gather in time"
        )
        report_outcome(claim, worker, outcome, None)
    return False


def launch_spec(claim: Claim, config: WorkerConfig) -> LaunchSpec:
    res = claim.resources
    return LaunchSpec(
        job_id=claim.job_id,
        attempt=claim.attempt,
        run_dir=Path(claim.run_dir),
        nnodes=claim.nnodes,
        nproc_per_node=int(res.get("nproc_per_node") or 1),
        accelerator=str(res.get("accelerator") or "cpu"),
        rdzv_endpoint=claim.endpoint,
        gpu_ids=worker_state().gpu_ids,
        node_rank=claim.node_rank,
        trainer_module=config.trainer_module,
        rdzv_timeout_s=int(config.gang_wait_seconds),
    )
