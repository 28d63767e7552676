"""Rotary position embeddings: inverse frequencies for default, linear, llama3 and YaRN RoPE.

`rope_unsupported_reason(config)` says which `rope_parameters` the native classes cannot
honour (dynamic NTK and longrope change frequencies with the sequence length), so the
loader falls back to Hugging Face for them. `RotaryEmbedding` turns position ids into the
(cos, sin) pair every attention layer applies with `apply_rotary`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from models.registry import NATIVE_ROPE_TYPES


def rope_parameters(config: Any) -> dict[str, Any]:
    """The config's RoPE parameters as one dict (transformers 5 `rope_parameters`)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    scaling = getattr(config, "rope_scaling", None)
    if not params and isinstance(scaling, dict):
        params = dict(scaling)
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params


def rope_unsupported_reason(config: Any) -> str | None:
    params = rope_parameters(config)
    if params["rope_type"] not in NATIVE_ROPE_TYPES:
        return f"rope_type {params['rope_type']!r} (native supports {', '.join(NATIVE_ROPE_TYPES)})"
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        return "partial_rotary_factor != 1.0"
    return None


def head_dim_of(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def inverse_frequencies(config: Any) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention_scaling) for the config's rope type."""
    params = rope_parameters(config)
    dim = head_dim_of(config)
    base = float(params["rope_theta"])
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim
    inv_freq = 1.0 / (base**exponent)
    kind = params["rope_type"]
    if kind == "linear":
        return inv_freq / float(params["factor"]), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, params), 1.0
    if kind == "yarn":
        return _yarn(config, params, dim, base)
    return inv_freq, 1.0


def _llama3(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between."""
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(config: Any, params: dict[str, Any], dim: int, base: float) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate low frequencies, extrapolate high ones, ramp between (paper 2309.00071)."""
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or config.max_position_embeddings / original
    attention_factor = params.get("attention_factor")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


class RotaryEmbedding(nn.Module):
    """Position ids -> (cos, sin), each (batch, seq, head_dim), in the activation dtype."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        inv_freq, self.attention_scaling = inverse_frequencies(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def reset_buffers(self) -> None:
        """Recompute the frequencies (after meta-device construction and `to_empty`)."""
        inv_freq, self.attention_scaling = inverse_frequencies(self.config)
        self.inv_freq = inv_freq.to(self.inv_freq.device)

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos_sin(x, position_ids, self.inv_freq)

    def cos_sin(
        self, x: torch.Tensor, position_ids: torch.Tensor, inv_freq: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) of `position_ids` at `inv_freq` (subclasses that pick frequencies per
        call pass theirs), times `attention_scaling`, in x's dtype."""
        inv_freq = inv_freq.to(device=position_ids.device, dtype=torch.float)
        freqs = position_ids[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k, shaped (batch, heads, seq, head_dim), by per-position angles.

    When cos/sin cover fewer dims than head_dim (partial rotary, e.g. Phi-3's
    `partial_rotary_factor`), only the leading dims rotate; the rest pass through.
    """
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rotary = cos.shape[-1]
    if rotary == q.shape[-1]:
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    q_rot, k_rot = q[..., :rotary], k[..., :rotary]
    q_out = torch.cat([q_rot * cos + rotate_half(q_rot) * sin, q[..., rotary:]], dim=-1)
    k_out = torch.cat([k_rot * cos + rotate_half(k_rot) * sin, k[..., rotary:]], dim=-1)
    return q_out, k_out
