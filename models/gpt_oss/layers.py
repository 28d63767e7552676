"""gpt-oss layers: attention with per-head sinks, a biased top-k router, clamped-SwiGLU experts.

Attention keeps the common q/k/v/o projections (all biased in gpt-oss) and RoPE, and adds
`sinks`: one learned logit per head that joins every query's softmax as an extra column
and is dropped afterwards, so a head can put weight "nowhere". Scaled-dot-product kernels
take no such column, so attention runs eagerly (q.k, mask, sink column, fp32 softmax,
weights.v); a float-mask SDPA with an appended zero key would be exact too, but it needs
the same (batch, heads, q, k) tensor, so it saves nothing. The window of a
"sliding_attention" layer arrives in the boolean mask the common `DecoderModel` builds.

The MoE block's router is a biased linear layer; the top-k logits (not probabilities) are
picked and softmaxed among themselves. The experts hold, for every expert e, a biased
`gate_up_proj[e]` of shape (2*intermediate, hidden) whose rows interleave gate and up
(row 2i is gate unit i, row 2i+1 up unit i, as the released checkpoints do) and a biased
`down_proj[e]` (hidden, intermediate). The activation is gpt-oss's clamped SwiGLU:
gate clamped above at `swiglu_limit`, up clamped to +-limit, `(up + 1) * gate *
sigmoid(alpha * gate)`. Expert dispatch, and expert parallelism, are the grouped-expert
machinery of `models.common.moe.expert_parallel`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.common.layers import Attention, RMSNorm, _repeat_kv
from models.common.moe.expert_parallel import (
    expert_parallel_forward,
    local_expert_output,
    shard_experts,
)


class GptOssRMSNorm(RMSNorm):
    """RMSNorm whose weight multiplies the fp32 activations before the cast back (gpt-oss
    order; identical to the common norm in fp32, one rounding fewer in bf16)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight * x).to(dtype)


def causal_mask(seq: int, device: torch.device) -> torch.Tensor:
    return torch.ones(seq, seq, dtype=torch.bool, device=device).tril()[None, None]


class GptOssAttention(Attention):
    """Grouped-query attention with biased projections and one sink logit per head."""

    def __init__(self, config: Any) -> None:
        super().__init__(config, qkv_bias=bool(config.attention_bias))
        self.sinks = nn.Parameter(torch.empty(config.num_attention_heads))

    def init_weights(self, std: float) -> None:
        self.sinks.normal_(0.0, std)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.context_parallel is not None:
            raise ValueError("gpt-oss attention sinks have no context-parallel path")
        batch, seq = hidden_states.shape[:2]
        q, k, v = self.project_qkv(hidden_states, position_embeddings)
        groups = q.shape[1] // k.shape[1]
        k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
        allowed = causal_mask(seq, q.device) if attention_mask is None else attention_mask
        probs = self.sink_softmax(torch.matmul(q, k.transpose(2, 3)) * self.scaling, allowed)
        probs = F.dropout(probs, p=self.dropout, training=self.training).to(v.dtype)
        out = torch.matmul(probs, v)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))

    def sink_softmax(self, scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Softmax over [masked scores, sink] in fp32, sink column dropped."""
        scores = scores.float().masked_fill(~allowed, float("-inf"))
        sinks = self.sinks.float().reshape(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        logits = torch.cat([scores, sinks], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        return torch.softmax(logits, dim=-1)[..., :-1]


class GptOssRouter(nn.Module):
    """Biased linear router in fp32: top-k logits, softmaxed among themselves."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.weight = nn.Parameter(torch.zeros(config.num_local_experts, config.hidden_size))
        self.bias = nn.Parameter(torch.zeros(config.num_local_experts))

    def init_weights(self, std: float) -> None:
        self.weight.normal_(0.0, std)
        self.bias.normal_(0.0, std)

    def forward(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """flat (tokens, hidden) -> (router logits fp32, top-k weights, top-k expert ids)."""
        logits = F.linear(flat.float(), self.weight.float(), self.bias.float())
        top, experts = torch.topk(logits, self.top_k, dim=-1)
        weights = torch.softmax(top, dim=-1)
        return logits, weights.to(flat.dtype), experts


class GptOssExperts(nn.Module):
    """Every expert's biased gate_up and down projections as (num_experts, out, in) tensors."""

    expert_tensor_names = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")

    def __init__(self, config: Any) -> None:
        super().__init__()
        experts, hidden, inter = (
            config.num_local_experts,
            config.hidden_size,
            config.intermediate_size,
        )
        self.num_experts = experts
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * inter, hidden))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(experts, 2 * inter))
        self.down_proj = nn.Parameter(torch.empty(experts, hidden, inter))
        self.down_proj_bias = nn.Parameter(torch.empty(experts, hidden))
        self.alpha = float(config.swiglu_alpha)
        self.limit = float(config.swiglu_limit)
        self.ep_mesh: Any = None  # set by `shard_experts` (expert parallelism)
        self.local_experts = (0, experts)

    def shard_experts(self, mesh: Any) -> list[nn.Parameter]:
        """Expert parallelism: keep this rank's experts on the 1-D `mesh`."""
        return shard_experts(self, mesh)

    def init_weights(self, std: float) -> None:
        self.gate_up_proj.normal_(0.0, std)
        self.gate_up_proj_bias.zero_()
        self.down_proj.normal_(0.0, std)
        self.down_proj_bias.zero_()

    def expert_forward(
        self,
        chunk: torch.Tensor,
        gate_up: torch.Tensor,
        gate_up_bias: torch.Tensor,
        down: torch.Tensor,
        down_bias: torch.Tensor,
    ) -> torch.Tensor:
        """One expert on its tokens: biased gate_up, clamped SwiGLU, biased down."""
        projected = chunk @ gate_up.T + gate_up_bias
        gate, up = projected[..., ::2], projected[..., 1::2]
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        hidden = (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
        return hidden @ down.T + down_bias

    def forward(
        self, flat: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
    ) -> torch.Tensor:
        if self.ep_mesh is not None:
            return expert_parallel_forward(self, flat, weights, experts)
        return local_expert_output(self, flat, weights, experts)


class GptOssMoeBlock(nn.Module):
    """Router + experts, every layer (gpt-oss has no dense or shared-expert MLP).

    With `record_router_logits` set, the last forward's router logits stay on
    `router_logits` for the load-balancing loss (read and cleared by the model).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.router = GptOssRouter(config)
        self.experts = GptOssExperts(config)
        self.record_router_logits = bool(getattr(config, "output_router_logits", False))
        self.router_logits: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, shape[-1])
        logits, weights, experts = self.router(flat)
        if self.record_router_logits:
            self.router_logits = logits
        return self.experts(flat, weights, experts).reshape(shape)
