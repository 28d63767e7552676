"""Worker supervision against a torch-free stand-in trainer: outcomes, retries, cancel,
duplicates. Real PostgreSQL, Redis DB 2, real `tuneyard worker` processes and torchrun."""

from __future__ import annotations

import time
from pathlib import Path

from worker_harness import events_of, insert_job, job_row, train_steps, wait_for

from worker import proctree


def _done(job_id: str, states=("succeeded", "failed", "cancelled")):
    row = job_row(job_id)
    return row if row.status in states else None


def test_job_runs_to_success_with_every_step_once(project_id, procs):
    job_id = insert_job(project_id, {"fake": {"steps": 12, "step_seconds": 0.05}})
    procs.worker("w1")
    row = wait_for(lambda: _done(job_id), 60, "job to finish", procs)
    assert row.status == "succeeded", procs.logs()
    assert train_steps(job_id) == list(range(1, 13))
    kinds = [e.message for e in events_of(job_id) if e.kind == "trainer"]
    assert kinds[0].startswith("started") and kinds[-1].startswith("finished")
    from jobs.store.engine import session_factory
    from jobs.store.queries import list_checkpoints, list_logs

    with session_factory()() as session:
        assert [c.step for c in list_checkpoints(session, job_id)] == [5, 10]
        assert list_logs(session, job_id) is not None
    assert not proctree.tagged_pids(job_id)


def test_user_error_fails_at_once_without_retry(project_id, procs):
    recipe = {"fake": {"steps": 10, "fail_at": 3, "exit_code": 4}}
    job_id = insert_job(project_id, recipe, max_attempts=3)
    procs.worker("w1")
    row = wait_for(lambda: _done(job_id), 60, "job to fail", procs)
    assert (row.status, row.attempt, row.error_code) == ("failed", 1, "nan_loss")
    assert "step 3" in row.error_message


def test_infra_crash_is_retried_and_resumes_from_latest(project_id, procs):
    recipe = {"fake": {"steps": 8, "crash_attempts": 1}}
    job_id = insert_job(project_id, recipe, max_attempts=3)
    procs.worker("w1")
    row = wait_for(lambda: _done(job_id), 60, "job to finish", procs)
    assert (row.status, row.attempt) == ("succeeded", 2), procs.logs()
    assert train_steps(job_id) == list(range(1, 9))
    reasons = [e.message for e in events_of(job_id) if e.kind == "transition"]
    assert any("attempt 1 failed (crash)" in r for r in reasons), reasons
    assert any("attempt 2 resumes from LATEST (1 of 3" in r for r in reasons), reasons


def test_infra_crash_on_every_attempt_fails_when_attempts_are_spent(project_id, procs):
    job_id = insert_job(project_id, {"fake": {"crash_attempts": 9}}, max_attempts=2)
    procs.worker("w1")
    row = wait_for(lambda: _done(job_id), 60, "job to fail", procs)
    assert (row.status, row.attempt, row.error_code) == ("failed", 2, "crash")


def test_pause_then_resume_continues_from_latest(project_id, procs):
    from jobs.broker import enqueue_job
    from jobs.orchestration.states import transition
    from jobs.store.engine import session_scope

    job_id = insert_job(project_id, {"fake": {"steps": 40, "step_seconds": 0.05}})
    procs.worker("w1")
    wait_for(lambda: len(train_steps(job_id)) >= 4, 60, "training to start", procs)
    with session_scope() as session:
        transition(session, job_id, "pausing", reason="test pauses")
    wait_for(lambda: _done(job_id, ("paused",)), 15, "job to pause", procs)
    assert not proctree.tagged_pids(job_id)
    paused_at = max(train_steps(job_id))
    with session_scope() as session:
        transition(session, job_id, "queued", reason="test resumes")
    enqueue_job(job_id, "cpu")
    row = wait_for(lambda: _done(job_id), 60, "job to finish", procs)
    assert row.status == "succeeded" and train_steps(job_id) == list(range(1, 41))
    resumed = [
        e for e in events_of(job_id) if e.kind == "trainer" and e.message.startswith("resumed")
    ]
    assert resumed and resumed[0].data["step"] == paused_at


def test_duplicate_messages_run_the_job_once(project_id, procs):
    from jobs.broker import enqueue_job

    job_id = insert_job(project_id, {"fake": {"steps": 6}})
    for _ in range(3):
        enqueue_job(job_id, "cpu")
    procs.worker("w1")
    procs.worker("w2")
    row = wait_for(lambda: _done(job_id), 60, "job to finish", procs)
    assert (row.status, row.attempt) == ("succeeded", 1)
    claims = [e for e in events_of(job_id) if e.kind == "transition" and e.to_status == "starting"]
    assert len(claims) == 1


def test_postgres_outage_delays_ingestion_but_loses_no_step(project_id, procs, ty_env):
    from worker_harness import TcpProxy

    proxy = TcpProxy()
    try:
        job_id = insert_job(project_id, {"fake": {"steps": 50, "step_seconds": 0.1}})
        procs.worker("w1", TUNEYARD_DATABASE_URL=proxy.url(ty_env["TUNEYARD_DATABASE_URL"]))
        wait_for(lambda: len(train_steps(job_id)) >= 5, 60, "first steps", procs)
        proxy.stop()
        seen = len(train_steps(job_id))
        time.sleep(2.5)
        run_dir = Path(job_row(job_id).run_dir)
        written = sum(1 for _ in (run_dir / "metrics.jsonl").open())
        assert written > seen + 5 and len(train_steps(job_id)) == seen  # waiting in the file
        proxy.start()
        row = wait_for(lambda: _done(job_id), 60, "job to finish after the outage", procs)
    finally:
        proxy.stop()
    assert (row.status, row.attempt) == ("succeeded", 1), procs.logs()
    assert train_steps(job_id) == list(range(1, 51))


def test_embedded_default_runs_without_postgres_or_redis(tmp_path, monkeypatch):
    """No TUNEYARD_DATABASE_URL / TUNEYARD_BROKER_URL: SQLite jobs DB + SQLite broker."""
    import os

    from worker_harness import FAKE_TRAINER, REPO, Procs, _reset_caches

    home = tmp_path / "home"
    for key in ("TUNEYARD_DATABASE_URL", "TUNEYARD_BROKER_URL", "TUNEYARD_RUNS_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TUNEYARD_HOME", str(home))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    _reset_caches()
    from jobs.broker import broker_url_for
    from jobs.store.engine import session_scope, upgrade_database
    from jobs.store.tables import Project

    upgrade_database()
    assert broker_url_for() == f"sqla+sqlite:///{home / 'broker.db'}"
    with session_scope() as session:
        session.add(Project(name="default"))
        session.flush()
        project = session.query(Project).one().id
    job_id = insert_job(project, {"fake": {"steps": 5}})
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEYARD_DATABASE")}
    procs = Procs(env, tmp_path)
    try:
        procs.start("w1", ["worker", "-Q", "cpu", "--name", "embedded"],
                    {"TUNEYARD_WORKER_TRAINER_MODULE": FAKE_TRAINER})  # fmt: skip
        row = wait_for(lambda: _done(job_id), 60, "embedded job to finish", procs)
    finally:
        procs.close()
        _reset_caches()
    assert row.status == "succeeded" and train_steps(job_id) == [1, 2, 3, 4, 5]
