"""Where checkpoints live, how they are published atomically, and how a run finds one.

A save writes everything under `checkpoints/.staging_step_<N>/` (model or adapter,
`optim/` as DCP, `trainer_state.json` last), fsyncs, renames it to `step_<N>/`, then
replaces `LATEST` (write a temp file, fsync, rename) and prunes beyond `keep_last`, never
the one LATEST names. A directory without `trainer_state.json` or still under a staging
name is never resumed from; stale staging dirs are removed at start.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from trainer.distributed import barrier
from trainer.errors import checkpoint_error

STATE_FILE = "trainer_state.json"
STAGING_PREFIX = ".staging_"


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


class CheckpointManager:
    def __init__(
        self,
        run_dir: Path,
        is_rank0: bool,
        keep_last: int | None = None,
        root: Path | None = None,
        save_optimizer: bool = True,
    ):
        self.root = root or run_dir / "checkpoints"
        self.is_rank0 = is_rank0
        self.keep_last = keep_last
        self.save_optimizer = save_optimizer

    def remove_stale_staging(self) -> None:
        if self.is_rank0 and self.root.is_dir():
            for stale in self.root.glob(f"{STAGING_PREFIX}*"):
                shutil.rmtree(stale, ignore_errors=True)
        barrier()

    def latest(self) -> Path | None:
        pointer = self.root / "LATEST"
        if not pointer.is_file():
            return None
        directory = self.root / pointer.read_text().strip()
        return directory if is_complete(directory) else None

    def resolve(self, restore_from: str | None) -> Path | None:
        """The checkpoint to resume from: explicit path, LATEST, or LATEST when one exists."""
        if restore_from in (None, "", "LATEST"):
            found = self.latest()
            if found is None and restore_from == "LATEST" and (self.root / "LATEST").exists():
                raise checkpoint_error(f"{self.root / 'LATEST'} names an incomplete checkpoint")
            return found
        directory = Path(restore_from).expanduser()
        if (directory / "LATEST").is_file():  # a checkpoints root
            directory = directory / (directory / "LATEST").read_text().strip()
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
            (staging / STATE_FILE).write_text(json.dumps(trainer_state, indent=1))
            _fsync_tree(staging)
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
            self._point_latest(final.name)
            self._prune(final.name)
        barrier()
        return final

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

    def _prune(self, latest_name: str) -> None:
        if not self.keep_last or self.keep_last < 1:
            return
        done = sorted((p for p in self.root.glob("step_*") if is_complete(p)), key=_step_of)
        for old in done[: max(0, len(done) - self.keep_last)]:
            if old.name != latest_name:
                shutil.rmtree(old, ignore_errors=True)


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


def read_trainer_state(directory: Path) -> dict[str, Any]:
    try:
        return json.loads((directory / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise checkpoint_error(f"{directory / STATE_FILE} is unreadable: {exc}") from None


def save_optimizer(model: nn.Module, optimizer: Optimizer, scheduler: Any, out_dir: Path) -> None:
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    if scheduler is not None:
        state["lr_scheduler"] = scheduler.state_dict()
    dcp.save(state, checkpoint_id=str(out_dir))


def load_optimizer(model: nn.Module, optimizer: Optimizer, scheduler: Any, in_dir: Path) -> None:
    if not (in_dir / ".metadata").is_file():
        raise checkpoint_error(f"{in_dir} holds no optimizer state (no DCP .metadata)")
    state: dict[str, Any] = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    if scheduler is not None:
        state["lr_scheduler"] = scheduler.state_dict()
    try:
        dcp.load(state, checkpoint_id=str(in_dir))
    except Exception as exc:  # noqa: BLE001 - a mismatch is the user's checkpoint, not a bug
        raise checkpoint_error(
            f"{in_dir}: optimizer state does not fit this model/optimizer "
            f"({type(exc).__name__}: {str(exc)[:300]})"
        ) from None
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(state["lr_scheduler"])
