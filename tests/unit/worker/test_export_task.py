"""worker.export_task's upload step: with an artifact store set, a published export that
cannot be stored is a reason (the export is settled as a crash and retried), never a
`succeeded` export missing from the store; a stored one gives no reason. Real SQLite
database and a real SeaweedFS (the session's), whose missing bucket makes the failure."""

from __future__ import annotations

import pytest

from jobs.store.engine import session_scope, upgrade_database
from jobs.store.exports import create_export
from jobs.store.settings import get_settings
from jobs.store.tables import Job, Project
from worker.export_task import _store


@pytest.fixture
def export_dir(tmp_path, monkeypatch):
    """An export row (of a job of project `p`) in a fresh SQLite database, and its files."""
    monkeypatch.setenv("TUNEYARD_DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite'}")
    get_settings.cache_clear()
    upgrade_database()
    with session_scope() as session:
        project = Project(name="p")
        session.add(project)
        session.flush()
        job = Job(project_id=project.id, name="j")
        session.add(job)
        session.flush()
        export_id = create_export(session, job, 4, "merged", True, "float32").id
    out = tmp_path / "exports" / export_id
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"weights")
    yield export_id, out
    get_settings.cache_clear()


def _use_store(monkeypatch, s3_server, url: str) -> None:
    for key, value in {**s3_server.env(), "TUNEYARD_ARTIFACT_STORE": url}.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()


def test_an_export_the_store_refuses_is_a_reason_to_retry(export_dir, s3_server, monkeypatch):
    export_id, out = export_dir
    _use_store(monkeypatch, s3_server, "s3://no-such-bucket/t")
    problem = _store(export_id, out)
    assert problem and problem.startswith("the export could not be uploaded")


def test_a_stored_export_gives_no_reason(export_dir, s3_server, monkeypatch):
    export_id, out = export_dir
    _use_store(monkeypatch, s3_server, f"s3://{s3_server.bucket}/t")
    assert _store(export_id, out) is None
    key = "t/projects/p/jobs/"
    listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=key)
    assert any(o["Key"].endswith("model.safetensors") for o in listed.get("Contents", []))


def test_without_a_store_nothing_is_uploaded(export_dir, monkeypatch):
    export_id, out = export_dir
    monkeypatch.setenv("TUNEYARD_ARTIFACT_STORE", "")
    get_settings.cache_clear()
    assert _store(export_id, out) is None
