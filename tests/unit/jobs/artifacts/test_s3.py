"""The artifact store against a real SeaweedFS: a directory goes up with its manifest last
(multipart for big files, resumable, idempotent), comes down verified, and an upload without
its manifest, or an object changed behind the manifest's back, is never taken as complete;
a delete removes the manifest before any object, every object in batches, and again is a
no-op."""

from __future__ import annotations

import os
import uuid

import pytest

from jobs.artifacts import s3 as s3_module
from jobs.artifacts.manifest import ManifestError
from jobs.artifacts.s3 import ArtifactStore, manifest_key
from jobs.recipe.paths.stored import StoreLocation


class CountingClient:
    """A real boto3 client that counts the files it uploads."""

    def __init__(self, client) -> None:
        self._client, self.uploads = client, []

    def upload_file(self, path, bucket, key, **kwargs):
        self.uploads.append(key.rsplit("/", 1)[-1])
        return self._client.upload_file(path, bucket, key, **kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)


@pytest.fixture
def store(s3_server) -> ArtifactStore:
    location = StoreLocation(s3_server.bucket, f"t-{uuid.uuid4().hex[:8]}")
    return ArtifactStore(location, CountingClient(s3_server.client()))


def _checkpoint(root, big: int = 0):
    (root / "model").mkdir(parents=True)
    (root / "model" / "weights.bin").write_bytes(os.urandom(big or 4096))
    (root / "trainer_state.json").write_text('{"step": 2}')
    return root


def _upload(store, directory, key):
    return store.upload_directory(
        directory, key, job_id="j", kind="checkpoint", name="step_2", step=2
    )


