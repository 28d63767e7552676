"""Retention reaches the artifact store, on PostgreSQL and a real SeaweedFS: a checkpoint the
trainer deletes (ingested by the supervisor) or the project's policy deletes loses its
stored copy and is no longer listed; a store that refuses keeps the work for the next pass;
a finished job's stored checkpoints are evicted from the local disk after the cache time
(never an unfinished job's, never one the store does not hold complete), recorded apart
from deletions, and a restore of an evicted checkpoint downloads it."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update
from worker_harness import insert_job

from jobs.artifacts.s3 import ArtifactStore
from jobs.orchestration.states import transition
from jobs.recipe.paths.stored import parse_store
from jobs.store.artifacts import list_artifacts
from jobs.store.engine import session_scope
from jobs.store.retention import set_policy
from jobs.store.tables import Artifact, Checkpoint, CheckpointDeletion, Job, utcnow
from worker.artifact_uploads import Upload, store_directory
from worker.config import WorkerConfig

PATH = {"running": ["starting", "running"], "succeeded": ["starting", "running", "succeeded"]}


@pytest.fixture
def store(store_env) -> ArtifactStore:
    return ArtifactStore(parse_store(store_env["TUNEYARD_ARTIFACT_STORE"]))


def _job(project_id: int, name: str, status: str, hours_ago: float) -> str:
    """A job in `status`, run in the runs directory as the worker lays it out."""
    with session_scope() as s:
        job = Job(project_id=project_id, name=name, spec={}, recipe={}, plan={},
                  resources={}, queue="cpu")  # fmt: skip
        s.add(job)
        s.flush()
        job.run_dir = str(Path(os.environ["TUNEYARD_RUNS_DIR"]) / job.id)
        for to in PATH[status]:
            owner = {"lease_owner": "w"} if to == "starting" else {}
            transition(s, job.id, to, reason="test", **owner)
        finished = utcnow() - timedelta(hours=hours_ago)
        s.execute(update(Job).where(Job.id == job.id).values(finished_at=finished))
        return job.id


def _checkpoint(store, job_id: str, run_dir: Path, step: int, stored: bool = True) -> Path:
    """A tiny published checkpoint (row and directory), uploaded with its artifact row."""
    path = run_dir / "checkpoints" / f"step_{step}"
    (path / "model").mkdir(parents=True)
    (path / "model" / "weights.bin").write_bytes(bytes([step]) * 64)
    (path / "trainer_state.json").write_text(json.dumps({"step": step}))
    with session_scope() as s:
        s.add(Checkpoint(job_id=job_id, attempt=1, step=step, path=str(path), size_bytes=100))
    if stored:
        store_directory(store, "default", job_id, Upload("checkpoint", f"step_{step}", step, path))
    return path


def _run(job_id: str) -> Path:
    with session_scope() as s:
        return Path(s.get(Job, job_id).run_dir)


def _artifact(job_id: str, step: int) -> Artifact:
    with session_scope() as s:
        stmt = select(Artifact).where(Artifact.job_id == job_id, Artifact.step == step)
        return s.scalars(stmt).one()


def _listed(job_id: str) -> list[str]:
    with session_scope() as s:
        return [a.name for a in list_artifacts(s, job_id)]


def _key(store: ArtifactStore, job_id: str, step: int) -> str:
    return store.location.key_of(_artifact(job_id, step).key)


def _client(env: dict[str, str], secret: str):  # noqa: ANN202 - a boto3 S3 client
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=secret,
    )


def _objects(store: ArtifactStore, key: str) -> list[str]:
    found = store.client.list_objects_v2(Bucket=store.bucket, Prefix=key)
    return [o["Key"] for o in found.get("Contents", [])]


def test_a_trainer_deletion_deletes_the_stored_copy_in_order_with_uploads(
    project_id, store, tmp_path: Path
) -> None:
    from jobs.orchestration.claims import claim_job
    from worker.artifact_uploads import ArtifactUploads
    from worker.launcher import LaunchSpec
    from worker.supervisor import AttemptSupervisor

    job_id = insert_job(project_id, {}, dispatch=False)
    with session_scope() as s:
        claim = claim_job(s, job_id, "w", 30.0, str(tmp_path / "run"))
    run_dir = Path(claim.run_dir)
    run_dir.mkdir(parents=True)
    kept = _checkpoint(store, job_id, run_dir, 4)
    step_2 = _checkpoint(store, job_id, run_dir, 2, stored=False)  # uploaded via the queue
    key_4 = _key(store, job_id, 4)
    events = [
        {"event": "checkpoint_saved", "step": 2, "path": str(step_2), "size_bytes": 7},
        {"event": "checkpoint_saved", "step": 4, "path": str(kept), "size_bytes": 7},
        {"event": "checkpoint_deleted", "step": 2, "path": str(step_2), "reason": "keep_last"},
    ]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    spec = LaunchSpec(job_id=job_id, attempt=claim.attempt, run_dir=run_dir)
    supervisor = AttemptSupervisor(claim, "w", WorkerConfig(), spec)
    supervisor.uploads = ArtifactUploads(store, job_id, "default")
    supervisor.ingest_once()
    supervisor.uploads.finish(lambda: True, every=0.05)
    uploads = supervisor.uploads
    assert (uploads.stored, uploads.deleted) == (["step_2", "step_4"], ["step_2"])
    key_2 = _key(store, job_id, 2)
    assert store.read_manifest(key_2) is None and _objects(store, key_2 + "/") == []
    assert _artifact(job_id, 2).deleted_at is not None
    assert store.read_manifest(key_4) is not None and _artifact(job_id, 4).deleted_at is None
    assert _listed(job_id) == ["step_4"]


def test_a_store_error_keeps_the_deletion_for_the_next_pass(
    project_id, store, store_env, tmp_path: Path, monkeypatch
) -> None:
    """The worker's delete is refused (wrong credentials): the copy is no longer listed, its
    row stays live; a retention pass the store refuses keeps it again; the next pass with
    the store answering deletes it."""
    import worker.retention
    from jobs.store.retention import TRAINER, record_deletion
    from worker.artifact_uploads import ArtifactUploads
    from worker.retention import apply_retention_once

    job_id = _job(project_id, "a", "running", 0)
    path = _checkpoint(store, job_id, _run(job_id), 3)
    key = _key(store, job_id, 3)
    with session_scope() as s:
        record_deletion(s, job_id, 3, str(path), TRAINER, "keep_last 1")
    denied = ArtifactStore(store.location, _client(store_env, secret="not-the-secret"))
    uploads = ArtifactUploads(denied, job_id, "default")
    uploads.submit_deletions([{"event": "checkpoint_deleted", "step": 3}])
    uploads.finish(lambda: True, every=0.05)
    assert (uploads.deleted, uploads.failed) == ([], ["step_3"])
    assert _listed(job_id) == [] and _artifact(job_id, 3).deleted_at is None

    with monkeypatch.context() as patch:  # the scheduler's store refuses too
        patch.setattr(worker.retention, "_store", lambda: denied)
        refused = worker.retention.apply_retention_once()
    assert refused.store_errors and refused.store_deleted == []
    assert _artifact(job_id, 3).deleted_at is None and store.read_manifest(key) is not None

    report = apply_retention_once()
    assert report.store_deleted == [_artifact(job_id, 3).key] and report.store_errors == []
    assert _artifact(job_id, 3).deleted_at is not None
    assert store.read_manifest(key) is None and _objects(store, key + "/") == []
    assert apply_retention_once().store_deleted == []  # done once


def test_a_policy_deletion_deletes_the_stored_copy(project_id, store, tmp_path: Path) -> None:
    from worker.retention import apply_retention_once

    job_id = _job(project_id, "old", "succeeded", hours_ago=24 * 10)
    _checkpoint(store, job_id, _run(job_id), 1)
    _checkpoint(store, job_id, _run(job_id), 2)  # LATEST: protected from the policy
    key_1, key_2 = _key(store, job_id, 1), _key(store, job_id, 2)
    with session_scope() as s:
        set_policy(s, project_id, max_bytes=None, max_age_days=5)
    try:
        report = apply_retention_once(config=WorkerConfig(checkpoint_cache_hours=10_000))
    finally:
        with session_scope() as s:
            set_policy(s, project_id, None, None)
    assert [(j, step) for j, step, _ in report.deleted] == [(job_id, 1)]
    assert report.store_deleted == [_artifact(job_id, 1).key] and report.evicted == []
    assert store.read_manifest(key_1) is None and _objects(store, key_1 + "/") == []
    assert _artifact(job_id, 1).deleted_at is not None
    assert store.read_manifest(key_2) is not None and _listed(job_id) == ["step_2"]


def test_only_finished_stored_checkpoints_are_evicted_after_the_cache_time(
    project_id, store, tmp_path: Path
) -> None:
    from worker.retention import apply_retention_once

    old = _job(project_id, "old", "succeeded", hours_ago=30)
    evicted = _checkpoint(store, old, _run(old), 1)
    unstored = _checkpoint(store, old, _run(old), 2, stored=False)
    changed = _checkpoint(store, old, _run(old), 3)
    with session_scope() as s:  # the store holds another content than was recorded
        s.execute(update(Artifact).where(Artifact.job_id == old, Artifact.step == 3)
                  .values(sha256="0" * 64))  # fmt: skip
    recent = _job(project_id, "recent", "succeeded", hours_ago=1)
    cached = _checkpoint(store, recent, _run(recent), 1)
    running = _job(project_id, "running", "running", hours_ago=100)
    live = _checkpoint(store, running, _run(running), 1)

    report = apply_retention_once(config=WorkerConfig(checkpoint_cache_hours=24))
    assert report.evicted == [(old, 1)] and report.deleted == []
    assert evicted.is_dir() and list(evicted.iterdir()) == []  # the name stays for LATEST
    for path in (unstored, changed, cached, live):
        assert (path / "model" / "weights.bin").is_file(), path
    with session_scope() as s:
        rows = dict(s.execute(select(Checkpoint.path, Checkpoint.evicted_at)).all())
        assert s.scalars(select(CheckpointDeletion)).all() == []  # evicted is not deleted
    assert rows[str(evicted)] is not None
    assert [rows[str(p)] for p in (unstored, changed, cached, live)] == [None] * 4
    assert store.read_manifest(_key(store, old, 1)) is not None
    assert _listed(old) == ["step_1", "step_3"]

    at_once = apply_retention_once(config=WorkerConfig(checkpoint_cache_hours=0))
    assert at_once.evicted == [(recent, 1)]  # 0: as soon as the job is finished and stored
    assert (live / "model" / "weights.bin").is_file()


def test_a_store_that_refuses_evicts_nothing(
    project_id, store, store_env, tmp_path: Path, monkeypatch
) -> None:
    import worker.retention

    job_id = _job(project_id, "done", "succeeded", hours_ago=100)
    paths = [_checkpoint(store, job_id, _run(job_id), step) for step in (1, 2)]
    denied = ArtifactStore(store.location, _client(store_env, secret="not-the-secret"))
    with monkeypatch.context() as patch:
        patch.setattr(worker.retention, "_store", lambda: denied)
        refused = worker.retention.apply_retention_once(
            config=WorkerConfig(checkpoint_cache_hours=0)
        )
    assert refused.evicted == [] and len(refused.store_errors) == 1  # stopped at the first
    assert all((p / "model" / "weights.bin").is_file() for p in paths)
    report = worker.retention.apply_retention_once(config=WorkerConfig(checkpoint_cache_hours=0))
    assert report.evicted == [(job_id, 1), (job_id, 2)]


def test_an_evicted_checkpoint_is_restored_from_the_store(
    project_id, store, tiny_assets, tmp_path: Path
) -> None:
    """`restore_from: {job, step}` submitted after the eviction still resolves (the emptied
    directory keeps its name) and the worker downloads the checkpoint before the launch."""
    from fastapi.testclient import TestClient
    from worker_harness import tiny_recipe

    from api.main import create_app
    from worker.artifact_uploads import RestoreFailed, restore_stored_checkpoint
    from worker.retention import apply_retention_once

    job_id = _job(project_id, "done", "succeeded", hours_ago=1)
    path = _checkpoint(store, job_id, _run(job_id), 5)
    weights = (path / "model" / "weights.bin").read_bytes()
    apply_retention_once(config=WorkerConfig(checkpoint_cache_hours=0))
    assert not (path / "model").exists()

    recipe = tiny_recipe(tiny_assets, 2)
    recipe["restore_from"] = {"job": job_id, "step": 5}
    body = {"name": "next", "recipe": recipe,
            "resources": {"nnodes": 1, "nproc_per_node": 1, "accelerator": "cpu"}}  # fmt: skip
    with TestClient(create_app()) as client:
        answer = client.post("/v1/jobs", json=body)
    assert answer.status_code == 201, answer.text
    submitted = answer.json()["recipe"]
    assert submitted["restore_from"] == {"path": str(path)}

    launched = restore_stored_checkpoint(submitted, tmp_path / "next")
    target = tmp_path / "next" / "restored" / f"{job_id}-step_5"
    assert launched["restore_from"] == {"path": str(target)}
    assert (target / "model" / "weights.bin").read_bytes() == weights
    assert submitted["restore_from"] == {"path": str(path)}  # the stored recipe is untouched

    store.delete(_key(store, job_id, 5))  # gone behind the database's back
    with pytest.raises(RestoreFailed, match="cannot restore"):
        restore_stored_checkpoint(submitted, tmp_path / "third")


def test_an_evicted_checkpoint_outside_this_workers_store_is_not_fetched(
    project_id, store, tmp_path: Path, monkeypatch
) -> None:
    """A worker whose TUNEYARD_ARTIFACT_STORE names another bucket says where the copy is."""
    from jobs.artifacts.manifest import ManifestError
    from jobs.store.settings import get_settings
    from worker.artifact_uploads import fetch_evicted_checkpoint
    from worker.retention import apply_retention_once

    job_id = _job(project_id, "moved", "succeeded", hours_ago=1)
    _checkpoint(store, job_id, _run(job_id), 3)
    apply_retention_once(config=WorkerConfig(checkpoint_cache_hours=0))
    monkeypatch.setenv("TUNEYARD_ARTIFACT_STORE", "s3://another-bucket/elsewhere")
    get_settings.cache_clear()
    with pytest.raises(ManifestError, match="was evicted: s3://.* is not a checkpoint of this"):
        fetch_evicted_checkpoint(job_id, 3, tmp_path / "fetched")
    assert not (tmp_path / "fetched").exists()
    assert fetch_evicted_checkpoint(job_id, 4, tmp_path / "never") is None  # not evicted


def test_the_checkpoints_api_says_which_are_stored_only(project_id, store, tmp_path: Path):
    from fastapi.testclient import TestClient

    from api.main import create_app
    from worker.retention import apply_retention_once

    job_id = _job(project_id, "done", "succeeded", hours_ago=1)
    _checkpoint(store, job_id, _run(job_id), 1)
    _checkpoint(store, job_id, _run(job_id), 2, stored=False)
    apply_retention_once(config=WorkerConfig(checkpoint_cache_hours=0))
    with TestClient(create_app()) as client:
        answer = client.get(f"/v1/jobs/{job_id}/checkpoints")
    assert answer.status_code == 200, answer.text
    rows = {c["step"]: c for c in answer.json()["data"]}
    assert rows[1]["stored_only"] is True and rows[1]["evicted_at"] is not None
    assert rows[2]["stored_only"] is False and rows[2]["evicted_at"] is None
    assert answer.json()["deleted"] == []
