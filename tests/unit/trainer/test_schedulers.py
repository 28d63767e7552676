"""LR schedulers: cosine with warm-up, and exact restore from a state dict."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.schedulers import CosineAnnealingWarmup


def test_cosine_warmup_schedule_and_exact_restore() -> None:
    def make():
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        return opt, CosineAnnealingWarmup(opt, warmup_steps=2, min_lr=0.1, max_steps=10)

    opt, sched = make()
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:3] == [0.5, 1.0, 1.0]
    assert lrs[-1] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 7 / 8)))
    opt2, sched2 = make()
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sched.state_dict())
    assert sched2.get_last_lr() == sched.get_last_lr()
