"""The Celery task `tuneyard.run_export(export_id)`, the export's subprocess, its publication,
and the reconciler's pass over exports.

The message is only a hint, as for jobs: the worker claims a `queued` export in the database
(a lease, attempt + 1) and anything else is dropped. The export runs as
`python -m trainer.export` in a session of its own (the worker never imports torch),
writing into `<run_dir>/exports/.staging_<id>/`; every `poll_seconds` the worker renews the
lease, which is also how a cancel arrives (SIGTERM to the process group, SIGKILL after the
grace period). On exit 0 `publish_export` renames the staging directory to
`<run_dir>/exports/<id>/`, the one place a finished export becomes visible; with an
artifact store configured the worker then uploads it (`worker.artifact_uploads.store_export`,
manifest last) before the export is settled, so a `succeeded` export is in the store. A
failed upload is a crash: the export is retried. A checkpoint whose local copy was evicted
(only the store holds it) is first downloaded, verified, into
`<run_dir>/exports/.source_<id>/` under the lease, exported from there and removed after;
a failed download is a crash too. It is settled by
`jobs.orchestration.export_states`. A worker that dies stops renewing; the reconciler
(`worker.export_reconcile`) then re-queues the export for another attempt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy.exc import NoResultFound

from jobs.artifacts.manifest import ManifestError
from jobs.artifacts.s3 import StoreError
from jobs.broker import dispatch_export
from jobs.orchestration.export_states import claim_export, settle_exit
from jobs.orchestration.states import TransitionRefused
from jobs.recipe.exit_codes import ExitCode
from jobs.store.engine import session_scope
from jobs.store.exports import checkpoint_path, renew_export_lease
from jobs.store.log_context import log_context
from jobs.store.queries import is_job_id
from jobs.store.status import ExportStatus
from jobs.store.tables import Export, Job
from worker.artifact_uploads import (
    LeaseLost,
    fetch_evicted_checkpoint,
    store_export,
    while_renewing,
)
from worker.celery_app import app
from worker.config import WorkerConfig, get_worker_config
from worker.launcher import PACKAGES_ROOT
from worker.proctree import set_parent_death_signal
from worker.state import worker_state

log = logging.getLogger("tuneyard.worker")

EXPORTS_DIR = "exports"
STAGING_PREFIX = ".staging_"
SOURCE_PREFIX = ".source_"  # an evicted checkpoint, downloaded for the export's run


def export_dir(run_dir: Path, export_id: str) -> Path:
    """Where a published export lives: `<run_dir>/exports/<export_id>/`."""
    return run_dir / EXPORTS_DIR / export_id


def publish_export(staging: Path, final: Path) -> int:
    """Make a finished export visible: rename its fsynced staging directory to `final`, fsync
    the parent, and return its size in bytes. The single place an export is published."""
    if final.exists():  # left by an attempt that died between the rename and the commit
        shutil.rmtree(final)
    os.replace(staging, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return sum(p.stat().st_size for p in final.rglob("*") if p.is_file())


@app.task(name="tuneyard.run_export", ignore_result=True, acks_late=False)
def run_export(export_id: object = None, *_: object, **__: object) -> str:
    """Run `export_id` if this worker can claim it; returns what happened."""
    if not isinstance(export_id, str) or not is_job_id(export_id):
        log.warning("dropped an export message: malformed id %s", str(export_id)[:80])
        return "dropped"
    with log_context(export_id=export_id, worker=worker_state().name):
        return execute_export(export_id, get_worker_config())


def _claim(export_id: str, worker: str, config: WorkerConfig) -> tuple[int, list[str]] | None:
    """(attempt, the subprocess' command) for a claimed export, or None."""
    with session_scope() as session:
        export = session.get(Export, export_id)
        if export is None:
            return None
        job = session.get(Job, export.job_id)
        source = checkpoint_path(session, export.job_id, export.step)
        attempt = claim_export(session, export_id, worker, config.lease_seconds)
        if attempt is None or job is None or job.run_dir is None or source is None:
            return None if attempt is None else (attempt, [])
        staging = export_dir(Path(job.run_dir), STAGING_PREFIX + export_id)
        command = [sys.executable, "-m", "trainer.export", "--checkpoint", source]
        command += ["--out", str(staging), "--kind", export.kind, "--dtype", export.dtype]
        return attempt, command


def execute_export(export_id: str, config: WorkerConfig) -> str:
    worker = worker_state().name
    claimed = _claim(export_id, worker, config)
    if claimed is None:
        return "skipped"
    attempt, command = claimed
    if not command:  # its checkpoint row or run directory is gone
        missing = "the checkpoint to export no longer exists"
        return _settle(export_id, attempt, ExitCode.CHECKPOINT_ERROR, missing)
    staging = Path(command[command.index("--out") + 1])
    final = export_dir(staging.parents[1], export_id)
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    log_path = staging.parent / f".{export_id}.{attempt}.log"
    source = staging.parent / (SOURCE_PREFIX + export_id)
    try:
        fetched = _fetch_evicted(export_id, source, worker, attempt, config)
    except LeaseLost:
        return "lease_lost"
    except (StoreError, ManifestError, OSError) as exc:
        shutil.rmtree(source, ignore_errors=True)
        problem = f"the evicted checkpoint could not be fetched from the artifact store: {exc}"
        return _settle(export_id, attempt, ExitCode.CRASH, problem)
    if fetched is not None:
        command[command.index("--checkpoint") + 1] = str(fetched)
    try:
        code = _run(command, log_path, export_id, worker, attempt, config)
    finally:
        shutil.rmtree(source, ignore_errors=True)
    if code is None:
        return "lease_lost"
    detail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
    if code != 0:
        shutil.rmtree(staging, ignore_errors=True)
        return _settle(export_id, attempt, code, detail)
    size = publish_export(staging, final)
    problem = _store(export_id, final)
    if problem:
        return _settle(export_id, attempt, ExitCode.CRASH, problem)
    return _settle(export_id, attempt, 0, detail, path=str(final), size_bytes=size)


def _fetch_evicted(
    export_id: str, target: Path, worker: str, attempt: int, config: WorkerConfig
) -> Path | None:
    """Download the export's checkpoint into `target` when its local copy was evicted, the
    lease renewed meanwhile; None when the local copy is there. LeaseLost: the lease was
    lost."""
    with session_scope() as session:
        export = session.get(Export, export_id)
        job_id, step = (export.job_id, export.step) if export else ("", 0)
    if not job_id:
        return None
    return while_renewing(
        lambda: fetch_evicted_checkpoint(job_id, step, target),
        lambda: _renew(export_id, worker, attempt, config) is not None,
        config.poll_seconds,
    )


def _store(export_id: str, final: Path) -> str | None:
    """Upload a published export to the artifact store when one is configured; why it could
    not be stored, or None."""
    with session_scope() as session:
        export = session.get(Export, export_id)
        job_id = export.job_id if export else None
    if job_id is None:
        return None  # deleted with its job: nothing left to settle either
    try:
        store_export(job_id, export_id, final)
    except (StoreError, ManifestError, OSError) as exc:
        log.warning("export %s: upload to the artifact store failed: %s", export_id, exc)
        return f"the export could not be uploaded to the artifact store: {exc}"
    return None


def _settle(export_id: str, attempt: int, code: int, detail: str, **published: object) -> str:
    try:
        with session_scope() as session:
            requeued = settle_exit(session, export_id, attempt, code, detail, **published)
            row = session.get(Export, export_id)
            queue = row.queue if row else "cpu"
    except (TransitionRefused, NoResultFound) as exc:  # moved on, or deleted with its job
        log.warning("export %s: outcome not recorded: %s", export_id, exc)
        return "refused"
    if requeued:
        dispatch_export(export_id, queue)
    return "succeeded" if code == 0 else f"exit_{code}"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONSAFEPATH"] = "1"  # the run directory (cwd) never shadows tuneyard's packages
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PACKAGES_ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    )
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run(
    command: list[str],
    log_path: Path,
    export_id: str,
    worker: str,
    attempt: int,
    config: WorkerConfig,
) -> int | None:
    """Run the subprocess to its end under the lease; its exit code (a negative signal number
    when stopped on a cancel), or None when the lease was lost (nothing is written then)."""
    with log_path.open("wb") as output:
        proc = subprocess.Popen(
            command,
            env=_env(),
            cwd=str(log_path.parent),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=set_parent_death_signal,  # noqa: PLW1509 - needed between fork and exec
        )
        stop_at: float | None = None
        while proc.poll() is None:
            time.sleep(config.poll_seconds)
            status = _renew(export_id, worker, attempt, config)
            if status is None and stop_at is None:
                _stop(proc, signal.SIGKILL)
                proc.wait()
                return None
            if status == ExportStatus.CANCELLING and stop_at is None:
                _stop(proc, signal.SIGTERM)
                stop_at = time.monotonic() + config.stop_grace_seconds
            if stop_at is not None and time.monotonic() > stop_at:
                _stop(proc, signal.SIGKILL)
        return proc.returncode


def _renew(export_id: str, worker: str, attempt: int, config: WorkerConfig) -> str | None:
    try:
        with session_scope() as session:
            return renew_export_lease(session, export_id, worker, attempt, config.lease_seconds)
    except Exception as exc:  # database down: keep going; the lease may still be ours
        log.warning("export %s: lease renewal failed (%s)", export_id, exc)
        return ExportStatus.RUNNING.value


def _stop(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
