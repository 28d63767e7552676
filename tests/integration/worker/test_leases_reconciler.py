"""Claim, lease, fencing, idempotent ingestion and the reconciler, in-process against the
real PostgreSQL and Redis DB 2 (no worker processes)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from worker_harness import REDIS_URL, events_of, insert_job, job_row, train_steps

from jobs.store.engine import session_scope
from jobs.store.tables import Job, Worker, utcnow


def _claim(job_id: str, worker: str, lease: float = 30.0):
    from jobs.orchestration.claims import claim_job

    with session_scope() as session:
        return claim_job(session, job_id, worker, lease, f"/tmp/runs/{job_id}")


def _expire(job_id: str) -> None:
    with session_scope() as session:
        session.execute(update(Job).where(Job.id == job_id)
                        .values(lease_expires_at=utcnow() - timedelta(seconds=1)))  # fmt: skip


def test_claim_is_exclusive_and_a_duplicate_does_nothing(project_id):
    job_id = insert_job(project_id, {}, dispatch=False)
    first = _claim(job_id, "w1")
    assert first is not None and first.attempt == 1
    assert _claim(job_id, "w2") is None
    row = job_row(job_id)
    assert (row.status, row.lease_owner) == ("starting", "w1")


def test_renew_reports_status_and_refuses_a_stale_owner(project_id):
    from jobs.orchestration.states import transition
    from jobs.store.leases import renew_lease

    job_id = insert_job(project_id, {}, dispatch=False)
    claim = _claim(job_id, "w1")
    with session_scope() as session:
        assert renew_lease(session, job_id, "w1", claim.attempt, 30) == "starting"
        assert renew_lease(session, job_id, "w2", claim.attempt, 30) is None
        assert renew_lease(session, job_id, "w1", claim.attempt + 1, 30) is None
        transition(session, job_id, "cancelling", reason="user")
        assert renew_lease(session, job_id, "w1", claim.attempt, 30) == "cancelling"


def test_ingestion_is_idempotent_and_a_later_attempt_wins(project_id):
    from jobs.store.ingest import record_trainer_events, upsert_checkpoints, upsert_metrics

    job_id = insert_job(project_id, {}, dispatch=False)
    records = [{"kind": "train", "step": s, "loss": 1.0, "epoch": 0} for s in (1, 2, 3)]
    event = {"event": "checkpoint_saved", "step": 2, "path": "/x/step_2", "size_bytes": 5}
    for _ in range(2):
        with session_scope() as session:
            upsert_metrics(session, job_id, 1, records + [{"kind": "bogus", "step": 9}])
            record_trainer_events(session, job_id, 1, [(0, event)])
            upsert_checkpoints(session, job_id, 1, [event])
    with session_scope() as session:
        upsert_metrics(session, job_id, 2, [{"kind": "train", "step": 3, "loss": 0.5}])
        upsert_metrics(session, job_id, 1, [{"kind": "train", "step": 3, "loss": 9.0}])  # stale
    assert train_steps(job_id) == [1, 2, 3]
    from jobs.store.engine import session_factory
    from jobs.store.tables import Checkpoint, Metric

    with session_factory()() as session:
        step3 = session.query(Metric).filter_by(job_id=job_id, step=3).one()
        assert (step3.attempt, step3.loss) == (2, 0.5)
        assert session.query(Checkpoint).filter_by(job_id=job_id).count() == 1
    assert len([e for e in events_of(job_id) if e.kind == "trainer"]) == 1


def test_a_worker_whose_lease_was_taken_over_cannot_write(project_id, tmp_path: Path):
    from worker.config import WorkerConfig
    from worker.launcher import LaunchSpec
    from worker.reconciler import reconcile_once
    from worker.supervisor import AttemptSupervisor, LeaseLost

    job_id = insert_job(project_id, {}, dispatch=False)
    claim = _claim(job_id, "w-old")
    run_dir = Path(claim.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 1.0}\n')
    config = WorkerConfig(redispatch_grace_seconds=3600)
    spec = LaunchSpec(job_id=job_id, attempt=claim.attempt, run_dir=run_dir)
    sup = AttemptSupervisor(claim, "w-old", config, spec)
    assert sup.ingest_once() == 1 and train_steps(job_id) == [1]
    _expire(job_id)
    report = reconcile_once(config)
    assert job_id in report.expired
    row = job_row(job_id)
    assert (row.status, row.attempt, row.lease_owner) == ("queued", 1, None)
    assert _claim(job_id, "w-new").attempt == 2
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"kind": "train", "step": 2, "loss": 1.0}\n')
    with pytest.raises(LeaseLost):
        sup.ingest_once()
    assert train_steps(job_id) == [1]
    reasons = [e.message for e in events_of(job_id) if e.kind == "transition"]
    assert any("lease of worker w-old expired" in r for r in reasons)


def test_reconciler_leaves_fresh_leases_alone_and_ends_interrupted_stops(project_id):
    from jobs.orchestration.states import transition
    from worker.config import WorkerConfig
    from worker.reconciler import reconcile_once

    fresh = insert_job(project_id, {}, dispatch=False)
    _claim(fresh, "w1", lease=60)
    cancelling = insert_job(project_id, {}, dispatch=False)
    _claim(cancelling, "w1")
    with session_scope() as session:
        transition(session, cancelling, "cancelling", reason="user")
    _expire(cancelling)
    spent = insert_job(project_id, {}, dispatch=False, max_attempts=1)
    _claim(spent, "w1")
    _expire(spent)
    reconcile_once(WorkerConfig(redispatch_grace_seconds=3600))
    assert job_row(fresh).status == "starting"
    assert job_row(cancelling).status == "cancelled"
    row = job_row(spent)
    assert (row.status, row.error_code) == ("failed", "worker_lost")


def test_reconciler_redispatches_only_jobs_missing_from_the_broker(project_id):
    import redis

    from jobs.broker import queued_job_ids
    from worker.config import WorkerConfig
    from worker.reconciler import reconcile_once

    waiting = insert_job(project_id, {})  # in Redis
    lost = insert_job(project_id, {}, dispatch=False)  # never reached the broker
    with session_scope() as session:
        old = utcnow() - timedelta(seconds=60)
        session.execute(update(Job).where(Job.id.in_([waiting, lost])).values(dispatched_at=old))
    assert queued_job_ids({"cpu"}) == {waiting}
    report = reconcile_once(WorkerConfig(redispatch_grace_seconds=5))
    assert report.redispatched == [lost]
    assert queued_job_ids({"cpu"}) == {waiting, lost}
    redis.Redis.from_url(REDIS_URL).flushdb()
    report = reconcile_once(WorkerConfig(redispatch_grace_seconds=5))
    assert report.redispatched == [waiting]  # lost was just re-sent: inside its grace window


def test_stale_workers_are_marked_lost(project_id):
    from worker.config import WorkerConfig
    from worker.reconciler import reconcile_once
    from worker.state import WorkerState

    state = WorkerState(WorkerConfig(name="hb-worker"))
    state.beat()
    with session_scope() as session:
        session.execute(update(Worker).where(Worker.name == "hb-worker")
                        .values(last_heartbeat=utcnow() - timedelta(seconds=600)))  # fmt: skip
    report = reconcile_once(WorkerConfig(stale_worker_seconds=30, redispatch_grace_seconds=3600))
    assert "hb-worker" in report.lost_workers
    state.beat()
    with session_scope() as session:
        assert session.get(Worker, "hb-worker").status == "online"


def test_a_worker_advertises_the_optional_packages_it_can_import(project_id):
    from jobs.recipe.plan.requirements import importable
    from worker.config import WorkerConfig
    from worker.state import WorkerState

    state = WorkerState(WorkerConfig(name="pkg-worker"))
    state.beat()
    with session_scope() as session:
        advertised = session.get(Worker, "pkg-worker").resources["packages"]
    assert advertised == sorted(advertised)
    for package in ("wandb", "mlflow", "transformer_engine", "dion"):
        assert (package in advertised) == importable(package)


def test_bulk_copy_path_is_idempotent_and_fenced_by_attempt(project_id):
    from jobs.store.engine import session_factory
    from jobs.store.ingest import COPY_THRESHOLD, upsert_metrics
    from jobs.store.tables import Metric

    job_id = insert_job(project_id, {}, dispatch=False)
    n = COPY_THRESHOLD + 50
    first = [{"kind": "train", "step": s, "loss": 1.0} for s in range(1, n + 1)]
    later = [{"kind": "train", "step": s, "loss": 0.5} for s in range(n - 9, n + 1)] * 30
    stale = [{"kind": "train", "step": s, "loss": 9.0, "grad_norm": float("nan")}
             for s in range(1, n + 1)]  # fmt: skip
    with session_scope() as session:
        upsert_metrics(session, job_id, 1, first)
        upsert_metrics(session, job_id, 1, first)  # same transaction: the stage is emptied
    with session_scope() as session:
        upsert_metrics(
            session, job_id, 2, later + [{"kind": "val", "step": 1, "val_loss": 2.0}] * 300
        )
    with session_scope() as session:
        upsert_metrics(session, job_id, 1, stale)  # an older attempt never overwrites
    assert train_steps(job_id) == list(range(1, n + 1))
    with session_factory()() as session:
        rows = {
            m.step: (m.attempt, m.loss)
            for m in session.query(Metric).filter_by(job_id=job_id, kind="train")
        }
        assert rows[n] == (2, 0.5) and rows[n - 10] == (1, 9.0) and rows[1] == (1, 9.0)
        assert session.query(Metric).filter_by(job_id=job_id, kind="val").one().val_loss == 2.0


def test_a_pause_and_resume_spend_no_retry(project_id):
    """`attempt` counts claims; only failed attempts count against max_attempts."""
    from jobs.orchestration.policy import retry_or_fail
    from jobs.orchestration.states import transition

    job_id = insert_job(project_id, {}, max_attempts=2, dispatch=False)
    _claim(job_id, "w1")
    with session_scope() as session:
        for status in ("running", "pausing", "paused", "queued"):
            transition(session, job_id, status, reason="test")
    _claim(job_id, "w1")  # attempt 2, after the pause
    with session_scope() as session:
        transition(session, job_id, "running", reason="test")
        job = session.get(Job, job_id)
        assert job.attempt == 2
        assert retry_or_fail(session, job, "worker_lost", "gone", {}) is True
    assert job_row(job_id).status == "queued"
    _claim(job_id, "w2")  # attempt 3: the second failure spends the budget
    with session_scope() as session:
        transition(session, job_id, "running", reason="test")
        assert retry_or_fail(session, session.get(Job, job_id), "crash", "boom", {}) is False
    row = job_row(job_id)
    assert (row.status, row.error_code) == ("failed", "crash")
