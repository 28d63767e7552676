"""The worker's side of the artifact store: upload what the trainer published, restore
what a recipe names.

`ArtifactUploads` (node 0 of an attempt, only with `TUNEYARD_ARTIFACT_STORE` set) copies
each published checkpoint to the store in a background thread, so that a large upload
never holds back metric ingestion or lease renewal, and records the `artifacts` row once the
manifest is written. At the start of an attempt it queues the job's checkpoints that an
earlier attempt published but did not finish storing (an upload is idempotent: what is
already stored is not sent again); at the end the supervisor waits for the queue, renewing
the lease meanwhile, so a job settles with its checkpoints stored. A checkpoint the trainer
pruned before its upload is skipped. The local copies stay where the trainer keeps them,
under its own retention: a cache of what the store holds (the scheduler evicts the local
copies of a finished job's stored checkpoints, `worker.retention`).

The trainer's deletions (`checkpoint_deleted`) reach the store through the same thread, in
order with the uploads (`submit_deletions`): the stored copy is deleted, manifest first,
and its `artifacts` row marked deleted. A store error leaves the row live, and the
scheduler's retention pass deletes it later (`delete_stored_copies`).

`store_export` stores one published export directory the same way, synchronously, for the
export's worker to call once the export is published.

`restore_stored_checkpoint` runs before the launch: a recipe whose `restore_from.path` is an
`s3://` checkpoint (checked at submit by `jobs.recipe.paths.stored`), or the local directory
of a checkpoint whose local copy was evicted (a `restore_from: {job: <id>}` resolves to
one), gets it downloaded and verified against its manifest into `<run dir>/restored/`, and
the trainer is handed that directory. `fetch_evicted_checkpoint` does the same for an
export of an evicted checkpoint.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.artifacts.manifest import ManifestError
from jobs.artifacts.s3 import ArtifactStore, StoreError
from jobs.recipe.paths.stored import artifact_key, is_store_url, parse_checkpoint_key
from jobs.store.artifacts import (
    ArtifactRecord,
    checkpoints_to_store,
    evicted_checkpoint_at,
    mark_checkpoint_copy_deleted,
    mark_deleted,
    project_of_job,
    record_artifact,
    stored_copies_to_delete,
    stored_copy,
)
from jobs.store.engine import session_scope
from jobs.store.settings import get_settings

log = logging.getLogger("tuneyard.worker")
RESTORED_DIR = "restored"  # <run dir>/restored/<job id>-step_<N>: downloaded checkpoints


@dataclass(frozen=True)
class Upload:
    kind: str
    name: str
    step: int | None
    path: Path


@dataclass(frozen=True)
class StoredDeletion:
    """The trainer deleted checkpoint `name`: its stored copy goes too."""

    name: str


class ArtifactUploads:
    """One attempt's uploads, in order, on a background thread that runs while there is
    work queued and ends when the queue is empty (an attempt that ends early leaves no
    thread behind)."""

    def __init__(self, store: ArtifactStore, job_id: str, project: str) -> None:
        self.store, self.job_id, self.project = store, job_id, project
        self._pending: deque[Upload | StoredDeletion] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._seen: set[tuple[str, str, Path]] = set()
        self.stored: list[str] = []
        self.deleted: list[str] = []
        self.failed: list[str] = []

    @classmethod
    def for_job(cls, job_id: str) -> ArtifactUploads | None:
        """The uploads of `job_id`, or None when no artifact store is configured (or it is
        misconfigured: logged, the job runs without it)."""
        try:
            store = ArtifactStore.from_url(get_settings().artifact_store)
        except ValueError as exc:
            log.error("job %s: TUNEYARD_ARTIFACT_STORE: %s; nothing is stored", job_id, exc)
            return None
        if store is None:
            return None
        with session_scope() as session:
            project = project_of_job(session, job_id)
        return None if project is None else cls(store, job_id, project)

    def submit(self, kind: str, name: str, step: int | None, path: Path) -> None:
        """Queue one published directory (again: ignored while the first is pending)."""
        self._enqueue((kind, name, path), Upload(kind, name, step, path))

    def submit_deletions(self, events: list[dict[str, Any]]) -> None:
        """Queue the deletion of the stored copies of the checkpoints that
        `checkpoint_deleted` events announce, after every upload queued before them."""
        for record in events:
            step = record.get("step")
            if record.get("event") == "checkpoint_deleted" and type(step) is int:
                self._enqueue(("delete", f"step_{step}", Path()), StoredDeletion(f"step_{step}"))

    def _enqueue(self, marker: tuple[str, str, Path], item: Upload | StoredDeletion) -> None:
        with self._lock:
            if marker in self._seen:
                return
            self._seen.add(marker)
            self._pending.append(item)
            if self._thread is None:
                label = f"uploads-{self.job_id[:8]}"
                self._thread = threading.Thread(target=self._run, name=label, daemon=True)
                self._thread.start()

    def submit_checkpoints(self, events: list[dict[str, Any]]) -> None:
        """Queue the checkpoints that `checkpoint_saved` events announce."""
        for record in events:
            step, path = record.get("step"), record.get("path")
            if record.get("event") == "checkpoint_saved" and isinstance(step, int) and path:
                self.submit("checkpoint", f"step_{step}", step, Path(str(path)))

    def submit_unstored(self) -> None:
        """Queue the job's published checkpoints not yet in the store (an earlier attempt's
        upload interrupted)."""
        with session_scope() as session:
            pending = checkpoints_to_store(session, self.job_id)
        for step, path in pending:
            self.submit("checkpoint", f"step_{step}", step, Path(path))

    def finish(self, keep_alive: Callable[[], bool], every: float = 1.0) -> None:
        """Wait until every queued upload is done; `keep_alive()` (the lease renewal) runs
        every `every` seconds meanwhile and returning False stops waiting."""
        while (thread := self._thread) is not None:
            thread.join(every)
            if thread.is_alive() and not keep_alive():
                log.warning("job %s: stopped waiting for uploads", self.job_id)
                return

    def _next(self) -> Upload | StoredDeletion | None:
        with self._lock:
            if not self._pending:
                self._thread = None  # a later submit starts a new thread
                return None
            return self._pending.popleft()

    def _run(self) -> None:
        while (item := self._next()) is not None:
            doing = "deleting" if isinstance(item, StoredDeletion) else "storing"
            try:
                if isinstance(item, StoredDeletion):
                    self._delete(item)
                else:
                    self._upload(item)
            except (StoreError, ManifestError, OSError) as exc:
                self.failed.append(item.name)
                log.warning("job %s: %s %s failed: %s", self.job_id, doing, item.name, exc)
            except Exception:  # an upload never takes the attempt down with it
                self.failed.append(item.name)
                log.exception("job %s: %s %s failed", self.job_id, doing, item.name)

    def _delete(self, deletion: StoredDeletion) -> None:
        """Delete the stored copy (a key never stored is fine), then mark its row; on a
        store error the row stays live for the scheduler's retention pass."""
        key = artifact_key(
            self.store.location, self.project, self.job_id, "checkpoint", deletion.name
        )
        self.store.delete(key)
        with session_scope() as session:
            mark_checkpoint_copy_deleted(session, self.job_id, deletion.name)
        self.deleted.append(deletion.name)
        log.info("job %s: deleted the stored copy of %s", self.job_id, deletion.name)

    def _upload(self, upload: Upload) -> None:
        if not upload.path.is_dir():
            log.info("job %s: %s was pruned before its upload", self.job_id, upload.path)
            return
        store_directory(self.store, self.project, self.job_id, upload)
        self.stored.append(upload.name)


