"""Each native family's weights, listed from its config alone (torch-free).

A `Weight` is one tensor shape with how many of it the model holds (`count`) and how many
of them one token multiplies through (`per_token`: every layer's projections; for MoE only
the `top_k` routed experts). `FAMILY_WEIGHTS` maps a registry row's `family` to the function
that lists them; the lists mirror the native classes under `models/<family>/` (a test
compares each with `sum(p.numel())` of the built model).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from jobs.recipe.errors import shown
from jobs.recipe.load.limits import MAX_MODEL_SIZES

WeightKind = Literal["linear", "experts", "embedding", "vector"]


# Other spellings of the same sizes in config.json files of non-Llama architectures.
ALIASES = {
    "hidden_size": ("n_embd", "d_model"),
    "num_hidden_layers": ("n_layer", "num_layers"),
    "num_attention_heads": ("n_head",),
    "intermediate_size": ("n_inner",),
}


def cfg(config: Any, name: str, default: Any = None) -> Any:
    """A config field from a transformers config or a plain dict (or one of its `ALIASES`);
    None counts as absent."""
    for key in (name, *ALIASES.get(name, ())):
        value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
        if value is not None:
            return value
    return default


@dataclass(frozen=True)
class Weight:
    name: str  # module path below a layer (`self_attn.q_proj`), or `embed_tokens`, `lm_head`
    shape: tuple[int, int]  # (out, in) for matmuls; (n, 1) for vectors
    count: int  # how many the model holds
    per_token: int  # how many one token multiplies through (0 for vectors and embeddings)
    kind: WeightKind = "linear"
    bias: bool = False

    @property
    def total(self) -> int:
        out, inp = self.shape
        return self.count * (out * inp + (out if self.bias else 0))

    @property
    def matmul_per_token(self) -> int:
        out, inp = self.shape
        return self.per_token * out * inp if self.kind in ("linear", "experts") else 0


def _linear(name: str, out: int, inp: int, layers: int, bias: bool = False) -> Weight:
    return Weight(name, (out, inp), layers, layers, "linear", bool(bias))


def _vector(name: str, size: int, count: int) -> Weight:
    return Weight(name, (size, 1), count, 0, "vector")


def size(config: Any, name: str, default: Any = None) -> int:
    """A positive integer size field within its `MAX_MODEL_SIZES` maximum (ValueError when
    missing, not an integer, or past any model: such a config gets no count or estimate)."""
    value = cfg(config, name, default)
    limit = MAX_MODEL_SIZES[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit:
        raise ValueError(f"config {name} must be a positive integer <= {limit}, got {shown(value)}")
    return value


class Dims:
    """The sizes every family reads: hidden, layers, heads, kv heads, head_dim, vocab."""

    def __init__(self, config: Any):
        self.hidden = size(config, "hidden_size")
        self.layers = size(config, "num_hidden_layers")
        self.heads = size(config, "num_attention_heads")
        self.kv_heads = size(config, "num_key_value_heads", self.heads)
        self.head_dim = size(config, "head_dim", max(1, self.hidden // self.heads))
        self.vocab = size(config, "vocab_size")
        self.inter = size(config, "intermediate_size", 4 * self.hidden)


def _ends(config: Any, d: Dims, tied_default: bool = False) -> list[Weight]:
    """Embedding, final norm, and the lm_head unless tied (then the embedding serves both)."""
    tied = bool(cfg(config, "tie_word_embeddings", tied_default))
    head = Weight("lm_head", (d.vocab, d.hidden), 0 if tied else 1, 1)
    return [
        Weight("embed_tokens", (d.vocab, d.hidden), 1, 0, "embedding"),
        head,
        _vector("norm", d.hidden, 1),
    ]


def _attention(d: Dims, layers: int, qkv_bias: bool, o_bias: bool, qk_norm: bool) -> list[Weight]:
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    out = [
        _linear("self_attn.q_proj", q, d.hidden, layers, qkv_bias),
        _linear("self_attn.k_proj", kv, d.hidden, layers, qkv_bias),
        _linear("self_attn.v_proj", kv, d.hidden, layers, qkv_bias),
        _linear("self_attn.o_proj", d.hidden, q, layers, o_bias),
    ]
    if qk_norm:
        out += [
            _vector("self_attn.q_norm", d.head_dim, layers),
            _vector("self_attn.k_norm", d.head_dim, layers),
        ]
    return out


def _gated_mlp(prefix: str, hidden: int, inter: int, layers: int, bias: bool = False):
    return [
        _linear(f"{prefix}.gate_proj", inter, hidden, layers, bias),
        _linear(f"{prefix}.up_proj", inter, hidden, layers, bias),
        _linear(f"{prefix}.down_proj", hidden, inter, layers, bias),
    ]


def _experts(d: Dims, inter: int, experts: int, top_k: int, layers: int) -> list[Weight]:
    """Routed experts as stacked (experts, out, in) tensors, one router per layer."""

    def stacked(name: str, out: int, inp: int) -> Weight:
        return Weight(
            f"mlp.experts.{name}", (out, inp), experts * layers, top_k * layers, "experts"
        )

    return [
        _linear("mlp.gate", experts, d.hidden, layers),
        stacked("gate_proj", inter, d.hidden),
        stacked("up_proj", inter, d.hidden),
        stacked("down_proj", d.hidden, inter),
    ]


def _norms(d: Dims, per_layer: int) -> list[Weight]:
    names = [
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    ][:per_layer]
    return [_vector(name, d.hidden, d.layers) for name in names]


def dense_weights(config: Any) -> list[Weight]:
    """Llama-style: GQA attention (biases per `attention_bias`), gated MLP (`mlp_bias`), two
    norms per layer. Llama, Mistral and Phi-3 (split q/k/v and gate/up), and the arithmetic
    for architectures without a native class."""
    d, bias = Dims(config), bool(cfg(config, "attention_bias", False))
    return [
        *_ends(config, d),
        *_attention(d, d.layers, bias, bias, False),
        *_gated_mlp("mlp", d.hidden, d.inter, d.layers, bool(cfg(config, "mlp_bias", False))),
        *_norms(d, 2),
    ]


def qwen2_weights(config: Any) -> list[Weight]:
    d = Dims(config)
    return [
        *_ends(config, d),
        *_attention(d, d.layers, True, False, False),
        *_gated_mlp("mlp", d.hidden, d.inter, d.layers),
        *_norms(d, 2),
    ]


def qwen3_weights(config: Any) -> list[Weight]:
    d, bias = Dims(config), bool(cfg(config, "attention_bias", False))
    return [
        *_ends(config, d),
        *_attention(d, d.layers, bias, bias, True),
        *_gated_mlp("mlp", d.hidden, d.inter, d.layers),
        *_norms(d, 2),
    ]


def gemma_weights(config: Any, qk_norm: bool) -> list[Weight]:
    d, bias = Dims(config), bool(cfg(config, "attention_bias", False))
    return [
        *_ends(config, d, tied_default=True),
        *_attention(d, d.layers, bias, bias, qk_norm),
        *_gated_mlp("mlp", d.hidden, d.inter, d.layers),
        *_norms(d, 4),
    ]


def qwen3_moe_weights(config: Any) -> list[Weight]:
    """Sparse layers every `decoder_sparse_step`, except `mlp_only_layers` (dense MLP)."""
    d, bias = Dims(config), bool(cfg(config, "attention_bias", False))
    experts = int(cfg(config, "num_experts", cfg(config, "num_local_experts", 0)))
    step = int(cfg(config, "decoder_sparse_step", 1))
    dense_only = set(cfg(config, "mlp_only_layers", []) or [])
    sparse = sum(
        1 for i in range(d.layers) if experts and i not in dense_only and (i + 1) % step == 0
    )
    top_k = int(cfg(config, "num_experts_per_tok", 1))
    moe_inter = int(cfg(config, "moe_intermediate_size", d.inter))
    return [
        *_ends(config, d),
        *_attention(d, d.layers, bias, bias, True),
        *_norms(d, 2),
        *_gated_mlp("mlp", d.hidden, d.inter, d.layers - sparse),
        *_experts(d, moe_inter, experts, top_k, sparse),
    ]


def mixtral_weights(config: Any) -> list[Weight]:
    d = Dims(config)
    experts, top_k = int(cfg(config, "num_local_experts")), int(cfg(config, "num_experts_per_tok"))
    return [
        *_ends(config, d),
        *_attention(d, d.layers, False, False, False),
        *_norms(d, 2),
        *_experts(d, d.inter, experts, top_k, d.layers),
    ]


def gpt_oss_weights(config: Any) -> list[Weight]:
    """Biased attention with per-head sinks; a biased router; fused gate_up experts with
    biases (the bias vectors are counted as (experts, out) tensors)."""
    d, bias = Dims(config), bool(cfg(config, "attention_bias", True))
    experts, top_k = int(cfg(config, "num_local_experts")), int(cfg(config, "num_experts_per_tok"))
    n, per = experts * d.layers, top_k * d.layers

    def stacked(name: str, out: int, inp: int) -> list[Weight]:
        return [
            Weight(f"mlp.experts.{name}", (out, inp), n, per, "experts"),
            Weight(f"mlp.experts.{name}_bias", (out, 1), n, 0, "vector"),
        ]

    return [
        *_ends(config, d),
        *_attention(d, d.layers, bias, bias, False),
        *_norms(d, 2),
        _vector("self_attn.sinks", d.heads, d.layers),
        _linear("mlp.router", experts, d.hidden, d.layers, True),
        *stacked("gate_up_proj", 2 * d.inter, d.hidden),
        *stacked("down_proj", d.hidden, d.inter),
    ]


def _latent_attention(config: Any, d: Dims) -> list[Weight]:
    """DeepSeek-V3 multi-head latent attention: low-rank q (when `q_lora_rank`) and kv."""
    nope, rope = int(cfg(config, "qk_nope_head_dim")), int(cfg(config, "qk_rope_head_dim"))
    v_dim, kv_rank = int(cfg(config, "v_head_dim")), int(cfg(config, "kv_lora_rank"))
    q_rank, bias, n = cfg(config, "q_lora_rank"), bool(cfg(config, "attention_bias")), d.layers
    q_out = d.heads * (nope + rope)
    if q_rank:
        q = [
            _linear("self_attn.q_a_proj", int(q_rank), d.hidden, n, bias),
            _vector("self_attn.q_a_layernorm", int(q_rank), n),
            _linear("self_attn.q_b_proj", q_out, int(q_rank), n),
        ]
    else:
        q = [_linear("self_attn.q_proj", q_out, d.hidden, n)]
    return [
        *q,
        _linear("self_attn.kv_a_proj_with_mqa", kv_rank + rope, d.hidden, n, bias),
        _vector("self_attn.kv_a_layernorm", kv_rank, n),
        _linear("self_attn.kv_b_proj", d.heads * (nope + v_dim), kv_rank, n),
        _linear("self_attn.o_proj", d.hidden, d.heads * v_dim, n, bias),
    ]


def deepseek_v3_weights(config: Any) -> list[Weight]:
    """The first `first_k_dense_replace` layers dense, the rest routed plus shared experts
    (the router's correction bias is a buffer, not a parameter)."""
    d = Dims(config)
    dense = min(int(cfg(config, "first_k_dense_replace", 0)), d.layers)
    sparse, moe_inter = d.layers - dense, int(cfg(config, "moe_intermediate_size"))
    experts, top_k = int(cfg(config, "n_routed_experts")), int(cfg(config, "num_experts_per_tok"))
    shared = int(cfg(config, "n_shared_experts", 0))
    return [
        *_ends(config, d),
        *_latent_attention(config, d),
        *_norms(d, 2),
        *_gated_mlp("mlp", d.hidden, d.inter, dense),
        *_experts(d, moe_inter, experts, top_k, sparse),
        *_gated_mlp("mlp.shared_experts", d.hidden, moe_inter * shared, sparse),
    ]


FAMILY_WEIGHTS: dict[str, Callable[[Any], list[Weight]]] = {
    "llama": dense_weights,
    "mistral": dense_weights,
    "phi3": dense_weights,
    "qwen2": qwen2_weights,
    "qwen3": qwen3_weights,
    "gemma2": lambda config: gemma_weights(config, qk_norm=False),
    "gemma3": lambda config: gemma_weights(config, qk_norm=True),
    "qwen3_moe": qwen3_moe_weights,
    "mixtral": mixtral_weights,
    "gpt_oss": gpt_oss_weights,
    "deepseek_v3": deepseek_v3_weights,
}
