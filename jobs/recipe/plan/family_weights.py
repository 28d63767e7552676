"""Each native family's weights, listed from its config alone (torch-free).

A `Weight` is one tensor shape with how many of it the model holds (`count`) and how many
of them one token multiplies through (`per_token`: every layer's projections; for MoE only
the `top_k` routed experts). `FAMILY_WEIGHTS` maps a registry row's `family` to the function
that lists them; the lists mirror the native classes under `models/<family>/` (a test
compares each with `sum(p.numel())` of the built model). Attention and the dense MLP are
listed per layer (`layer_dims`), so a config whose layers differ (per-layer `head_dim`,
heads, kv heads or MLP width; Gemma-3n/4 layers that reuse another layer's keys and values)
is counted layer by layer; the architectures without a native class are counted this way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from jobs.recipe.errors import shown
from jobs.recipe.load.limits import MAX_MODEL_SIZES
from jobs.recipe.plan.config_fields import cfg, layer_overrides
from jobs.recipe.plan.windows import layer_type

WeightKind = Literal["linear", "experts", "embedding", "vector"]


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
    """The sizes every family reads: hidden, layers, heads, kv heads, head_dim, vocab, MLP
    width (the first layer's where layers differ), and each layer's own (`per_layer`)."""

    def __init__(self, config: Any, vocab: bool = True):
        self.hidden = size(config, "hidden_size")
        self.layers = size(config, "num_hidden_layers")
        self.heads = size(config, "num_attention_heads")
        self.kv_heads = size(config, "num_key_value_heads", self.heads)
        self.head_dim = size(config, "head_dim", max(1, self.hidden // self.heads))
        self.vocab = size(config, "vocab_size") if vocab else 0
        widths = _intermediate_sizes(config, self.layers, 4 * self.hidden)
        self.inter = widths[0]
        self.per_layer = _layer_dims(config, self, widths)


@dataclass(frozen=True)
class LayerDims:
    """One layer's attention and dense-MLP sizes."""

    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    keys: bool = True  # its own k_proj: a layer reusing another's keys and values has none
    values: bool = True  # its own v_proj: Gemma-4's full-attention layers may reuse k as v


def layer_dims(config: Any) -> list[LayerDims]:
    """Each layer's sizes (the vocabulary not needed)."""
    return Dims(config, vocab=False).per_layer


def _intermediate_sizes(config: Any, layers: int, default: int) -> list[int]:
    """The MLP width of every layer: one for all, or Gemma-3n's list of one per layer."""
    widths = cfg(config, "intermediate_size", default)
    if not isinstance(widths, list):
        return [size(config, "intermediate_size", default)] * layers
    if len(widths) != layers:
        raise ValueError(f"config intermediate_size lists {len(widths)} widths for {layers} layers")
    return [size({"intermediate_size": w}, "intermediate_size") for w in widths]


def _layer_dims(config: Any, d: Dims, widths: list[int]) -> list[LayerDims]:
    """Per layer: its own sizes where `per_layer_config` (or Gemma-4's global head) sets
    them, else the config's; the last `num_kv_shared_layers` reuse an earlier layer's keys
    and values (no k/v projections; Gemma-4 doubles their MLP with `use_double_wide_mlp`)."""
    overrides = _gemma4_overrides(config, d.layers) or layer_overrides(config)
    shared = d.layers - _count(config, "num_kv_shared_layers", d.layers)
    k_as_v = bool(cfg(config, "attention_k_eq_v", False))
    wide = 2 if cfg(config, "use_double_wide_mlp", False) else 1
    dims = []
    for i in range(d.layers):
        own, reuses = overrides.get(i, {}), i >= shared
        full = k_as_v and layer_type(config, i) != "sliding_attention"
        dims.append(
            LayerDims(
                _layer_size(own, "num_attention_heads", d.heads),
                _layer_size(own, "num_key_value_heads", d.kv_heads),
                _layer_size(own, "head_dim", d.head_dim),
                _layer_size(own, "intermediate_size", widths[i]) * (wide if reuses else 1),
                keys=not reuses,
                values=not reuses and not full,
            )
        )
    return dims


def _layer_size(own: dict[str, Any], name: str, default: int) -> int:
    """A layer's own size `name` (within its maximum), else the config's."""
    return size(own, name, default) if own.get(name) is not None else default


def _count(config: Any, name: str, most: int) -> int:
    """A count field in 0..`most` (0 when absent)."""
    value = cfg(config, name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise ValueError(f"config {name} must be an integer in 0..{most}, got {shown(value)}")
    return value


# Gemma-4 text configs as config.json holds them: no `per_layer_config`, the full-attention
# layers' head size in `global_head_dim` (transformers' default 512) and, with
# `attention_k_eq_v`, their kv heads in `num_global_key_value_heads`; transformers' config
# turns these into per-layer overrides when it is built.
_GEMMA4 = frozenset({"gemma4", "gemma4_text"})


def _gemma4_overrides(config: Any, layers: int) -> dict[int, dict[str, Any]]:
    if not isinstance(config, dict) or "per_layer_config" in config:
        return {}
    if cfg(config, "model_type") not in _GEMMA4:
        return {}
    full: dict[str, Any] = {"head_dim": cfg(config, "global_head_dim", 512)}
    if cfg(config, "attention_k_eq_v", False) and cfg(config, "num_global_key_value_heads"):
        full["num_key_value_heads"] = cfg(config, "num_global_key_value_heads")
    return {i: full for i in range(layers) if layer_type(config, i) == "full_attention"}


def _ends(config: Any, d: Dims, tied_default: bool = False) -> list[Weight]:
    """Embedding, final norm, and the lm_head unless tied (then the embedding serves both)."""
    tied = bool(cfg(config, "tie_word_embeddings", tied_default))
    head = Weight("lm_head", (d.vocab, d.hidden), 0 if tied else 1, 1)
    return [
        Weight("embed_tokens", (d.vocab, d.hidden), 1, 0, "embedding"),
        head,
        _vector("norm", d.hidden, 1),
    ]


def _attention(d: Dims, qkv_bias: bool, o_bias: bool, qk_norm: bool) -> list[Weight]:
    """q/k/v/o (and per-head q/k norms) for each group of layers of the same sizes."""
    groups = Counter((x.heads, x.kv_heads, x.head_dim, x.keys, x.values) for x in d.per_layer)
    out = []
    for (heads, kv_heads, head_dim, keys, values), layers in groups.items():
        q, kv = heads * head_dim, kv_heads * head_dim
        out.append(_linear("self_attn.q_proj", q, d.hidden, layers, qkv_bias))
        out += [_linear("self_attn.k_proj", kv, d.hidden, layers, qkv_bias)] if keys else []
        out += [_linear("self_attn.v_proj", kv, d.hidden, layers, qkv_bias)] if values else []
        out.append(_linear("self_attn.o_proj", d.hidden, q, layers, o_bias))
        if qk_norm:
            out.append(_vector("self_attn.q_norm", head_dim, layers))
            out += [_vector("self_attn.k_norm", head_dim, layers)] if keys else []
    return out


def _dense_mlps(d: Dims, bias: bool = False) -> list[Weight]:
    """The gated MLP of every layer, one group per MLP width."""
    widths = Counter(x.inter for x in d.per_layer)
    return [w for inter, n in widths.items() for w in _gated_mlp("mlp", d.hidden, inter, n, bias)]


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
        *_attention(d, bias, bias, False),
        *_dense_mlps(d, bool(cfg(config, "mlp_bias", False))),
        *_norms(d, 2),
    ]


def qwen2_weights(config: Any) -> list[Weight]:
    d = Dims(config)
    return [
        *_ends(config, d),
        *_attention(d, True, False, False),
        *_dense_mlps(d),
        *_norms(d, 2),
    ]


def qwen3_weights(config: Any) -> list[Weight]:
    d, bias = Dims(config), bool(cfg(config, "attention_bias", False))
    return [
        *_ends(config, d),
        *_attention(d, bias, bias, True),
        *_dense_mlps(d),
        *_norms(d, 2),
    ]


def gemma_weights(config: Any, qk_norm: bool) -> list[Weight]:
    d, bias = Dims(config), bool(cfg(config, "attention_bias", False))
    return [
        *_ends(config, d, tied_default=True),
        *_attention(d, bias, bias, qk_norm),
        *_dense_mlps(d),
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
        *_attention(d, bias, bias, True),
        *_norms(d, 2),
        *_gated_mlp("mlp", d.hidden, d.inter, d.layers - sparse),
        *_experts(d, moe_inter, experts, top_k, sparse),
    ]


def mixtral_weights(config: Any) -> list[Weight]:
    d = Dims(config)
    experts, top_k = int(cfg(config, "num_local_experts")), int(cfg(config, "num_experts_per_tok"))
    return [
        *_ends(config, d),
        *_attention(d, False, False, False),
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
        *_attention(d, bias, bias, False),
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
