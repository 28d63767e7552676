"""Shared decoder building blocks for the Llama-style families (Llama, Qwen2, Qwen3, Qwen3-MoE).

One attention, one SwiGLU MLP, one RMSNorm and one decoder stack, switched by config:
`attention_bias` (Qwen2's q/k/v bias), `qk_norm` (Qwen3's per-head RMSNorm on q and k), and
an MLP factory (the MoE family swaps in its sparse block). Module and parameter names are
the Hugging Face ones, so dense checkpoints load without renaming and the common dense
parallel plan (`models.common.parallelize`) shards native and Hugging Face models alike.
Attention uses `scaled_dot_product_attention` and takes its local head count from the
projection's output, so colwise-sharded q/k/v (tensor parallelism) work unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from jobs.recipe.plan.windows import layer_sliding_window
from models.common.rope import RotaryEmbedding, apply_rotary, head_dim_of

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "relu": F.relu,
}


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32, scaled by a learned weight (as Llama does)."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class SwiGLUMLP(nn.Module):
    """down(act(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int, act: str = "silu", bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.act_fn = _ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Grouped-query attention with RoPE; optional q/k/v bias and per-head q/k RMSNorm.

    `context_parallel` (set by `models.common.context_parallel.enable_context_parallel`)
    makes the layer attend over the whole sequence while holding only its rank's slice.
    """

    context_parallel: Any = None
    rotary_fn: Any = None  # a kernel for `apply_rotary` (`models.common.kernels`), if any

    def __init__(self, config: Any, qk_norm: bool = False, qkv_bias: bool | None = None):
        super().__init__()
        self.head_dim = head_dim_of(config)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        bias = bool(getattr(config, "attention_bias", False)) if qkv_bias is None else qkv_bias
        out_bias = bool(getattr(config, "attention_bias", False))
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=out_bias)
        self.scaling = self.head_dim**-0.5
        self.dropout = float(getattr(config, "attention_dropout", 0.0) or 0.0)
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def project_qkv(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as (batch, local heads, seq, head_dim): projected, q/k-normed, rotated."""
        batch, seq = hidden_states.shape[:2]
        shape = (batch, seq, -1, self.head_dim)  # -1: local heads under tensor parallelism
        q = self.q_proj(hidden_states).view(shape)
        k = self.k_proj(hidden_states).view(shape)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        rotate = self.rotary_fn or apply_rotary
        q, k = rotate(q.transpose(1, 2), k.transpose(1, 2), *position_embeddings)
        return q, k, v

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch, seq = hidden_states.shape[:2]
        q, k, v = self.project_qkv(hidden_states, position_embeddings)
        dropout = self.dropout if self.training else 0.0
        if self.context_parallel is not None:
            # a mask here comes from packed position ids, which the context-parallel
            # attention applies itself over global positions (its `documents`)
            if attention_mask is not None and self.context_parallel.documents is None:
                raise ValueError("context parallel attention takes no padding masks")
            out = self.context_parallel.attend(q, k, v, self.scaling, dropout)
            return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))
        groups = q.shape[1] // k.shape[1]
        if groups > 1 and attention_mask is not None:  # masked GQA kernels fall back to math
            k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attention_mask,
            is_causal=attention_mask is None,
            dropout_p=dropout,
            scale=self.scaling,
            enable_gqa=groups > 1 and attention_mask is None,
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    batch, heads, seq, dim = x.shape
    return x[:, :, None].expand(batch, heads, groups, seq, dim).reshape(batch, -1, seq, dim)


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(
        self,
        config: Any,
        mlp: nn.Module,
        qk_norm: bool = False,
        qkv_bias: bool | None = None,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        # Read by DecoderModel to pick this layer's mask (None: full causal attention).
        self.sliding_window = sliding_window
        self.self_attn = Attention(config, qk_norm=qk_norm, qkv_bias=qkv_bias)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

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
        hidden_states = hidden_states + attn
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


def dense_mlp(config: Any, layer_idx: int) -> nn.Module:
    return SwiGLUMLP(
        config.hidden_size,
        config.intermediate_size,
        config.hidden_act,
        bias=bool(getattr(config, "mlp_bias", False)),
    )


class DecoderModel(nn.Module):
    """Embeddings, decoder layers and the final norm: the `model.` part of the state dict."""

    def __init__(
        self,
        config: Any,
        mlp_factory: Callable[[Any, int], nn.Module] = dense_mlp,
        qk_norm: bool = False,
        qkv_bias: bool | None = None,
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(
            DecoderLayer(
                config,
                mlp_factory(config, i),
                qk_norm=qk_norm,
                qkv_bias=qkv_bias,
                sliding_window=layer_sliding_window(config, i),
            )
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids or inputs_embeds")
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        hidden = run_layers(self.layers, self.rotary_emb, hidden, attention_mask, position_ids)
        return self.norm(hidden)


def run_layers(
    layers: Any,
    rotary_emb: nn.Module,
    hidden: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
) -> torch.Tensor:
    """`hidden` through `layers`, each with its attention mask and one shared RoPE
    (position ids 0..seq-1 when not given)."""
    batch, seq = hidden.shape[:2]
    masks = layer_attention_masks(layers, attention_mask, position_ids, hidden)
    if position_ids is None:
        position_ids = torch.arange(seq, device=hidden.device).unsqueeze(0).expand(batch, -1)
    position_embeddings = rotary_emb(hidden, position_ids)
    for layer, mask in zip(layers, masks, strict=True):
        hidden = layer(hidden, position_embeddings=position_embeddings, attention_mask=mask)
    return hidden


def layer_attention_masks(
    layers: Any,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    hidden: torch.Tensor,
) -> list[torch.Tensor | None]:
    """Each layer's attention mask (by its `sliding_window`), built once per distinct window."""
    batch, seq = hidden.shape[:2]
    windows = [getattr(layer, "sliding_window", None) for layer in layers]
    built = {
        window: build_attention_mask(
            attention_mask, position_ids, batch, seq, hidden.device, sliding_window=window
        )
        for window in dict.fromkeys(windows)
    }
    return [built[window] for window in windows]


def build_attention_mask(
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    batch: int,
    seq: int,
    device: torch.device,
    sliding_window: int | None = None,
) -> torch.Tensor | None:
    """A boolean (batch, 1, q, k) mask ((1, 1, q, k) for a window alone), or None when plain
    causal attention is exact.

    Padding comes from `attention_mask` (1 = token, 0 = pad). Packed rows are detected from
    caller-given `position_ids` restarting at 0: each packed sample attends only to itself.
    With `sliding_window` w, query i sees keys i-w+1..i (w keys, itself included), which
    only changes anything when seq > w. Inspecting the inputs syncs with the host; calls
    without either and with no window in reach return None at once, so compiled training
    on unpadded batches has no graph break here.
    """
    windowed = sliding_window is not None and seq > sliding_window
    if attention_mask is None and position_ids is None and not windowed:
        return None
    packed = position_ids is not None and seq > 1 and bool((position_ids[:, 1:] == 0).any())
    if packed:
        packed = bool((position_ids[:, 0] == 0).all())
    has_padding = attention_mask is not None and not bool(attention_mask.all())
    if not packed and not has_padding and not windowed:
        return None
    causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    if windowed:
        causal = causal.triu(diagonal=1 - sliding_window)
        if not packed and not has_padding:
            return causal[None, None]  # broadcast over the batch; every row keeps its diagonal
    mask = causal[None, None].expand(batch, 1, seq, seq)
    if packed:
        document = (position_ids == 0).cumsum(dim=1)
        mask = mask & (document[:, None, :, None] == document[:, None, None, :])
    if has_padding:
        mask = mask & attention_mask.bool()[:, None, None, :]
    # A fully masked row (a pad query) would give NaN; let it attend to itself.
    return mask | torch.eye(seq, dtype=torch.bool, device=device)[None, None]
