"""Training FLOPs per token from a model config, the numerator of MFU.

`model_flops_per_token` reads a transformers config or the same fields as a plain dict,
and counts only the matmuls a token passes through: every layer's attention and MLP
projections (for MoE, the router and the routed experts a token actually visits), the
lm_head, and the attention scores over the sequence.
"""

from __future__ import annotations

from typing import Any


def _cfg(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def model_flops_per_token(config: Any, seq_len: int) -> float:
    """Training FLOPs per token: 6 * (active matmul params) + 12 * layers * heads * head_dim * seq.

    Matmul parameters are the attention and MLP projections of every layer (for MoE: the
    router plus `num_experts_per_tok` routed experts and any shared expert) and the lm_head;
    the embedding lookup gathers rows rather than multiplying, so it is left out. The
    attention term counts the score and value matmuls, forward and backward.
    """
    hidden = int(_cfg(config, "hidden_size"))
    layers = int(_cfg(config, "num_hidden_layers"))
    heads = int(_cfg(config, "num_attention_heads"))
    kv_heads = int(_cfg(config, "num_key_value_heads") or heads)
    head_dim = int(_cfg(config, "head_dim") or hidden // heads)
    vocab = int(_cfg(config, "vocab_size"))
    attn = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    per_layer_mlp = [_mlp_params(config, hidden, i) for i in range(layers)]
    active = layers * attn + sum(per_layer_mlp) + hidden * vocab
    return float(6 * active + 12 * layers * heads * head_dim * seq_len)


def _mlp_params(config: Any, hidden: int, layer: int) -> int:
    experts = int(_cfg(config, "num_experts") or _cfg(config, "num_local_experts") or 0)
    sparse_step = int(_cfg(config, "decoder_sparse_step") or 1)
    dense_layers = _cfg(config, "mlp_only_layers") or []
    is_moe = experts > 0 and layer not in dense_layers and (layer + 1) % sparse_step == 0
    if not is_moe:
        return 3 * hidden * int(_cfg(config, "intermediate_size"))
    top_k = int(_cfg(config, "num_experts_per_tok") or 1)
    expert_inter = int(_cfg(config, "moe_intermediate_size") or _cfg(config, "intermediate_size"))
    shared_inter = int(_cfg(config, "shared_expert_intermediate_size") or 0)
    return hidden * experts + top_k * 3 * hidden * expert_inter + 3 * hidden * shared_inter
