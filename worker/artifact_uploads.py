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
under its own retention: a cache of what the store holds.

`store_export` stores one published export directory the same way, synchronously, for the
export's worker to call once the export is published.

`restore_stored_checkpoint` runs before the launch: a recipe whose `restore_from.path` is an
`s3://` checkpoint (checked at submit by `jobs.recipe.paths.stored`) gets it downloaded and
verified against its manifest into `<run dir>/restored/`, and the trainer is handed that
directory.
"""

from __future__ import annotations

import copy
import logging
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
    project_of_job,
    record_artifact,
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


class ArtifactUploads:
    """One attempt's uploads, in order, on a background thread that runs while there is
    work queued and ends when the queue is empty (an attempt that ends early leaves no
    thread behind)."""

    def __init__(self, store: ArtifactStore, job_id: str, project: str) -> None:
        self.store, self.job_id, self.project = store, job_id, project
        self._pending: deque[Upload] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._seen: set[tuple[str, str, Path]] = set()
        self.stored: list[str] = []
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
        marker = (kind, name, path)
        with self._lock:
            if marker in self._seen:
                return
            self._seen.add(marker)
            self._pending.append(Upload(kind, name, step, path))
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

    def _next(self) -> Upload | None:
        with self._lock:
            if not self._pending:
                self._thread = None  # a later submit starts a new thread
                return None
            return self._pending.popleft()

    def _run(self) -> None:
        while (upload := self._next()) is not None:
            try:
                self._upload(upload)
            except (StoreError, ManifestError, OSError) as exc:
                self.failed.append(upload.name)
                log.warning(
                    "job %s: %s %s not stored: %s", self.job_id, upload.kind, upload.name, exc
                )
            except Exception:  # an upload never takes the attempt down with it
                self.failed.append(upload.name)
                log.exception("job %s: storing %s failed", self.job_id, upload.name)

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


class RestoreFailed(Exception):
    """The stored checkpoint a recipe names could not be downloaded and verified."""


def restore_stored_checkpoint(recipe: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The recipe to launch with: unchanged, or with an `s3://` restore_from downloaded,
    verified and replaced by its local directory."""
    restore = recipe.get("restore_from")
    url = restore.get("path") if isinstance(restore, dict) else None
    if not is_store_url(url):
        return recipe
    try:
        store = ArtifactStore.from_url(get_settings().artifact_store)
    except ValueError as exc:
        raise RestoreFailed(f"restore_from.path: TUNEYARD_ARTIFACT_STORE: {exc}") from exc
    key = store.location.key_of(url) if store is not None else None
    found = parse_checkpoint_key(store.location, key) if store and key else None
    if store is None or found is None:
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


def while_renewing(
    action: Callable[[], Any], keep_alive: Callable[[], bool], every: float = 1.0
) -> Any:
    """`action()` on a thread of its own, `keep_alive()` (the lease renewal) every `every`
    seconds until it ends; its result, or its exception raised here. RestoreFailed when
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
            raise RestoreFailed("the attempt lost its lease while restoring")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
