"""Before a launch, an `s3://` restore_from is downloaded, verified against its manifest and
handed to the trainer as a local directory; any other recipe goes unchanged. Runs against
the session's SeaweedFS; the uploads' bookkeeping is tested with a real worker in
tests/integration/worker/test_artifact_store_job.py."""

from __future__ import annotations

import threading
import uuid

import pytest

from jobs.artifacts.s3 import ArtifactStore
from jobs.recipe.paths.stored import artifact_key, parse_store
from jobs.store.settings import get_settings
from worker.artifact_uploads import (
    LeaseLost,
    RestoreFailed,
    restore_stored_checkpoint,
    while_renewing,
)

JOB = str(uuid.uuid4())


@pytest.fixture
def stored(s3_server, monkeypatch, tmp_path) -> str:
    env = s3_server.env(prefix=f"u-{uuid.uuid4().hex[:8]}")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    store = ArtifactStore(parse_store(env["TUNEYARD_ARTIFACT_STORE"]))
    source = tmp_path / "source"
    source.mkdir()
    (source / "trainer_state.json").write_text('{"step": 4}')
    key = artifact_key(store.location, "p", JOB, "checkpoint", "step_4")
    yield store.upload_directory(
        source, key, job_id=JOB, kind="checkpoint", name="step_4", step=4
    ).url
    get_settings.cache_clear()


def test_a_local_restore_from_is_left_alone(tmp_path) -> None:
    recipe = {"restore_from": {"path": "LATEST"}}
    assert restore_stored_checkpoint(recipe, tmp_path) is recipe
    assert restore_stored_checkpoint({"restore_from": None}, tmp_path) == {"restore_from": None}


def test_a_stored_checkpoint_is_downloaded_and_named_locally(stored, tmp_path) -> None:
    recipe = {"restore_from": {"path": stored}, "other": 1}
    launched = restore_stored_checkpoint(recipe, tmp_path / "run")
    target = tmp_path / "run" / "restored" / f"{JOB}-step_4"
    assert launched == {"restore_from": {"path": str(target)}, "other": 1}
    assert (target / "trainer_state.json").read_text() == '{"step": 4}'
    assert recipe["restore_from"] == {"path": stored}  # the stored recipe is not changed


def test_a_checkpoint_without_a_manifest_is_not_restored(stored, tmp_path) -> None:
    missing = stored.replace("step_4", "step_5")
    with pytest.raises(RestoreFailed, match="has no manifest"):
        restore_stored_checkpoint({"restore_from": {"path": missing}}, tmp_path)
    outside = "s3://elsewhere/x/projects/p/jobs/" + JOB + "/checkpoints/step_4"
    with pytest.raises(RestoreFailed, match="not a checkpoint of this worker's store"):
        restore_stored_checkpoint({"restore_from": {"path": outside}}, tmp_path)


def test_a_misconfigured_store_fails_the_restore_with_the_setting_named(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("TUNEYARD_ARTIFACT_STORE", "bucket-without-scheme")
    get_settings.cache_clear()
    try:
        with pytest.raises(RestoreFailed, match="TUNEYARD_ARTIFACT_STORE: .* is not an s3://"):
            restore_stored_checkpoint({"restore_from": {"path": "s3://b/x"}}, tmp_path)
    finally:
        get_settings.cache_clear()


def test_while_renewing_renews_until_done_and_hands_back_errors() -> None:
    release, renewals = threading.Event(), []

    def renew() -> bool:
        renewals.append(1)
        release.set()
        return True

    assert while_renewing(lambda: release.wait(5) and "done", renew, every=0.01) == "done"
    assert renewals
    with pytest.raises(ValueError, match="boom"):
        while_renewing(lambda: (_ for _ in ()).throw(ValueError("boom")), renew, every=0.01)
    stuck = threading.Event()
    with pytest.raises(LeaseLost, match="lost its lease"):
        while_renewing(lambda: stuck.wait(5), lambda: False, every=0.01)
    stuck.set()


def test_the_upload_thread_ends_when_its_queue_is_empty(s3_server, tmp_path) -> None:
    """A checkpoint pruned before its upload is skipped; no thread outlives the queue."""
    from worker.artifact_uploads import ArtifactUploads

    store = ArtifactStore(parse_store(f"s3://{s3_server.bucket}/u"), s3_server.client())
    uploads = ArtifactUploads(store, JOB, "p")
    events = [{"event": "checkpoint_saved", "step": s, "path": str(tmp_path / f"step_{s}")}
              for s in (1, 2, 2)]  # fmt: skip
    uploads.submit_checkpoints([*events, {"event": "started", "step": 0}])
    uploads.finish(lambda: True, every=0.01)
    assert (uploads.stored, uploads.failed) == ([], [])
    assert not any(t.name == f"uploads-{JOB[:8]}" for t in threading.enumerate())
