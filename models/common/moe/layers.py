"""The sparse MoE block's pieces: an fp32 softmax top-k router and grouped routed experts.

The experts keep each projection of all experts in one tensor, indexed by expert id:
`experts.gate_proj` and `experts.up_proj` are (num_experts, moe_intermediate, hidden),
`experts.down_proj` is (num_experts, hidden, moe_intermediate) -- the Hugging Face
per-expert `nn.Linear` weights stacked in expert order, with no transposes (see
`state_dict_adapter.py`); with an `ep` mesh they run through `expert_parallel.py`. The
router (`gate`) computes in fp32 whatever the model dtype; a family lists it in
`_keep_in_fp32_modules_strict` so its weight stays fp32 too. Sizes and renormalisation
default to the config's `num_experts`, `moe_intermediate_size` and `norm_topk_prob`;
families whose configs name them otherwise pass them in.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.common.layers import _ACTIVATIONS
from models.common.moe.expert_parallel import (
    EXPERT_TENSORS,
    expert_parallel_forward,
    shard_experts,
    swiglu_expert,
)
from models.common.moe.lora import LORA_TENSORS, has_expert_lora, swiglu_lora_expert


class TopKRouter(nn.Module):
    """Softmax over experts in fp32, keep the top k, optionally renormalise them to sum 1."""

    def __init__(self, config: Any, norm_topk_prob: bool | None = None) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        # Families that always renormalise (Mixtral) pass it; others read their config.
        self.norm_topk_prob = bool(
            config.norm_topk_prob if norm_topk_prob is None else norm_topk_prob
        )
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))

    def init_weights(self, std: float) -> None:
        self.weight.normal_(0.0, std)

    def forward(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """flat (tokens, hidden) -> (router logits fp32, top-k weights, top-k expert ids)."""
        logits = F.linear(flat.float(), self.weight.float())
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(flat.dtype), experts


class GroupedExperts(nn.Module):
    """All routed experts' SwiGLU weights as three (num_experts, out, in) tensors."""

    def __init__(
        self, config: Any, num_experts: int | None = None, intermediate_size: int | None = None
    ) -> None:
        super().__init__()
        # Families whose configs name the expert count or width differently pass them.
        experts = config.num_experts if num_experts is None else num_experts
        hidden = config.hidden_size
        inter = config.moe_intermediate_size if intermediate_size is None else intermediate_size
        self.num_experts = experts
        self.gate_proj = nn.Parameter(torch.empty(experts, inter, hidden))
        self.up_proj = nn.Parameter(torch.empty(experts, inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(experts, hidden, inter))
        self.act_fn = _ACTIVATIONS[config.hidden_act]
        self.ep_mesh: Any = None  # set by `shard_experts` (expert parallelism)
        self.local_experts = (0, experts)

    @property
    def expert_tensor_names(self) -> tuple[str, ...]:
        """The `[num_experts, ...]` tensors, in `expert_forward` order: the three weights,
        then an adapter's four (`models.common.moe.lora`) when LoRA adapts the experts."""
        return EXPERT_TENSORS + (LORA_TENSORS if has_expert_lora(self) else ())

    def expert_forward(self, chunk: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
        """One expert on its tokens; `tensors` are its slices of `expert_tensor_names`."""
        if len(tensors) > len(EXPERT_TENSORS):
            return swiglu_lora_expert(self, chunk, *tensors)
        return swiglu_expert(self, chunk, *tensors)

    def shard_experts(self, mesh: Any) -> list[nn.Parameter]:
        """Expert parallelism: keep this rank's experts on the 1-D `mesh` (see
        `expert_parallel.py`); returns the sharded parameters."""
        return shard_experts(self, mesh)

    def init_weights(self, std: float) -> None:
        for weight in (self.gate_proj, self.up_proj, self.down_proj):
            weight.normal_(0.0, std)

    def forward(
        self, flat: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
    ) -> torch.Tensor:
        """Tokens sorted by expert, one matmul chain per expert, weighted sum back per token."""
        if self.ep_mesh is not None:
            return expert_parallel_forward(self, flat, weights, experts)
        top_k = experts.shape[-1]
        order = experts.reshape(-1).argsort(stable=True)
        token_of = order // top_k
        counts = torch.bincount(experts.reshape(-1), minlength=self.num_experts).tolist()
        tensors = [getattr(self, name) for name in self.expert_tensor_names]
        outputs = []
        for expert, chunk in enumerate(flat[token_of].split(counts)):
            if chunk.shape[0] == 0:
                continue
            outputs.append(self.expert_forward(chunk, *(t[expert] for t in tensors)))
        if not outputs:
            return torch.zeros_like(flat)
        routed = torch.cat(outputs) * weights.reshape(-1)[order, None]
        return torch.zeros_like(flat).index_add_(0, token_of, routed.to(flat.dtype))


class SparseMoeBlock(nn.Module):
    """Router + routed experts, without a shared expert.

    With `record_router_logits` set, the last forward's router logits stay on
    `router_logits` for the load-balancing loss (read and cleared by the model).
    """

    def __init__(
        self, config: Any, gate: nn.Module | None = None, experts: nn.Module | None = None
    ) -> None:
        super().__init__()
        # Other families pass their own router / experts built from their config fields.
        self.gate = TopKRouter(config) if gate is None else gate
        self.experts = GroupedExperts(config) if experts is None else experts
        self.record_router_logits = bool(getattr(config, "output_router_logits", False))
        self.router_logits: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, shape[-1])
        logits, weights, experts = self.gate(flat)
        if self.record_router_logits:
            self.router_logits = logits
        return self.experts(flat, weights, experts).reshape(shape)
