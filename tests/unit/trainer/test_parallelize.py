"""Sharding helpers: gradient clipping across meshes, the mixed-precision policy per device."""

from __future__ import annotations

import pytest
import torch

from trainer.parallelize import clip_grad_norm


def test_clip_grad_norm_matches_torch() -> None:
    params = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn(4, 4) * 10
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for c, p in zip(copies, params, strict=True):
        c.grad = p.grad.clone()
    expected = torch.nn.utils.clip_grad_norm_(copies, 1.0)
    assert clip_grad_norm(params, 1.0) == pytest.approx(float(expected), rel=1e-6)
    for c, p in zip(copies, params, strict=True):
        torch.testing.assert_close(p.grad, c.grad)


def test_mixed_precision_policy_applies_on_cuda_only() -> None:
    from trainer.parallelize import _mp_policy

    section = {"mp_policy": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}}
    assert _mp_policy(section, torch.device("cpu")).param_dtype is None
    policy = _mp_policy(section, torch.device("cuda", 0))
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
