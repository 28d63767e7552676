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


def _warmup_decay_lrs(steps: int, **kwargs) -> list[float]:
    from trainer.schedulers import WarmupDecay

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = WarmupDecay(opt, **kwargs)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def test_warmup_decay_cosine_by_hand() -> None:
    lrs = _warmup_decay_lrs(12, max_steps=10, lr_warmup_steps=2, min_lr=0.1, init_lr=0.0)
    assert lrs[:3] == pytest.approx([0.0, 0.5, 1.0])
    assert lrs[6] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 4 / 8)))
    assert lrs[10] == pytest.approx(0.1) and lrs[11] == pytest.approx(0.1)


def test_warmup_decay_defaults_follow_the_optimizer_lr() -> None:
    # 100 steps: warm-up 10 from 10% of the LR, decay to 1% of it.
    lrs = _warmup_decay_lrs(101, max_steps=100)
    assert lrs[0] == pytest.approx(0.1) and lrs[10] == pytest.approx(1.0)
    assert lrs[100] == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("style", "at_6"),
    [("linear", 0.1 + 0.9 * 0.5), ("constant", 1.0), ("inverse-square-root", 2**0.5 / 6**0.5)],
)
def test_warmup_decay_styles(style: str, at_6: float) -> None:
    lrs = _warmup_decay_lrs(
        8, max_steps=10, lr_decay_style=style, lr_warmup_steps=2, min_lr=0.1, init_lr=0.0
    )
    assert lrs[6] == pytest.approx(at_6)


def test_warmup_decay_restores_exactly() -> None:
    from trainer.schedulers import WarmupDecay

    def make():
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        return opt, WarmupDecay(opt, max_steps=10, lr_warmup_steps=3)

    opt, sched = make()
    for _ in range(5):
        opt.step()
        sched.step()
    opt2, sched2 = make()
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sched.state_dict())
    assert sched2.get_last_lr() == sched.get_last_lr()
