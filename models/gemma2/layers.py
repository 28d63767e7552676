"""Gemma 2's decoder blocks (Gemma 3 parametrises them): what differs from the Llama stack.

Gemma's RMSNorm scales by (1 + weight) in fp32 and casts after the product; the embedding
output is multiplied by sqrt(hidden_size) rounded to the embedding dtype; the MLP is GeGLU
(tanh-approximated GELU); every block has sandwich norms (pre- and post-attention, pre- and
post-feed-forward); attention scales scores by `query_pre_attn_scalar ** -0.5`, may
soft-cap them (tanh, `attn_logit_softcapping`) and windows "sliding_attention" layers.
SDPA cannot soft-cap, so capped attention runs an explicit (eager) path with the same
fp32 softmax as transformers; uncapped attention uses SDPA. Module and parameter names are
the Hugging Face ones, and q/k/v take their local head count from the projection, so the
common dense tensor-parallel plan applies (`models.gemma2.parallelize`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.common.layers import Attention, SwiGLUMLP, layer_sliding_window

GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh",)


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), computed in fp32 and cast back (zero-initialised weight)."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(x)

    def init_weights(self, std: float) -> None:
        self.weight.zero_()


class ScaledEmbedding(nn.Embedding):
    """Token embedding times sqrt(hidden_size), the factor rounded to the weight's dtype.

    The scale lives inside the module so tensor-parallel output hooks see scaled values.
    """

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        scale = torch.tensor(self.embedding_dim**0.5, device=self.weight.device)
        return super().forward(input_ids) * scale.to(self.weight.dtype)


class GeGLUMLP(SwiGLUMLP):
    """down(gelu_tanh(gate(x)) * up(x)): the SwiGLU layout with Gemma's activation."""

    def __init__(self, config: Any) -> None:
        super().__init__(config.hidden_size, config.intermediate_size)
        self.act_fn = _gelu_tanh


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class GemmaAttention(Attention):
    """Grouped-query attention with Gemma's scaling, optional soft-cap and q/k norm."""

    def __init__(self, config: Any, layer_idx: int, qk_norm: bool = False) -> None:
        super().__init__(config)
        self.scaling = float(config.query_pre_attn_scalar) ** -0.5
        self.softcap = getattr(config, "attn_logit_softcapping", None)
        self.sliding_window = layer_sliding_window(config, layer_idx)
        if qk_norm:
            self.q_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.context_parallel is not None:  # set on every `Attention` by the CP helper
            raise ValueError("Gemma attention does not run context parallel; set cp_size: 1")
        if not self.softcap:  # the common SDPA path, with Gemma's scaling
            return super().forward(hidden_states, position_embeddings, attention_mask)
        batch, seq = hidden_states.shape[:2]
        q, k, v = self.project_qkv(hidden_states, position_embeddings)
        groups = q.shape[1] // k.shape[1]
        dropout = self.dropout if self.training else 0.0
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # eager
        out = softcapped_attention(q, k, v, attention_mask, self.scaling, self.softcap, dropout)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


def softcapped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    softcap: float,
    dropout: float = 0.0,
) -> torch.Tensor:
    """softmax(cap * tanh(q k^T * scaling / cap) masked) v, the softmax in fp32.

    `mask` is boolean (True = attend) or None for plain causal attention.
    """
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling
    scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        seq_q, seq_k = scores.shape[-2:]
        mask = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).tril(seq_k - seq_q)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    weights = F.dropout(weights, p=dropout, training=dropout > 0)
    return torch.matmul(weights, v)


class GemmaDecoderLayer(nn.Module):
    """Sandwich-norm block: x + post_attn(attn(pre(x))), then x + post_ff(mlp(pre_ff(x)))."""

    def __init__(self, config: Any, layer_idx: int, qk_norm: bool = False) -> None:
        super().__init__()
        self.self_attn = GemmaAttention(config, layer_idx, qk_norm=qk_norm)
        self.sliding_window = self.self_attn.sliding_window
        self.layer_type = config.layer_types[layer_idx]
        self.mlp = GeGLUMLP(config)
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        attn = self.self_attn(
            hidden_states=self.input_layernorm(hidden_states),
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
        )
        hidden_states = hidden_states + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(hidden_states))
        return hidden_states + self.post_feedforward_layernorm(mlp)
