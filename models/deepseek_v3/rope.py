"""DeepSeek-V3's RoPE specifics: interleaved rotary pairs and the YaRN softmax-scale correction.

The frequencies themselves are the common ones (`models.common.rope`, over `head_dim`, which
DeepSeek configs set to `qk_rope_head_dim`). Two things differ. With `rope_interleave`
(the default) the checkpoint's rotary dimensions come in adjacent pairs (x0, x1), (x2, x3),
... each rotated by one frequency, and the rotated result is written de-interleaved (all
first members, then all second members), as transformers does. And when the rope type is
not default and `mscale_all_dim` is set (YaRN), the attention softmax scale is multiplied
by mscale(factor, mscale_all_dim) squared, on top of the cos/sin attention factor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from models.common.rope import _yarn_mscale, apply_rotary, rope_parameters


def apply_rotary_interleaved(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k, (batch, heads, seq, dim), whose rotary pairs are adjacent."""
    half = cos.shape[-1] // 2  # cos/sin are cat(freqs, freqs): the first half has each angle
    cos, sin = cos[..., :half].unsqueeze(1), sin[..., :half].unsqueeze(1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.cat([even * cos - odd * sin, odd * cos + even * sin], dim=-1)

    return rotate(q), rotate(k)


Rotary = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def rotary_function(config: Any) -> Rotary:
    """The rotary application the config's checkpoint layout needs."""
    interleaved = getattr(config, "rope_interleave", True)
    return apply_rotary_interleaved if interleaved else apply_rotary


def mla_softmax_scale(config: Any) -> float:
    """1/sqrt(qk_nope_head_dim + qk_rope_head_dim), times mscale^2 for scaled RoPE."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    params = rope_parameters(config)
    mscale_all_dim = params.get("mscale_all_dim") or 0
    if params["rope_type"] != "default" and mscale_all_dim:
        mscale = _yarn_mscale(float(params["factor"]), float(mscale_all_dim))
        scale = scale * mscale * mscale
    return scale
