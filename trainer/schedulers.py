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


DEFAULT_WARMUP_CAP = 1000  # warm up for min(1000, 10% of the run) unless a recipe says


class WarmupDecay(LRScheduler):
    """Linear warm-up from `init_lr` to `max_lr`, then a decay to `min_lr` at `lr_decay_steps`.

    The schedule a recipe describes with AutoModel's scheduler keys (`lr_decay_style`,
    `lr_warmup_steps`, `min_lr`, ...). Left out, `max_lr` is the optimizer's LR, `init_lr`
    10% and `min_lr` 1% of it, `lr_decay_steps` the run's `max_steps` and the warm-up
    min(1000, 10% of it). Styles: cosine, linear, constant (hold `max_lr` after warm-up),
    inverse-square-root. Closed form in the step count, so a restored run gets the same LR.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        max_steps: int = 1,
        lr_decay_style: str = "cosine",
        lr_warmup_steps: int | None = None,
        lr_decay_steps: int | None = None,
        init_lr: float | None = None,
        max_lr: float | None = None,
        min_lr: float | None = None,
    ):
        if lr_decay_style not in ("cosine", "linear", "constant", "inverse-square-root"):
            raise ValueError(f"unknown lr_decay_style {lr_decay_style!r}")
        self.style = lr_decay_style
        self.decay_steps = int(lr_decay_steps or max_steps)
        default_warmup = min(DEFAULT_WARMUP_CAP, self.decay_steps // 10)
        self.warmup_steps = int(default_warmup if lr_warmup_steps is None else lr_warmup_steps)
        self.init_lr, self.max_lr, self.min_lr = init_lr, max_lr, min_lr
        super().__init__(optimizer)

    def lr_at(self, base_lr: float, step: int) -> float:
        """LR for optimizer step `step` (0-based) of a parameter group whose LR is `base_lr`."""
        peak = base_lr if self.max_lr is None else self.max_lr
        start = 0.1 * peak if self.init_lr is None else self.init_lr
        floor = 0.01 * peak if self.min_lr is None else self.min_lr
        warmup = self.warmup_steps
        if warmup > 0 and step <= warmup:
            return start + (peak - start) * step / warmup
        if self.style == "constant" or self.decay_steps <= warmup:
            return peak
        if step > self.decay_steps:
            return floor
        if self.style == "inverse-square-root":
            return max(floor, peak * max(warmup, 1) ** 0.5 / max(step, 1) ** 0.5)
        ratio = (step - warmup) / (self.decay_steps - warmup)
        coeff = 1.0 - ratio if self.style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return floor + coeff * (peak - floor)

    def get_lr(self) -> list[float]:
        return [self.lr_at(base, self.last_epoch) for base in self.base_lrs]

    def _get_closed_form_lr(self) -> list[float]:
        return self.get_lr()
