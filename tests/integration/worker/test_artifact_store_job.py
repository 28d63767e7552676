"""Checkpoints in the artifact store, end to end: a real worker, PostgreSQL, Redis and
SeaweedFS. A job's published checkpoints land in the bucket, each with its manifest; a new
job whose `restore_from` names one of them starts from it, downloaded and verified; a stored
checkpoint changed behind its manifest's back fails the launch instead of training from it;
checkpoints an earlier attempt published without storing are stored by the next one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from worker_harness import insert_job, job_row, train_steps, wait_for

from jobs.artifacts.manifest import parse_manifest

pytestmark = pytest.mark.slow
SETTLED = ("succeeded", "failed", "cancelled")


def _artifacts(job_id: str) -> list:
    from sqlalchemy import select

    from jobs.store.engine import session_factory
    from jobs.store.tables import Artifact

    with session_factory()() as session:
        stmt = select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.step)
        return list(session.scalars(stmt))


def _settled(job_id: str, procs, timeout: float = 120.0):
    return wait_for(lambda: (r := job_row(job_id)).status in SETTLED and r, timeout, job_id, procs)


def _object(s3_server, url: str) -> bytes:
    bucket, _, key = url.removeprefix("s3://").partition("/")
    return s3_server.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def test_checkpoints_land_in_the_bucket_and_a_new_job_restores_from_one(
    s3_server, store_env, procs, project_id
) -> None:
    procs.worker("w1", **store_env)
    first = insert_job(project_id, {"fake": {"steps": 10, "ckpt_every": 5}})
    assert _settled(first, procs).status == "succeeded", procs.logs()
    stored = _artifacts(first)  # stored before the job settled
    assert [(a.kind, a.name, a.step) for a in stored] == [
        ("checkpoint", "step_5", 5), ("checkpoint", "step_10", 10),
    ]  # fmt: skip
    prefix = store_env["TUNEYARD_ARTIFACT_STORE"]
    assert stored[0].key == f"{prefix}/projects/default/jobs/{first}/checkpoints/step_5"
    manifest = parse_manifest(_object(s3_server, stored[0].key + ".manifest.json"))
    assert [f.path for f in manifest.files] == ["state.json"]
    assert manifest.sha256() == stored[0].sha256
    assert json.loads(_object(s3_server, stored[0].key + "/state.json")) == {"step": 5}

    second = insert_job(project_id, {"fake": {"steps": 8}, "restore_from": {"path": stored[0].key}})
    row = _settled(second, procs)
    assert row.status == "succeeded", (row.error_message, procs.logs())
    assert train_steps(second) == [6, 7, 8]  # went on from the stored step 5
    restored = Path(row.run_dir) / "restored" / f"{first}-step_5"
    assert json.loads((restored / "state.json").read_text()) == {"step": 5}
    launched = json.loads((Path(row.run_dir) / "recipe.json").read_text())
    assert launched["restore_from"] == {"path": str(restored)}

    # a stored checkpoint changed behind its manifest's back is not trained from
    bucket, _, key = stored[1].key.removeprefix("s3://").partition("/")
    s3_server.client().put_object(Bucket=bucket, Key=key + "/state.json", Body=b'{"step":9}')
    third = insert_job(project_id, {"fake": {"steps": 12}, "restore_from": {"path": stored[1].key}})
    row = _settled(third, procs)
    assert (row.status, row.error_code) == ("failed", "launch_failed")
    assert "state.json: SHA-256 differs from the manifest" in row.error_message
    assert train_steps(third) == []


def test_an_attempt_stores_what_an_earlier_one_published_but_did_not_store(
    s3_server, store_env, procs, project_id
) -> None:
    """The first attempt runs on a worker without the store and is paused after its first
    checkpoint; the attempt that finishes the job stores every checkpoint of the job."""
    from jobs.broker import enqueue_job
    from jobs.orchestration.states import transition
    from jobs.store.engine import session_factory, session_scope
    from jobs.store.queries import list_checkpoints

    procs.worker("plain", TUNEYARD_ARTIFACT_STORE="")  # no store on this worker
    job = insert_job(project_id, {"fake": {"steps": 10, "ckpt_every": 5, "step_seconds": 0.2}})
    wait_for(lambda: 6 in train_steps(job), 120, "the first checkpoint", procs)
    with session_scope() as session:
        transition(session, job, "pausing", reason="test pauses")
    wait_for(lambda: job_row(job).status == "paused", 60, "the pause", procs)
    procs.kill("plain")
    assert _artifacts(job) == []
    procs.worker("w1", **store_env)
    with session_scope() as session:
        transition(session, job, "queued", reason="test resumes")
    enqueue_job(job, "cpu")
    row = _settled(job, procs)
    assert row.status == "succeeded", (row.error_message, procs.logs())
    with session_factory()() as session:
        published = [f"step_{c.step}" for c in list_checkpoints(session, job)]
    names = [a.name for a in _artifacts(job)]
    assert {"step_5", "step_10"} <= set(names) and sorted(names) == sorted(published)


def test_an_export_directory_is_stored_with_its_manifest(
    s3_server, store_env, project_id, tmp_path, monkeypatch
) -> None:
    from jobs.store.settings import get_settings
    from worker.artifact_uploads import store_export

    job = insert_job(project_id, {"fake": {}}, dispatch=False)
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text("{}")
    (export / "model.safetensors").write_bytes(b"s" * 100)
    url = store_export(job, "exp-1", export)
    (row,) = _artifacts(job)
    assert (row.kind, row.name, row.step, row.key, row.size_bytes) == (
        "export", "exp-1", None, url, 102,
    )  # fmt: skip
    assert url.endswith(f"/projects/default/jobs/{job}/exports/exp-1")
    manifest = parse_manifest(_object(s3_server, url + ".manifest.json"))
    assert [f.path for f in manifest.files] == ["config.json", "model.safetensors"]
    monkeypatch.setenv("TUNEYARD_ARTIFACT_STORE", "")
    get_settings.cache_clear()
    assert store_export(job, "exp-2", export) is None
