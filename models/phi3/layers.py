"""Phi-3's residual dropout around the common attention and SwiGLU MLP.

Phi-3 drops out each block's output (`resid_pdrop`) before it joins the residual stream:
x + dropout(attn(norm(x))), then x + dropout(mlp(norm(x))). The modules here are the common
ones with that dropout on their output, so parameter names, the tensor-parallel plan and
the math in eval mode are unchanged; with `resid_pdrop` 0 (every released checkpoint) they
are the common modules exactly. Dropout draws from the global RNG in the same order as
transformers (attention, then MLP, per layer), so seeded training steps match it too.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from models.common.layers import Attention, SwiGLUMLP


def residual_dropout_rate(config: Any) -> float:
    return float(getattr(config, "resid_pdrop", 0.0) or 0.0)


class Phi3Attention(Attention):
    """The common attention, its output dropped out at `resid_pdrop` while training."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.resid_pdrop = residual_dropout_rate(config)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = super().forward(*args, **kwargs)
        return F.dropout(out, self.resid_pdrop, self.training) if self.resid_pdrop else out


class Phi3MLP(SwiGLUMLP):
    """The common SwiGLU MLP, its output dropped out at `resid_pdrop` while training."""

    def __init__(self, config: Any) -> None:
        super().__init__(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.resid_pdrop = residual_dropout_rate(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return F.dropout(out, self.resid_pdrop, self.training) if self.resid_pdrop else out


def phi3_mlp(config: Any, layer_idx: int) -> Phi3MLP:
    """`DecoderModel`'s MLP factory for Phi-3 (the same MLP on every layer)."""
    return Phi3MLP(config)