def store_directory(store: ArtifactStore, project: str, job_id: str, upload: Upload) -> str:
    """Upload one published directory and record its `artifacts` row; its s3:// URL."""
    key = artifact_key(store.location, project, job_id, upload.kind, upload.name)
    started = time.monotonic()
    stored = store.upload_directory(
        upload.path, key, job_id=job_id, kind=upload.kind, name=upload.name, step=upload.step
    )
    manifest = stored.manifest
    record = ArtifactRecord(
        job_id=job_id,
        kind=upload.kind,
        name=upload.name,
        step=upload.step,
        key=stored.url,
        size_bytes=manifest.size,
        sha256=stored.manifest_sha256,
        files=[f.model_dump() for f in manifest.files],
    )
    with session_scope() as session:
        record_artifact(session, record)
    log.info(
        "job %s: stored %s (%d files, %d bytes) in %.1fs at %s",
        job_id,
        upload.name,
        len(manifest.files),
        manifest.size,
        time.monotonic() - started,
        stored.url,
    )
    return stored.url


def store_export(job_id: str, name: str, directory: Path) -> str | None:
    """Upload a published export directory now (the export's worker waits for it) and
    record it; its s3:// URL, or None when no artifact store is configured. Raises
    StoreError / ManifestError / OSError when it cannot be stored."""
    store = ArtifactStore.from_url(get_settings().artifact_store)
    if store is None:
        return None
    with session_scope() as session:
        project = project_of_job(session, job_id)
    if project is None:
        raise ManifestError(f"job {job_id} is gone: its export has no project to be stored in")
    return store_directory(store, project, job_id, Upload("export", name, None, directory))


