"""A job's artifacts through the API and the CLI, against a real SeaweedFS: the list, the
presigned download links (owning project only: another project's job is the same 404 as a
missing one), `restore_from` naming a stored checkpoint at submit, and `tuneyard artifacts`
/ `tuneyard download` verifying what they fetch."""

from __future__ import annotations

import copy
import hashlib
import json
import uuid

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.main import create_app
from cli import artifact_cmds
from cli.http_client import TuneyardClient
from cli.main import app as cli_app
from jobs.artifacts.s3 import ArtifactStore
from jobs.recipe.paths.stored import artifact_key, parse_store
from jobs.store.artifacts import ArtifactRecord, record_artifact

STATE = b'{"step": 3}'


@pytest.fixture
def store_url(s3_server, monkeypatch) -> str:
    env = s3_server.env(prefix=f"api-{uuid.uuid4().hex[:8]}")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env["TUNEYARD_ARTIFACT_STORE"]


@pytest.fixture
def api(stack, store_url):
    settings = stack.settings.model_copy(update={"artifact_store": store_url})
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture
def stored_job(api, stack, body, store_url, tmp_path) -> dict:
    """A job of project A with checkpoint step_3 in the store and its artifacts row."""
    created = api.post("/v1/jobs", json=body, headers=stack.headers("submit"))
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    source = tmp_path / "step_3"
    (source / "model").mkdir(parents=True)
    (source / "trainer_state.json").write_bytes(STATE)
    (source / "model" / "weights.bin").write_bytes(b"w" * 3000)
    store = ArtifactStore(parse_store(store_url))
    key = artifact_key(store.location, stack.project, job_id, "checkpoint", "step_3")
    stored = store.upload_directory(
        source, key, job_id=job_id, kind="checkpoint", name="step_3", step=3
    )
    with stack.session() as session:
        record_artifact(session, ArtifactRecord(
            job_id=job_id, kind="checkpoint", name="step_3", step=3, key=stored.url,
            size_bytes=stored.manifest.size, sha256=stored.manifest_sha256,
            files=[f.model_dump() for f in stored.manifest.files],
        ))  # fmt: skip
        session.commit()
    return {"id": job_id, "url": stored.url, "sha256": stored.manifest_sha256}


def test_a_jobs_stored_artifacts_are_listed(api, stack, stored_job) -> None:
    answer = api.get(f"/v1/jobs/{stored_job['id'][:8]}/artifacts", headers=stack.headers("read"))
    assert answer.status_code == 200, answer.text
    (row,) = answer.json()["data"]
    assert {k: row[k] for k in ("name", "kind", "step", "size_bytes", "files", "key")} == {
        "name": "step_3", "kind": "checkpoint", "step": 3, "size_bytes": 3011, "files": 2,
        "key": stored_job["url"],
    }  # fmt: skip
    assert row["sha256"] == stored_job["sha256"] and row["created_at"]


def test_download_links_fetch_each_file_without_credentials(api, stack, stored_job) -> None:
    path = f"/v1/jobs/{stored_job['id']}/artifacts/step_3/download"
    answer = api.get(path, headers=stack.headers("read"))
    assert answer.status_code == 200, answer.text
    links = {f["path"]: f for f in answer.json()["files"]}
    assert sorted(links) == ["model/weights.bin", "trainer_state.json"]
    fetched = httpx.get(links["trainer_state.json"]["url"])
    assert fetched.status_code == 200 and fetched.content == STATE
    assert links["trainer_state.json"]["sha256"] == hashlib.sha256(STATE).hexdigest()


@pytest.mark.parametrize("suffix", ["", "/step_3/download"])
def test_another_projects_job_is_the_same_404_as_a_missing_one(api, stack, stored_job, suffix):
    other = api.get(
        f"/v1/jobs/{stored_job['id']}/artifacts{suffix}", headers=stack.headers("other")
    )
    missing_id = str(uuid.uuid4())
    missing = api.get(f"/v1/jobs/{missing_id}/artifacts{suffix}", headers=stack.headers("read"))
    assert other.status_code == missing.status_code == 404
    assert other.json() == json.loads(missing.text.replace(missing_id, stored_job["id"]))


def test_an_unknown_artifact_is_404_and_a_server_without_a_store_says_so(
    api, stack, stored_job
) -> None:
    path = f"/v1/jobs/{stored_job['id']}/artifacts"
    assert api.get(f"{path}/step_4/download", headers=stack.headers("read")).status_code == 404
    assert api.get(f"{path}/..%2Fx/download", headers=stack.headers("read")).status_code in (
        404,
        422,
    )
    for store in (None, "http://not-s3/x"):  # none, or a setting that names no store
        settings = stack.settings.model_copy(update={"artifact_store": store})
        with TestClient(create_app(settings)) as plain:
            answer = plain.get(f"{path}/step_3/download", headers=stack.headers("read"))
        assert answer.status_code == 503 and "TUNEYARD_ARTIFACT_STORE" in answer.text


def test_restore_from_a_stored_checkpoint_is_checked_at_submit(api, stack, body, stored_job):
    restoring = copy.deepcopy(body)
    restoring["recipe"]["restore_from"] = {"path": stored_job["url"]}
    own = api.post("/v1/jobs", json=restoring, headers=stack.headers("submit"))
    assert own.status_code == 201, own.text
    other = api.post("/v1/jobs", json=restoring, headers=stack.headers("other"))
    assert other.status_code == 422
    (error,) = other.json()["errors"]
    assert (
        error["loc"] == "restore_from.path"
        and "is not a stored checkpoint of project" in error["msg"]
    )


@pytest.fixture
def cli(api, stack, monkeypatch):
    """`tuneyard` with its HTTP client routed to the in-process app, as project A's reader."""

    def connect(ctx, server, api_key):
        client = TuneyardClient("http://testserver")
        client.http = api
        api.headers.update(stack.headers("read"))
        return client

    monkeypatch.setattr(artifact_cmds, "connect", connect)
    return lambda *args: CliRunner().invoke(cli_app, list(args))


def test_cli_lists_and_downloads_verified(cli, stored_job, tmp_path) -> None:
    listed = cli("artifacts", stored_job["id"], "--json")
    assert listed.exit_code == 0, listed.output
    assert [a["name"] for a in json.loads(listed.output)["data"]] == ["step_3"]
    assert "step_3" in cli("artifacts", stored_job["id"]).output
    out = tmp_path / "got"
    done = cli("download", stored_job["id"], "step_3", "-o", str(out), "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["verified"] is True
    assert (out / "trainer_state.json").read_bytes() == STATE
    assert (out / "model" / "weights.bin").read_bytes() == b"w" * 3000


def test_cli_download_of_a_changed_object_fails_and_leaves_no_file(
    cli, stored_job, s3_server, tmp_path
) -> None:
    bucket, _, key = stored_job["url"].removeprefix("s3://").partition("/")
    s3_server.client().put_object(Bucket=bucket, Key=f"{key}/trainer_state.json", Body=b"{}")
    out = tmp_path / "got"
    done = cli("download", stored_job["id"], "step_3", "-o", str(out))
    assert done.exit_code == 1 and "another SHA-256 than listed" in done.output
    assert not (out / "trainer_state.json").exists()
    assert not (out / "trainer_state.json.part").exists()
    missing = cli("download", stored_job["id"], "step_9", "-o", str(out))
    assert missing.exit_code == 2 and "not found" in missing.output
