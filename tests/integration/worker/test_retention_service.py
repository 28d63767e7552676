"""The checkpoint retention service on PostgreSQL (`worker.retention`): a project's policy
deletes its finished jobs' checkpoints beyond max_age_days, then the oldest jobs' until
max_bytes holds; never LATEST, a kept-best one, one an unfinished job restores from, a
running job's, or a path outside its own job's run directory; each deletion is recorded
once, with its reason, and a second pass deletes nothing more."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select, update
from worker_harness import insert_job, tiny_recipe

from jobs.orchestration.states import transition
from jobs.store.engine import session_scope
from jobs.store.retention import set_policy
from jobs.store.tables import Checkpoint, CheckpointDeletion, Job, utcnow

STATUS_PATH = {
    "queued": [],
    "running": ["starting", "running"],
    "succeeded": ["starting", "running", "succeeded"],
    "failed": ["starting", "running", "failed"],
}


def _job(project_id: int, tmp: Path, name: str, status: str, recipe: dict, days_ago: float) -> str:
    with session_scope() as s:
        job = Job(
            project_id=project_id,
            name=name,
            spec={},
            recipe=recipe,
            plan={},
            resources={},
            queue="cpu",
            run_dir=str(tmp / name),
        )
        s.add(job)
        s.flush()
        for to in STATUS_PATH[status]:
            transition(
                s, job.id, to, reason="test", **({"lease_owner": "w"} if to == "starting" else {})
            )
        finished = utcnow() - timedelta(days=days_ago)
        s.execute(update(Job).where(Job.id == job.id).values(finished_at=finished))
        return job.id


def _checkpoints(job_id: str, root: Path, steps: dict[int, float | None], size: int = 100) -> None:
    with session_scope() as s:
        for step, val in steps.items():
            path = root / f"step_{step}"
            path.mkdir(parents=True, exist_ok=True)
            metrics = {"loss": 1.0} if val is None else {"loss": 1.0, "val_loss": val}
            s.add(
                Checkpoint(
                    job_id=job_id,
                    attempt=1,
                    step=step,
                    path=str(path),
                    size_bytes=size,
                    metrics=metrics,
                )
            )


def test_policy_deletes_by_age_then_bytes_and_protects_what_it_must(
    project_id, tiny_assets, tmp_path: Path
):
    from worker.retention import apply_retention_once

    best_one = tiny_recipe(tiny_assets, 30, checkpoint_every=10)
    best_one["checkpoint"]["keep_best"] = {"metric": "val_loss", "mode": "min", "k": 1}
    a = _job(project_id, tmp_path, "a", "succeeded", best_one, days_ago=10)
    _checkpoints(a, tmp_path / "a" / "checkpoints", {10: 1.0, 20: 2.0, 30: 3.0})
    b = _job(project_id, tmp_path, "b", "succeeded", {}, days_ago=1)  # no rules: keeps all
    _checkpoints(b, tmp_path / "b" / "checkpoints", {5: None, 15: None, 25: None})
    c = _job(project_id, tmp_path, "c", "failed", {}, days_ago=2)
    _checkpoints(c, tmp_path / "c" / "checkpoints", {1: None, 2: None})
    restoring = {"restore_from": {"path": str(tmp_path / "c" / "checkpoints" / "step_1")}}
    _job(project_id, tmp_path, "d", "queued", restoring, days_ago=0)
    e = _job(project_id, tmp_path, "e", "running", {}, days_ago=30)
    _checkpoints(e, tmp_path / "e" / "checkpoints", {1: None, 2: None, 3: None})
    f = _job(project_id, tmp_path, "f", "succeeded", {}, days_ago=20)
    _checkpoints(f, tmp_path / "elsewhere", {7: None}, size=0)  # not in f's run dir
    _checkpoints(f, tmp_path / "f" / "checkpoints", {8: None}, size=0)
    with session_scope() as s:
        set_policy(s, project_id, max_bytes=500, max_age_days=5)
    try:
        _check_policy_pass(apply_retention_once, tmp_path, a, b, f)
    finally:
        with session_scope() as s:  # later tests of this database run without a policy
            set_policy(s, project_id, None, None)


def _check_policy_pass(apply_retention_once, tmp_path: Path, a: str, b: str, f: str) -> None:
    report = apply_retention_once()
    assert sorted((j, step) for j, step, _ in report.deleted) == sorted([(a, 20), (b, 5), (b, 15)])
    assert [(j, step) for j, step, _ in report.refused] == [(f, 7)]
    on_disk = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("*/*/step_*"))
    on_disk += sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("elsewhere/step_*"))
    assert on_disk == [
        "a/checkpoints/step_10",
        "a/checkpoints/step_30",
        "b/checkpoints/step_25",
        "c/checkpoints/step_1",
        "c/checkpoints/step_2",
        "e/checkpoints/step_1",
        "e/checkpoints/step_2",
        "e/checkpoints/step_3",
        "f/checkpoints/step_8",
        "elsewhere/step_7",
    ]
    with session_scope() as s:
        rows = s.execute(
            select(
                CheckpointDeletion.job_id,
                CheckpointDeletion.step,
                CheckpointDeletion.source,
                CheckpointDeletion.reason,
            )
        ).all()
    reasons = {(j, step): (source, reason) for j, step, source, reason in rows}
    assert set(reasons) == {(a, 20), (b, 5), (b, 15)}
    assert reasons[(a, 20)][0] == "policy" and "max_age_days 5" in reasons[(a, 20)][1]
    assert "over max_bytes 500" in reasons[(b, 5)][1]

    again = apply_retention_once()
    assert again.deleted == [] and [(j, s) for j, s, _ in again.refused] == [(f, 7)]


def test_without_a_policy_nothing_is_deleted(project_id, tmp_path: Path):
    from worker.retention import apply_retention_once

    old = _job(project_id, tmp_path, "old", "succeeded", {}, days_ago=400)
    _checkpoints(old, tmp_path / "old" / "checkpoints", {1: None, 2: None})
    with session_scope() as s:
        set_policy(s, project_id, None, None)
    assert apply_retention_once().deleted == []
    assert len(list((tmp_path / "old" / "checkpoints").glob("step_*"))) == 2


def test_the_worker_ingests_the_trainers_deletions_once(project_id, tmp_path: Path):
    """`checkpoint_deleted` lines of `events.jsonl` become deletion records (source
    trainer) through the supervisor's ingestion; reading them again adds nothing."""
    from jobs.orchestration.claims import claim_job
    from worker.config import WorkerConfig
    from worker.launcher import LaunchSpec
    from worker.supervisor import AttemptSupervisor

    job_id = insert_job(project_id, {}, dispatch=False)
    with session_scope() as s:
        claim = claim_job(s, job_id, "w", 30.0, str(tmp_path / "run"))
    run_dir = Path(claim.run_dir)
    run_dir.mkdir(parents=True)
    saved = {"event": "checkpoint_saved", "step": 4, "path": "/c/step_4", "size_bytes": 7}
    gone = {"event": "checkpoint_deleted", "step": 2, "path": "/c/step_2", "reason": "why"}
    first = {**saved, "step": 2, "path": "/c/step_2"}
    lines = [json.dumps(e) for e in (first, saved, gone)]
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")
    spec = LaunchSpec(job_id=job_id, attempt=claim.attempt, run_dir=run_dir)
    supervisor = AttemptSupervisor(claim, "w", WorkerConfig(), spec)
    supervisor.ingest_once()
    supervisor.ingest_once()
    with session_scope() as s:
        columns = (CheckpointDeletion.step, CheckpointDeletion.source, CheckpointDeletion.reason)
        query = select(*columns, CheckpointDeletion.size_bytes)
        rows = s.execute(query.where(CheckpointDeletion.job_id == job_id)).all()
    assert [tuple(r) for r in rows] == [(2, "trainer", "why", 7)]
