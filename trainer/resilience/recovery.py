"""Divergence handling after each step: fail at a non-finite loss, or (opt-in) roll back.

Without a `recovery:` section a non-finite loss fails the run at that step (`NAN_LOSS`),
naming the step's dataset rows. With `recovery.on_nan: rollback` (and/or
`recovery.on_spike: {factor, window}`, a loss above `factor` x the median of the losses of
the previous `window` steps) the run is rebuilt from its LATEST checkpoint by the same
`setup_run` a resume takes (or from its start when no checkpoint exists yet), the offending
step's micro-batch positions join `run.skipped_batches` (saved in every later checkpoint,
so a later resume skips them too), the learning rate is scaled by `lr_scale` per rollback,
and a `rollback` event names the step, the reason, the rows skipped and where it went back
to; the restored state is then proven like any resume (`trainer.resilience.fingerprint`). After
`max_retries` rollbacks the next divergence fails the run naming its rows.

`TUNEYARD_TEST_POISON_ROWS` (tests only; comma-separated dataset indices) fills the first
trainable parameter with NaN before any step that draws one of those rows, so a test sees
a real NaN loss that only a rollback (which skips those rows) can get past;
`TUNEYARD_TEST_SPIKE_ROWS` multiplies the last trainable parameter (the output head) by
100 instead: a finite loss spike.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from typing import Any

import torch

from jobs.recipe.exit_codes import ExitCode
from jobs.recipe.typed import Recovery
from trainer.errors import TrainerError
from trainer.resilience import fingerprint
from trainer.sample_log import Position, StepRows, describe

POISON_ENV = "TUNEYARD_TEST_POISON_ROWS"
SPIKE_ENV = "TUNEYARD_TEST_SPIKE_ROWS"
SPIKE_SCALE = 100.0


def _rows_env(name: str) -> set[int]:
    return {int(i) for i in os.environ.get(name, "").split(",") if i.strip()}


def spike_threshold(history: dict[int, float], step: int, factor: float, window: int) -> float:
    """factor x the median loss of steps [step - window, step); inf until the window is full."""
    previous = [history[s] for s in range(step - window, step) if s in history]  # O(window)
    if len(previous) < window:
        return math.inf
    return factor * statistics.median(previous)


class DivergenceGuard:
    """Per step loop: the recent losses, the rollbacks done, the poisoned rows (tests)."""

    def __init__(self, settings: Recovery, rows: StepRows):
        self.settings, self.rows = settings, rows
        self.history: dict[int, float] = {}
        self.rollbacks = 0
        self.poison, self.spike = _rows_env(POISON_ENV), _rows_env(SPIKE_ENV)

    def inject_fault(self, run: Any, positions: list[Position]) -> None:
        """Tests only: NaN (or a x100 head) into the weights before a step that draws a
        poisoned (or spiking) row."""
        if not self.poison and not self.spike:
            return
        drawn = {r["index"] for r in self.rows.rows(run, positions)}
        trainable = [p for p in run.model.parameters() if p.requires_grad]
        with torch.no_grad():
            if drawn & self.poison:
                _local(trainable[0]).fill_(float("nan"))
            if drawn & self.spike:
                _local(trainable[-1]).mul_(SPIKE_SCALE)

    def reason(self, loss: float, step: int) -> str | None:
        if not math.isfinite(loss):
            return "nan"
        spike = self.settings.on_spike
        if spike is not None and loss > spike_threshold(
            self.history, step, spike.factor, spike.window
        ):
            return "spike"
        return None

    def check(self, run: Any, log: Any, loss: float, positions: list[Position]) -> bool:
        """After step `run.step`: False to go on; True after a rollback; raises to fail."""
        reason = self.reason(loss, run.step)
        if reason is None:
            self.history[run.step] = loss
            return False
        rows = self.rows.rows(run, positions)
        if reason == "nan" and self.settings.on_nan != "rollback":
            raise TrainerError(
                ExitCode.NAN_LOSS,
                f"loss became {loss} at step {run.step} ({describe(rows)}); lower optimizer.lr, "
                "set clip_grad_norm.max_norm, or set recovery.on_nan: rollback",
            )
        if self.rollbacks >= self.settings.max_retries:
            raise TrainerError(
                ExitCode.NAN_LOSS,
                f"loss {loss} at step {run.step} ({reason}; {describe(rows)}) after "
                f"{self.rollbacks} rollbacks (recovery.max_retries); lower optimizer.lr or "
                "remove these rows from the dataset",
            )
        self.roll_back(run, log, reason, loss, positions, rows)
        return True

    def roll_back(
        self,
        run: Any,
        log: Any,
        reason: str,
        loss: float,
        positions: list[Position],
        rows: list[dict[str, Any]],
    ) -> None:
        from trainer.setup import setup_run  # setup imports the model stack; only when needed

        failed_step = run.step
        # A save in flight publishes before LATEST is read, and is reported like any other.
        log.checkpoints_saved(run.checkpoints.wait())
        recipe = run.recipe
        if run.checkpoints.latest() is not None and recipe.restore_from is not None:
            recipe = dataclasses.replace(recipe, restore_from=None)  # this run's own LATEST
        skipped = set(run.skipped_batches) | set(positions)
        fresh = setup_run(recipe, log.run_dir, run.env, checkpoints=run.checkpoints)
        fresh.skipped_batches = skipped
        fresh.step_loss = fresh.step_loss or run.step_loss  # a recipe's own loss (KD) stays
        self.rollbacks += 1
        scale = self.settings.lr_scale**self.rollbacks
        if scale != 1.0:
            scale_lr(fresh, scale)
        for f in dataclasses.fields(run):
            setattr(run, f.name, getattr(fresh, f.name))
        self.history = {s: v for s, v in self.history.items() if s <= run.step}
        log.event(
            "rollback",
            failed_step,
            reason=reason,
            loss=loss,
            to_step=run.step,
            path=str(run.resumed_from) if run.resumed_from else None,
            skipped_rows=rows,
            skipped_batches=[list(p) for p in positions],
            retry=self.rollbacks,
            max_retries=self.settings.max_retries,
            lr_scale=scale,
            message=f"{reason} at step {failed_step}: skipped "
            f"{describe(rows)}, back to step {run.step}",
        )
        if run.resumed_from is not None:
            fingerprint.verify_resume(run, log)


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if hasattr(param, "to_local") else param


def scale_lr(run: Any, scale: float) -> None:
    """Multiply every param group's learning rate (and the schedule's base) by `scale`."""
    for group in run.optimizer.param_groups:
        group["lr"] *= scale
        if "initial_lr" in group:
            group["initial_lr"] *= scale
    if run.scheduler is not None and hasattr(run.scheduler, "base_lrs"):
        run.scheduler.base_lrs = [lr * scale for lr in run.scheduler.base_lrs]
