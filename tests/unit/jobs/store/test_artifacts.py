"""`artifacts` rows on both backends: one row per job, kind and name however often an upload
is recorded, listed checkpoints by step then exports, and the checkpoints still to store."""

from __future__ import annotations

from jobs.store import queries as store
from jobs.store.artifacts import (
    ArtifactRecord,
    checkpoints_to_store,
    find_artifact,
    list_artifacts,
    project_of_job,
    record_artifact,
)
from jobs.store.ingest import upsert_checkpoints


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
