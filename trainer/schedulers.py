"""Learning-rate schedules the recipe's `lr_scheduler` section can name.

`CosineAnnealingWarmup` warms up linearly for `warmup_steps`, then follows a half cosine
from the optimizer's base LR down to `min_lr` at `max_steps` (the trainer passes
`step_scheduler.max_steps` when the section does not set it). The LR is a closed-form
function of the step count, so a restored scheduler gives exactly the LR of the
uninterrupted run.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler


class CosineAnnealingWarmup(LRScheduler):
    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int = 0,
        min_lr: float = 0.0,
        max_steps: int | None = None,
    ):
        if warmup_steps < 0:
            raise ValueError("warmup_steps must be >= 0")
        self.warmup_steps = int(warmup_steps)
        self.min_lr = float(min_lr)
        self.max_steps = int(max_steps) if max_steps is not None else None
        super().__init__(optimizer)

    def lr_at(self, base_lr: float, step: int) -> float:
        """LR for optimizer step `step` (0-based)."""
        if step < self.warmup_steps:
            return base_lr * (step + 1) / self.warmup_steps
        if self.max_steps is None or self.max_steps <= self.warmup_steps:
            return base_lr
        progress = min(1.0, (step - self.warmup_steps) / (self.max_steps - self.warmup_steps))
        return self.min_lr + 0.5 * (base_lr - self.min_lr) * (1.0 + math.cos(math.pi * progress))

    def get_lr(self) -> list[float]:
        return [self.lr_at(base, self.last_epoch) for base in self.base_lrs]

    def _get_closed_form_lr(self) -> list[float]:
        return self.get_lr()