def test_a_directory_round_trips_verified(store, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(s3_module, "MULTIPART_BYTES", 5 * 1024 * 1024)  # S3's smallest part
    source = _checkpoint(tmp_path / "step_2", big=11 * 1024 * 1024)  # three parts
    key = f"{store.location.prefix}/ckpt/step_2"
    stored = _upload(store, source, key)
    assert stored.url == f"s3://{store.bucket}/{key}"
    assert store.read_manifest(key) == stored.manifest
    head = store.client.head_object(Bucket=store.bucket, Key=f"{key}/model/weights.bin")
    assert head["ETag"].endswith('-3"')  # multipart, as the transfer manager sent it
    assert head["Metadata"]["sha256"] == stored.manifest.files[0].sha256
    target = tmp_path / "restored" / "step_2"
    assert store.download(key, target).manifest_sha256 == stored.manifest_sha256
    assert (target / "model" / "weights.bin").read_bytes() == (
        source / "model" / "weights.bin"
    ).read_bytes()
    assert not (tmp_path / "restored" / "step_2.partial").exists()


def test_an_upload_is_idempotent_and_resumes_where_it_stopped(store, tmp_path) -> None:
    source = _checkpoint(tmp_path / "step_2")
    key = f"{store.location.prefix}/ckpt/step_2"
    _upload(store, source, key)
    assert sorted(store.client.uploads) == ["trainer_state.json", "weights.bin"]
    _upload(store, source, key)  # nothing changed: nothing sent again
    assert len(store.client.uploads) == 2
    # interrupted after the first file: no manifest, the stored file is not sent again
    store.client.delete_object(Bucket=store.bucket, Key=manifest_key(key))
    store.client.delete_object(Bucket=store.bucket, Key=f"{key}/trainer_state.json")
    assert store.stored(key) is None
    _upload(store, source, key)
    assert store.client.uploads[2:] == ["trainer_state.json"]
    assert store.stored(key) is not None


def test_a_half_upload_is_never_complete(store, tmp_path) -> None:
    """Files without their manifest: not stored, not downloadable."""
    source = _checkpoint(tmp_path / "step_2")
    key = f"{store.location.prefix}/ckpt/step_2"
    store.client.upload_file(
        str(source / "trainer_state.json"), store.bucket, f"{key}/trainer_state.json"
    )
    assert store.stored(key) is None
    with pytest.raises(ManifestError, match="no manifest"):
        store.download(key, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_changed_object_fails_the_download_and_leaves_nothing_complete(store, tmp_path) -> None:
    source = _checkpoint(tmp_path / "step_2")
    key = f"{store.location.prefix}/ckpt/step_2"
    _upload(store, source, key)
    store.client.put_object(
        Bucket=store.bucket, Key=f"{key}/trainer_state.json", Body=b'{"step": 9}'
    )
    with pytest.raises(ManifestError, match="SHA-256 differs"):
        store.download(key, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_changed_directory_drops_the_old_manifest_before_its_files_change(
    store, tmp_path
) -> None:
    source = _checkpoint(tmp_path / "step_2")
    key = f"{store.location.prefix}/ckpt/step_2"
    first = _upload(store, source, key)
    (source / "trainer_state.json").write_text('{"step": 2, "again": true}')
    seen = []
    upload_file = store.client.upload_file

    def watching(path, bucket, object_key, **kwargs):
        seen.append(store.stored(key))  # what a reader would find mid-upload
        return upload_file(path, bucket, object_key, **kwargs)

    store.client.upload_file = watching
    second = _upload(store, source, key)
    assert seen == [None]
    assert second.manifest_sha256 != first.manifest_sha256
    assert store.stored(key).manifest == second.manifest


def test_a_presigned_url_downloads_without_credentials(store, tmp_path) -> None:
    import httpx

    source = _checkpoint(tmp_path / "step_2")
    key = f"{store.location.prefix}/ckpt/step_2"
    _upload(store, source, key)
    url = store.presigned_url(f"{key}/trainer_state.json", seconds=60)
    assert httpx.get(url).content == b'{"step": 2}'
    assert httpx.get(url.replace("Signature=", "Signature=x")).status_code == 403


class OrderCheckingClient(CountingClient):
    """A real boto3 client that, at each batch delete, reads back whether the manifest is
    already gone (what a reader would see mid-delete)."""

    def __init__(self, client, bucket: str, manifest: str) -> None:
        super().__init__(client)
        self.bucket, self.manifest, self.batches = bucket, manifest, []

    def delete_objects(self, **kwargs):
        listed = self._client.list_objects_v2(Bucket=self.bucket, Prefix=self.manifest)
        self.batches.append((len(kwargs["Delete"]["Objects"]), listed.get("KeyCount", 0)))
        return self._client.delete_objects(**kwargs)


def test_delete_removes_the_manifest_first_then_every_object_in_batches(
    s3_server, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(s3_module, "DELETE_BATCH", 2)
    location = StoreLocation(s3_server.bucket, f"t-{uuid.uuid4().hex[:8]}")
    key = f"{location.prefix}/ckpt/step_2"
    client = OrderCheckingClient(s3_server.client(), s3_server.bucket, manifest_key(key))
    store = ArtifactStore(location, client)
    source = _checkpoint(tmp_path / "step_2")
    for name in ("a", "b", "c"):
        (source / name).write_text(name)
    _upload(store, source, key)
    neighbour = f"{location.prefix}/ckpt/step_20"  # shares the key's first characters
    _upload(store, source, neighbour)

    assert store.delete(key) == 5
    assert client.batches == [(2, 0), (2, 0), (1, 0)]  # the manifest was gone before any
    assert store.read_manifest(key) is None and store.stored(key) is None
    listed = store.client.list_objects_v2(Bucket=store.bucket, Prefix=key + "/")
    assert listed.get("KeyCount", 0) == 0
    assert store.read_manifest(neighbour) is not None  # step_20 untouched
    assert store.delete(key) == 0  # idempotent: a missing key is fine
    assert store.delete(f"{location.prefix}/never/stored") == 0


def test_delete_in_a_bucket_that_does_not_exist_is_a_store_error(s3_server) -> None:
    store = ArtifactStore(StoreLocation("no-such-bucket", "t"), s3_server.client())
    with pytest.raises(s3_module.StoreError, match="delete_object"):
        store.delete("t/ckpt/step_2")
