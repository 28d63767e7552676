"""DeepSeek-V3 layers: multi-head latent attention and the sigmoid, group-limited MoE block.

`MLAttention` keeps Hugging Face's module names. Queries come from `q_proj`, or with a
`q_lora_rank` from `q_b_proj(q_a_layernorm(q_a_proj(x)))`; one `kv_a_proj_with_mqa`
projection gives the key/value latent (`kv_lora_rank`, normalised by `kv_a_layernorm`) and
a single rotary key part (`qk_rope_head_dim`) shared by every head; `kv_b_proj` expands
the latent into per-head non-rotary keys (`qk_nope_head_dim`) and values (`v_head_dim`).
Heads are read with `-1` from the projections, so colwise-sharded `q(_b)_proj`/`kv_b_proj`
give each tensor-parallel rank its local heads (see `parallelize.py`).

`DeepseekV3MoE` is a `GroupLimitedRouter` (`mlp.gate`: fp32 weight and the fp32
`e_score_correction_bias` buffer, which only biases which experts are chosen, never their
weights), the routed experts as the shared `GroupedExperts` (so expert parallelism is the
same machinery) and an always-on `shared_experts` SwiGLU MLP of
`moe_intermediate_size * n_shared_experts`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.common.layers import RMSNorm, SwiGLUMLP
from models.common.moe.layers import GroupedExperts
from models.deepseek_v3.rope import mla_softmax_scale, rotary_function


class MLAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2/V3), computed with SDPA."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.nope_dim, self.rope_dim = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.v_dim, self.kv_lora_rank = config.v_head_dim, config.kv_lora_rank
        self.qk_head_dim = self.nope_dim + self.rope_dim
        bias = bool(getattr(config, "attention_bias", False))
        self.q_lora_rank = config.q_lora_rank
        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, heads * self.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank)
            self.q_b_proj = nn.Linear(self.q_lora_rank, heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.kv_lora_rank + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank)
        self.kv_b_proj = nn.Linear(
            self.kv_lora_rank, heads * (self.nope_dim + self.v_dim), bias=False
        )
        self.o_proj = nn.Linear(heads * self.v_dim, hidden, bias=bias)
        self.scaling = mla_softmax_scale(config)
        self.rotary = rotary_function(config)
        self.dropout = float(getattr(config, "attention_dropout", 0.0) or 0.0)

    def queries(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.q_lora_rank is None:
            return self.q_proj(hidden_states)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch, seq = hidden_states.shape[:2]
        q = self.queries(hidden_states).view(batch, seq, -1, self.qk_head_dim).transpose(1, 2)
        q_nope, q_rot = q.split([self.nope_dim, self.rope_dim], dim=-1)
        latent, k_rot = self.kv_a_proj_with_mqa(hidden_states).split(
            [self.kv_lora_rank, self.rope_dim], dim=-1
        )
        k_rot = k_rot.reshape(batch, 1, seq, self.rope_dim)
        q_rot, k_rot = self.rotary(q_rot, k_rot, *position_embeddings)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent))
        kv = kv.view(batch, seq, -1, self.nope_dim + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_rot.expand(-1, k_nope.shape[1], -1, -1)], dim=-1)
        out = F.scaled_dot_product_attention(
            torch.cat([q_nope, q_rot], dim=-1),
            k,
            v,
            attn_mask=attention_mask,
            is_causal=attention_mask is None,
            dropout_p=self.dropout if self.training else 0.0,
            scale=self.scaling,
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class GroupLimitedRouter(nn.Module):
    """Sigmoid scores; top-k experts among the `topk_group` best of `n_group` groups.

    A group's score is the sum of its two best biased scores. The correction bias (a
    persistent fp32 buffer, never trained) is added for choosing only: the chosen experts'
    weights are their unbiased sigmoid scores, renormalised when `norm_topk_prob`, then
    multiplied by `routed_scaling_factor`. Weights are returned in fp32.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.num_experts = config.n_routed_experts
        self.top_k, self.n_group = config.num_experts_per_tok, config.n_group
        self.topk_group = config.topk_group
        self.norm_topk_prob = bool(config.norm_topk_prob)
        self.routed_scaling_factor = float(config.routed_scaling_factor)
        self.weight = nn.Parameter(torch.zeros(self.num_experts, config.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(self.num_experts))

    def init_weights(self, std: float) -> None:
        self.weight.normal_(0.0, std)
        self.e_score_correction_bias.zero_()

    def forward(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """flat (tokens, hidden) -> (router logits, top-k weights, top-k expert ids), fp32."""
        logits = F.linear(flat.float(), self.weight.float())
        scores = logits.sigmoid()
        choice = scores + self.e_score_correction_bias.float()
        per_group = self.num_experts // self.n_group
        group_scores = choice.view(-1, self.n_group, per_group).topk(2, dim=-1).values.sum(-1)
        best_groups = group_scores.topk(self.topk_group, dim=-1, sorted=False).indices
        in_best = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
        choice = choice.masked_fill(~in_best.repeat_interleave(per_group, dim=1), float("-inf"))
        ids = choice.topk(self.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return logits, weights * self.routed_scaling_factor, ids


class DeepseekV3MoE(nn.Module):
    """Routed experts (group-limited sigmoid router) plus always-on shared experts."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.gate = GroupLimitedRouter(config)
        self.experts = GroupedExperts(config, num_experts=config.n_routed_experts)
        shared = config.moe_intermediate_size * config.n_shared_experts
        self.shared_experts = SwiGLUMLP(config.hidden_size, shared, config.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, shape[-1])
        _, weights, ids = self.gate(flat)
        routed = self.experts(flat, weights, ids).reshape(shape)
        return routed + self.shared_experts(hidden_states)


def is_sparse_layer(config: Any, layer_idx: int) -> bool:
    """Layers from `first_k_dense_replace` on are MoE; the first k are dense."""
    return layer_idx >= (config.first_k_dense_replace or 0)


def deepseek_mlp(config: Any, layer_idx: int) -> nn.Module:
    if is_sparse_layer(config, layer_idx):
        return DeepseekV3MoE(config)
    return SwiGLUMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
