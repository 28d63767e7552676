"""Mixtral's sparse block: the shared MoE router and grouped experts, sized by Mixtral's config.

Every Mixtral layer is sparse: `num_local_experts` SwiGLU experts of width
`intermediate_size`, top-`num_experts_per_tok` routing whose weights are always
renormalised to sum 1, and, while training with `router_jitter_noise` > 0, the block's
input scaled by uniform noise in [1 - j, 1 + j] before both routing and the experts (drawn
exactly as transformers draws it, so seeded runs agree). The router computes in fp32 and
its weight stays fp32 (`_keep_in_fp32_modules_strict` in `model.py`).
"""

from __future__ import annotations

from typing import Any

import torch

from models.common.moe.layers import GroupedExperts, SparseMoeBlock, TopKRouter


class MixtralSparseMoeBlock(SparseMoeBlock):
    """Router (renormalised top-k) + grouped experts, with optional training jitter."""

    def __init__(self, config: Any) -> None:
        super().__init__(
            config,
            gate=TopKRouter(config, norm_topk_prob=True),
            experts=GroupedExperts(
                config,
                num_experts=config.num_local_experts,
                intermediate_size=config.intermediate_size,
            ),
        )
        self.jitter_noise = float(getattr(config, "router_jitter_noise", 0.0) or 0.0)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.training and self.jitter_noise > 0:
            noise = torch.empty_like(hidden_states)
            noise.uniform_(1.0 - self.jitter_noise, 1.0 + self.jitter_noise)
            hidden_states = hidden_states * noise
        return super().forward(hidden_states)


def mixtral_mlp(config: Any, layer_idx: int) -> MixtralSparseMoeBlock:
    return MixtralSparseMoeBlock(config)