def delete_stored_copies(store: ArtifactStore, job_id: str | None = None) -> list[str]:
    """Delete from the store every stored copy of a deleted checkpoint (of one job, or of
    all) whose row is still live, and mark each row; the URLs deleted. A store error stops
    the sweep (raised) with the rest left for the next pass."""
    with session_scope() as session:
        pending = stored_copies_to_delete(session, job_id)
    done = []
    for artifact_id, url in pending:
        key = store.location.key_of(url)
        if key is None:  # stored under another bucket or prefix than this store's
            log.warning("artifact %s at %s is not in %s: left", artifact_id, url, store.location)
            continue
        store.delete(key)
        with session_scope() as session:
            mark_deleted(session, artifact_id)
        done.append(url)
    return done


class RestoreFailed(Exception):
    """The stored checkpoint a recipe names could not be downloaded and verified."""


class LeaseLost(RestoreFailed):
    """The attempt lost its lease while a transfer ran (`while_renewing`)."""


def _store_holding(url: str) -> tuple[ArtifactStore, str]:
    """This worker's artifact store and the key of `url` in it. ValueError, saying why, when
    TUNEYARD_ARTIFACT_STORE is invalid or unset, or `url` lies outside that store."""
    try:
        store = ArtifactStore.from_url(get_settings().artifact_store)
    except ValueError as exc:
        raise ValueError(f"TUNEYARD_ARTIFACT_STORE: {exc}") from exc
    key = store.location.key_of(url) if store is not None else None
    if store is None or key is None:
        raise ValueError(f"{url} is not a checkpoint of this worker's store")
    return store, key


def restore_stored_checkpoint(recipe: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The recipe to launch with: unchanged, or with an `s3://` restore_from downloaded,
    verified and replaced by its local directory."""
    restore = recipe.get("restore_from")
    url = restore.get("path") if isinstance(restore, dict) else None
    if isinstance(url, str) and url not in ("", "LATEST") and not is_store_url(url):
        return _restore_evicted(recipe, url, run_dir)
    if not is_store_url(url):
        return recipe
    try:
        store, key = _store_holding(url)
    except ValueError as exc:
        raise RestoreFailed(f"restore_from.path: {exc}") from exc
    found = parse_checkpoint_key(store.location, key)
    if found is None:
        raise RestoreFailed(f"restore_from.path: {url} is not a checkpoint of this worker's store")
    target = run_dir / RESTORED_DIR / f"{found.job_id}-step_{found.step}"
    try:
        stored = store.download(found.key, target)
    except (StoreError, ManifestError, OSError) as exc:
        raise RestoreFailed(f"restore_from.path: cannot restore {url}: {exc}") from exc
    log.info("restored %s (%d bytes) into %s", url, stored.manifest.size, target)
    launched = copy.deepcopy(recipe)
    launched["restore_from"] = {"path": str(target)}
    return launched


def _restore_evicted(recipe: dict[str, Any], path: str, run_dir: Path) -> dict[str, Any]:
    """The recipe with a local restore_from whose copy was evicted replaced by its download
    (the database says so: the eviction is recorded before the files go); unchanged for
    any other local path."""
    with session_scope() as session:
        found = evicted_checkpoint_at(session, path)
        if found is None and os.path.realpath(path) != path:
            found = evicted_checkpoint_at(session, os.path.realpath(path))
    if found is None:
        return recipe
    job_id, step = found
    target = run_dir / RESTORED_DIR / f"{job_id}-step_{step}"
    try:
        fetched = fetch_evicted_checkpoint(job_id, step, target)
    except (StoreError, ManifestError, OSError) as exc:
        raise RestoreFailed(f"restore_from.path: cannot restore {path}: {exc}") from exc
    if fetched is None:
        raise RestoreFailed(f"restore_from.path: {path} was evicted and its stored copy deleted")
    launched = copy.deepcopy(recipe)
    launched["restore_from"] = {"path": str(target)}
    return launched


def fetch_evicted_checkpoint(job_id: str, step: int, target: Path) -> Path | None:
    """Download the job's evicted checkpoint at `step` from the store into `target`,
    verified; None when that checkpoint is not evicted. ManifestError when it was evicted
    but no stored copy or no store is left to fetch it from."""
    with session_scope() as session:
        url = stored_copy(session, job_id, step)
    if url is None:
        return None
    try:
        store, key = _store_holding(url)
    except ValueError as exc:
        raise ManifestError(f"checkpoint step_{step} was evicted: {exc}") from exc
    stored = store.download(key, target)
    log.info("fetched evicted %s (%d bytes) into %s", url, stored.manifest.size, target)
    return target


def while_renewing(
    action: Callable[[], Any], keep_alive: Callable[[], bool], every: float = 1.0
) -> Any:
    """`action()` on a thread of its own, `keep_alive()` (the lease renewal) every `every`
    seconds until it ends; its result, or its exception raised here. LeaseLost when
    `keep_alive()` answers False first (the attempt is no longer ours)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = action()
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="artifact-transfer", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(every)
        if thread.is_alive() and not keep_alive():
            raise LeaseLost("the attempt lost its lease while restoring")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
