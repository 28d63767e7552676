"""Where checkpoints live, how they are published atomically, and how a run finds one.

A save writes everything under `checkpoints/.staging_step_<N>/` (model or adapter,
`optim/` as DCP, `trainer_state.json` last), fsyncs, renames it to `step_<N>/`, then
replaces `LATEST` (write a temp file, fsync, rename) and deletes what retention keeps no more
(`trainer.checkpoint.retention`: beyond `keep_last` and `keep_best`), never the one LATEST
names; `trainer_state.json` records the step's metrics, which `keep_best` ranks by. A
directory without `trainer_state.json` or still under a staging name is never resumed
from; stale staging dirs are removed at start.

With `checkpoint.is_async` a save only snapshots on the step loop's time (the optimizer
state through `dcp.async_save`, whose stager copies it to CPU memory, and the gathered
model on rank 0); `publish_async` then finishes it on a background thread: wait for this
rank's DCP shards, write the consolidated model, meet every rank on a gloo group of its
own (training's collectives never interleave with it), then publish exactly as above.
LATEST therefore moves only once shards, safetensors and `trainer_state.json` are all
on disk. `begin` (the next save) and `wait` (end of training, preemption) first finish
the save in flight. `TUNEYARD_TEST_PUBLISH_DELAY_S` (tests only) holds each background
publish that many seconds before it renames, so a test can kill a run mid-save.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from jobs.recipe.paths.scope import LATEST_CAP, STEP_DIR
from jobs.recipe.sections.retention import KeepBest
from trainer.checkpoint.retention import Deletion, apply_retention
from trainer.distributed import barrier
from trainer.errors import checkpoint_error

STATE_FILE = "trainer_state.json"
STAGING_PREFIX = ".staging_"
PUBLISH_DELAY_ENV = "TUNEYARD_TEST_PUBLISH_DELAY_S"


@dataclass(frozen=True)
class PublishedSave:
    """A checkpoint that an asynchronous save finished publishing (rank 0 reports it)."""

    step: int
    path: Path
    size_bytes: int
    metrics: dict[str, Any] = field(default_factory=dict)
    deleted: tuple[Deletion, ...] = ()  # what retention removed once this one was published


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True) + [root]:
        flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
        fd = os.open(path, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def dir_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def pointed_step(root: Path) -> Path | None:
    """The directory `root/LATEST` names when it is a plain `step_<N>` entry of `root`
    itself, never a path, `..` or a symlink (a planted pointer could lead into another
    job's or project's checkpoints); None otherwise or without a pointer."""
    pointer = root / "LATEST"
    if not pointer.is_file():
        return None
    with pointer.open("rb") as handle:
        name = handle.read(LATEST_CAP).decode("utf-8", "replace").strip()
    directory = root / name
    if not STEP_DIR.match(name) or directory.is_symlink():
        return None
    return directory


class CheckpointManager:
    def __init__(
        self,
        run_dir: Path,
        is_rank0: bool,
        keep_last: int | None = None,
        root: Path | None = None,
        save_optimizer: bool = True,
        is_async: bool = False,
        process_group: Any = None,
        keep_best: KeepBest | None = None,
    ):
        self.root = root or run_dir / "checkpoints"
        self.is_rank0 = is_rank0
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.save_optimizer = save_optimizer
        self.is_async = is_async
        distributed = dist.is_initialized() and dist.get_world_size() > 1
        if process_group is None and is_async and distributed:
            # collective: every rank builds its manager at the same point of setup
            process_group = dist.new_group(backend="gloo")
        self.process_group = process_group  # the background publish's own group
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[PublishedSave | None] | None = None
        self._unreported: list[PublishedSave] = []
        self._deleted: list[Deletion] = []  # a synchronous publish's, until taken

    def remove_stale_staging(self) -> None:
        if self.is_rank0 and self.root.is_dir():
            for stale in self.root.glob(f"{STAGING_PREFIX}*"):
                shutil.rmtree(stale, ignore_errors=True)
        barrier()

    def latest(self) -> Path | None:
        directory = pointed_step(self.root)
        return directory if directory is not None and is_complete(directory) else None

    def resolve(self, restore_from: str | None) -> Path | None:
        """The checkpoint to resume from: explicit path, LATEST, or LATEST when one exists."""
        if restore_from in (None, "", "LATEST"):
            found = self.latest()
            if found is None and restore_from == "LATEST" and (self.root / "LATEST").exists():
                raise checkpoint_error(f"{self.root / 'LATEST'} names an incomplete checkpoint")
            return found
        directory = Path(restore_from).expanduser()
        if (directory / "LATEST").is_file():  # a checkpoints root
            step = pointed_step(directory)
            if step is None:
                raise checkpoint_error(
                    f"restore_from: {directory / 'LATEST'} does not name a step_<N> directory "
                    f"of {directory}; give the checkpoints/step_<N> directory"
                )
            directory = step
        if not is_complete(directory):
            raise checkpoint_error(
                f"restore_from: {directory} is not a complete checkpoint "
                f"(no {STATE_FILE}); give a checkpoints/step_<N> directory"
            )
        return directory

    def staging_dir(self, step: int) -> Path:
        return self.root / f"{STAGING_PREFIX}step_{step}"

    def final_dir(self, step: int) -> Path:
        """Where the checkpoint of `step` lives once published."""
        return self.root / f"step_{step}"

    def begin(self, step: int) -> Path:
        """A fresh staging dir for `step`, once the save in flight (if any) is published."""
        self._finish_pending()
        staging = self.staging_dir(step)
        if self.is_rank0:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        barrier()
        return staging

    def publish(self, step: int, trainer_state: dict[str, Any]) -> Path:
        """Write trainer_state.json, fsync, rename, move LATEST, prune. Rank 0 does the I/O."""
        staging, final = self.staging_dir(step), self.final_dir(step)
        barrier()  # every rank has written its optimizer shard
        if self.is_rank0:
            self._deleted += self._publish_files(staging, final, trainer_state)
        barrier()
        return final

    def take_deletions(self) -> tuple[Deletion, ...]:
        """What the synchronous publishes since the last call deleted (rank 0)."""
        deleted, self._deleted = tuple(self._deleted), []
        return deleted

    def _publish_files(
        self, staging: Path, final: Path, trainer_state: dict[str, Any]
    ) -> list[Deletion]:
        (staging / STATE_FILE).write_text(json.dumps(trainer_state, indent=1))
        _fsync_tree(staging)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        self._point_latest(final.name)
        return self._prune(_step_of(final))

    def publish_async(
        self,
        step: int,
        trainer_state: dict[str, Any],
        shards: Future | None = None,
        write_model: Callable[[], None] | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        """Finish the save of `step` on a background thread; returns at once.

        `shards` is this rank's `dcp.async_save` future; `write_model` writes the
        snapshotted model into the staging dir (rank 0). Every rank calls this.
        """
        self._finish_pending()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-publish")
        job = (step, dict(trainer_state), shards, write_model, dict(metrics or {}))
        self._pending = self._executor.submit(self._publish_in_background, *job)

    def _publish_in_background(
        self,
        step: int,
        trainer_state: dict[str, Any],
        shards: Future | None,
        write_model: Callable[[], None] | None,
        metrics: dict[str, Any],
    ) -> PublishedSave | None:
        staging, final = self.staging_dir(step), self.final_dir(step)
        if shards is not None:
            shards.result()  # this rank's DCP files are written
        if write_model is not None:
            write_model()
        delay = float(os.environ.get(PUBLISH_DELAY_ENV) or 0)
        if delay > 0:  # test pacing: hold the save in flight
            time.sleep(delay)
        self._group_barrier()  # every rank's shards are on disk
        deleted = self._publish_files(staging, final, trainer_state) if self.is_rank0 else []
        self._group_barrier()
        if not self.is_rank0:
            return None
        return PublishedSave(step, final, dir_size(final), metrics, tuple(deleted))

    def _group_barrier(self) -> None:
        if dist.is_initialized() and dist.get_world_size(self.process_group) > 1:
            dist.barrier(group=self.process_group)

    def _finish_pending(self) -> None:
        """Block until the save in flight is published; its failure is a checkpoint error."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            published = pending.result()
        except Exception as exc:  # noqa: BLE001 - any failure leaves LATEST where it was
            raise checkpoint_error(
                f"the asynchronous checkpoint save failed ({type(exc).__name__}: "
                f"{str(exc)[:300]}); LATEST still names the previous checkpoint"
            ) from exc
        if published is not None:
            self._unreported.append(published)

    def in_flight(self) -> bool:
        return self._pending is not None and not self._pending.done()

    def wait(self) -> list[PublishedSave]:
        """Finish the save in flight; every published save not yet reported (rank 0)."""
        self._finish_pending()
        return self.completed()

    def completed(self) -> list[PublishedSave]:
        """Saves published since the last call, without blocking."""
        if self._pending is not None and self._pending.done():
            self._finish_pending()
        done, self._unreported = self._unreported, []
        return done

    def _point_latest(self, name: str) -> None:
        tmp = self.root / "LATEST.tmp"
        with tmp.open("w") as handle:
            handle.write(name + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.root / "LATEST")
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _prune(self, latest: int) -> list[Deletion]:
        """Apply retention to the complete checkpoints on disk; `latest` is never deleted."""
        if not self.keep_last and self.keep_best is None:
            return []
        done = {_step_of(p): p for p in self.root.glob("step_*") if is_complete(p)}
        done.pop(-1, None)
        metrics = {step: recorded_metrics(path) for step, path in done.items()}
        return apply_retention(done, metrics, latest, self.keep_last, self.keep_best)


