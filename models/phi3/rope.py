"""Phi-3 rotary embeddings: partial rotary and LongRoPE (short/long per-dimension factors).

Phi-3 configs may rotate only the leading `partial_rotary_factor` share of each head
(Phi-4-mini: 0.75), so the frequencies here cover `int(head_dim * factor)` dims and the
common `apply_rotary` passes the rest through. LongRoPE (`rope_type: longrope`, the
128k checkpoints) divides each frequency by a per-dimension factor: `short_factor` while
the batch's largest position id + 1 is at most `original_max_position_embeddings`,
`long_factor` beyond it (the whole batch switches at once, as transformers does), and
scales cos/sin by sqrt(1 + ln(s) / ln(original)) with s = max_position_embeddings /
original (or the config's `factor` / `attention_factor`). `phi3_rope_unsupported_reason`
names what this module cannot honour.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from models.common.rope import RotaryEmbedding, head_dim_of, rope_parameters

PHI3_ROPE_TYPES = ("default", "longrope")


def rotary_dim(config: Any) -> int:
    """How many leading dims of each head rotate (the rest pass through unrotated)."""
    factor = float(rope_parameters(config).get("partial_rotary_factor", 1.0) or 1.0)
    return int(head_dim_of(config) * factor)


def phi3_rope_unsupported_reason(config: Any) -> str | None:
    """Why the native Phi-3 rotary cannot follow this config (None when it can)."""
    params = rope_parameters(config)
    kind = params["rope_type"]
    if kind not in PHI3_ROPE_TYPES:
        return f"rope_type {kind!r} (native Phi-3 supports {', '.join(PHI3_ROPE_TYPES)})"
    dim = rotary_dim(config)
    if dim <= 0 or dim % 2:
        return f"rotary dims {dim} (head_dim x partial_rotary_factor must be even and > 0)"
    if kind == "longrope":
        for name in ("short_factor", "long_factor"):
            if len(params.get(name) or ()) != dim // 2:
                return f"rope_parameters.{name} must hold {dim // 2} numbers (rotary dims / 2)"
        if not params.get("original_max_position_embeddings"):
            return "longrope without original_max_position_embeddings"
    return None


def _base_exponents(config: Any) -> torch.Tensor:
    dim = rotary_dim(config)
    return torch.arange(0, dim, 2, dtype=torch.int64).float() / dim


def longrope_attention_factor(config: Any) -> float:
    """The cos/sin scale LongRoPE applies at every length (1.0 when not extended)."""
    params = rope_parameters(config)
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or config.max_position_embeddings / original
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))


def phi3_frequencies(config: Any, long: bool = False) -> tuple[torch.Tensor, float]:
    """(inv_freq over the rotary dims, cos/sin scale); `long` picks LongRoPE's long factors."""
    params = rope_parameters(config)
    base = float(params["rope_theta"])
    if params["rope_type"] != "longrope":
        return 1.0 / (base ** _base_exponents(config)), 1.0
    factors = torch.tensor(params["long_factor" if long else "short_factor"], dtype=torch.float32)
    return 1.0 / (factors * base ** _base_exponents(config)), longrope_attention_factor(config)


class Phi3RotaryEmbedding(RotaryEmbedding):
    """`RotaryEmbedding` over the rotary dims, switching LongRoPE factors by sequence length."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        params = rope_parameters(config)
        self.longrope = params["rope_type"] == "longrope"
        self.original_max = int(params.get("original_max_position_embeddings") or 0)
        self._set_frequencies()

    def _set_frequencies(self) -> None:
        device = self.inv_freq.device
        short, self.attention_scaling = phi3_frequencies(self.config)
        long, _ = phi3_frequencies(self.config, long=True)
        self.register_buffer("short_inv_freq", short.to(device), persistent=False)
        self.register_buffer("long_inv_freq", long.to(device), persistent=False)
        self.register_buffer("inv_freq", short.to(device), persistent=False)

    def reset_buffers(self) -> None:
        """Recompute the frequencies (after meta-device construction and `to_empty`)."""
        self._set_frequencies()

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.longrope:
            return self.cos_sin(x, position_ids, self.inv_freq)
        # A traceable choice (no host sync on the length, no module state written).
        is_long = position_ids.max() + 1 > self.original_max
        inv_freq = torch.where(is_long, self.long_inv_freq, self.short_inv_freq)
        return self.cos_sin(x, position_ids, inv_freq)
