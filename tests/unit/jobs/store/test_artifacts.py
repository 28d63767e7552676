"""`artifacts` rows on both backends: one row per job, kind and name however often an upload
is recorded, listed checkpoints by step then exports, and the checkpoints still to store;
a deleted checkpoint's copy unlisted at once and kept to delete until marked; which
checkpoints may be evicted, and where an evicted one is fetched from."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from jobs.store import queries as store
from jobs.store.artifacts import (
    ArtifactRecord,
    checkpoints_to_store,
    evictable_checkpoints,
    evicted_checkpoint_at,
    find_artifact,
    list_artifacts,
    mark_deleted,
    mark_evicted,
    project_of_job,
    record_artifact,
    stored_copies_to_delete,
    stored_copy,
)
from jobs.store.ingest import upsert_checkpoints
from jobs.store.retention import POLICY, record_deletion
from jobs.store.tables import Job, utcnow


def _job(session, project) -> str:
    job, _ = store.create_job(session, project.id, store.NewJob(
        name="j", spec={}, recipe={}, plan={}, resources={}, queue="cpu"))  # fmt: skip
    return job.id


def _record(job_id: str, kind: str, name: str, step: int | None, sha: str = "a") -> ArtifactRecord:
    files = [{"path": "f", "size": 3, "sha256": sha * 64}]
    return ArtifactRecord(job_id, kind, name, step, f"s3://b/{name}", 3, sha * 64, files)


def test_an_upload_recorded_twice_is_one_row_with_the_last_values(session, project) -> None:
    job_id = _job(session, project)
    record_artifact(session, _record(job_id, "checkpoint", "step_10", 10, "a"))
    record_artifact(session, _record(job_id, "export", "exp", None))
    record_artifact(session, _record(job_id, "checkpoint", "step_2", 2))
    record_artifact(session, _record(job_id, "checkpoint", "step_10", 10, "b"))
    session.commit()
    rows = list_artifacts(session, job_id)
    assert [(r.kind, r.name) for r in rows] == [
        ("checkpoint", "step_2"), ("checkpoint", "step_10"), ("export", "exp"),
    ]  # fmt: skip
    assert rows[1].sha256 == "b" * 64 and rows[1].files == {"files": [
        {"path": "f", "size": 3, "sha256": "b" * 64}]}  # fmt: skip
    assert find_artifact(session, job_id, "exp").kind == "export"
    assert find_artifact(session, job_id, "step_3") is None
    assert project_of_job(session, job_id) == project.name


def test_checkpoints_to_store_are_the_published_ones_without_a_row(session, project) -> None:
    job_id = _job(session, project)
    events = [{"event": "checkpoint_saved", "step": s, "path": f"/r/step_{s}"} for s in (5, 10, 15)]
    upsert_checkpoints(session, job_id, 1, events)
    record_artifact(session, _record(job_id, "checkpoint", "step_10", 10))
    record_artifact(session, _record(job_id, "export", "step_5", None))  # not a checkpoint
    session.commit()
    assert checkpoints_to_store(session, job_id) == [(5, "/r/step_5"), (15, "/r/step_15")]


def test_a_deleted_checkpoint_is_unlisted_at_once_and_kept_to_delete_until_marked(
    session, project
) -> None:
    job_id = _job(session, project)
    events = [{"event": "checkpoint_saved", "step": s, "path": f"/r/step_{s}"} for s in (1, 2)]
    upsert_checkpoints(session, job_id, 1, events)
    for step in (1, 2):
        record_artifact(session, _record(job_id, "checkpoint", f"step_{step}", step))
    record_artifact(session, _record(job_id, "export", "step_1", None))  # same name, export
    record_deletion(session, job_id, 1, "/r/step_1", POLICY, "old")
    session.commit()
    assert [(a.kind, a.name) for a in list_artifacts(session, job_id)] == [
        ("checkpoint", "step_2"), ("export", "step_1"),
    ]  # fmt: skip
    assert find_artifact(session, job_id, "step_1").kind == "export"
    pending = stored_copies_to_delete(session, job_id)
    assert [url for _, url in pending] == ["s3://b/step_1"]
    assert pending[0] in stored_copies_to_delete(session)  # every job's
    mark_deleted(session, pending[0][0])
    session.commit()
    assert stored_copies_to_delete(session, job_id) == []
    assert checkpoints_to_store(session, job_id) == []  # a deleted one is not stored again


def test_only_finished_jobs_stored_checkpoints_are_evictable(session, project) -> None:
    done, running = _job(session, project), _job(session, project)
    for job_id in (done, running):
        events = [{"event": "checkpoint_saved", "step": s, "path": f"/{job_id}/step_{s}"}
                  for s in (1, 2, 3)]  # fmt: skip
        upsert_checkpoints(session, job_id, 1, events)
        for step in (1, 2):
            record_artifact(session, _record(job_id, "checkpoint", f"step_{step}", step))
    finished = utcnow() - timedelta(hours=5)
    session.execute(
        update(Job).where(Job.id == done).values(status="succeeded", finished_at=finished)
    )
    session.execute(update(Job).where(Job.id == running).values(status="running"))
    record_deletion(session, done, 2, f"/{done}/step_2", POLICY, "old")
    session.commit()
    assert evictable_checkpoints(session, utcnow() - timedelta(hours=6)) == []  # too recent
    found = evictable_checkpoints(session, utcnow() - timedelta(hours=4))
    assert [(c.job_id, c.step, c.key) for c in found] == [(done, 1, "s3://b/step_1")]
    assert stored_copy(session, done, 1) is None  # not evicted: read it locally
    mark_evicted(session, found[0].checkpoint_id)
    session.commit()
    assert evictable_checkpoints(session, utcnow()) == []
    assert stored_copy(session, done, 1) == "s3://b/step_1"
    assert evicted_checkpoint_at(session, f"/{done}/step_1") == (done, 1)
    assert evicted_checkpoint_at(session, f"/{running}/step_1") is None