def _step_of(path: Path) -> int:
    try:
        return int(path.name.removeprefix("step_"))
    except ValueError:
        return -1


def is_complete(directory: Path) -> bool:
    return (
        directory.is_dir()
        and not directory.name.startswith(STAGING_PREFIX)
        and (directory / STATE_FILE).is_file()
    )


def recorded_metrics(directory: Path) -> dict[str, Any] | None:
    """The metrics a checkpoint's `trainer_state.json` recorded at its step (None: none,
    or unreadable: such a checkpoint is never ranked, so never kept as a best one)."""
    try:
        state = json.loads((directory / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    metrics = state.get("metrics") if isinstance(state, dict) else None
    return metrics if isinstance(metrics, dict) else None


def read_trainer_state(directory: Path) -> dict[str, Any]:
    try:
        return json.loads((directory / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise checkpoint_error(f"{directory / STATE_FILE} is unreadable: {exc}") from None


def _state_options(flat: bool) -> StateDictOptions:
    """Flat optimizer state keys every entry by parameter name (`param_groups.<fqn>.lr`):
    what pipeline stages need, whose ranks hold different parameters and param groups."""
    return StateDictOptions(flatten_optimizer_state_dict=flat)


def _saved_flat(in_dir: Path) -> bool:
    """Whether the DCP checkpoint in `in_dir` holds flat optimizer state.

    DCP flattens the nested form's param-group list too (`param_groups.0.lr`), so only its
    per-group `params` entry (`param_groups.0.params`) tells the two apart.
    """
    keys = dcp.FileSystemReader(str(in_dir)).read_metadata().state_dict_metadata
    groups = [k for k in keys if k.startswith("optimizer.param_groups.")]
    return bool(groups) and not any(k.endswith(".params") for k in groups)


def save_optimizer(
    model: nn.Module, optimizer: Optimizer, scheduler: Any, out_dir: Path, flat: bool = False
) -> None:
    """The optimizer (and scheduler) state as DCP; `flat` under pipeline parallelism."""
    dcp.save(_optimizer_state(model, optimizer, scheduler, flat), checkpoint_id=str(out_dir))


def _optimizer_state(
    model: nn.Module, optimizer: Optimizer, scheduler: Any, flat: bool = False
) -> dict[str, Any]:
    """What a save writes: the optimizer's state dict and the scheduler's, if any."""
    options = _state_options(flat)
    state = {"optimizer": get_optimizer_state_dict(model, optimizer, options=options)}
    if scheduler is not None:
        state["lr_scheduler"] = scheduler.state_dict()
    return state


def async_save_optimizer(
    model: nn.Module, optimizer: Optimizer, scheduler: Any, out_dir: Path, process_group: Any
) -> Future:
    """Copy the optimizer (and scheduler) state to CPU memory now; write it on a thread.

    `dcp.async_save`'s default stager deep-copies every tensor before it returns, so the
    next optimizer step cannot change what is written; `process_group` (gloo) carries the
    save's own coordination, apart from training's collectives.
    """
    state = _optimizer_state(model, optimizer, scheduler)
    return dcp.async_save(state, checkpoint_id=str(out_dir), process_group=process_group)


def load_optimizer(model: nn.Module, optimizer: Optimizer, scheduler: Any, in_dir: Path) -> None:
    if not (in_dir / ".metadata").is_file():
        raise checkpoint_error(f"{in_dir} holds no optimizer state (no DCP .metadata)")
    options = _state_options(_saved_flat(in_dir))
    state: dict[str, Any] = {
        "optimizer": get_optimizer_state_dict(model, optimizer, options=options)
    }
    if scheduler is not None:
        state["lr_scheduler"] = scheduler.state_dict()
    try:
        dcp.load(state, checkpoint_id=str(in_dir))
    except Exception as exc:  # noqa: BLE001 - a mismatch is the user's checkpoint, not a bug
        raise checkpoint_error(
            f"{in_dir}: optimizer state does not fit this model/optimizer "
            f"({type(exc).__name__}: {str(exc)[:300]})"
        ) from None
    set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)
    if scheduler is not None:
        scheduler.load_state_dict(state["lr_scheduler"])
