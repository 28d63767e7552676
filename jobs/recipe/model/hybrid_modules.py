"""Every module of a hybrid (Mamba/attention) family's Hugging Face class, from its config alone.

These architectures have no native class: the trainer loads transformers' own, so their
module names are transformers'. `hybrid_modules` lists each module's full name as peft sees
it (`model.layers.3.mamba.out_proj`), whether it is an `nn.Linear` (what
`peft.match_all_linear` adapts), and why LoRA cannot train it, if it cannot. The layer mix
comes from the config fields transformers reads (`layers_block_type` or
`hybrid_override_pattern`, `attn_layer_indices`, `layer_types`, the Jamba periods). The
refusals are what peft 0.21 and transformers 5.24 do, found by wrapping each module of a
tiny model of every family and training a step; a test builds each family from the same
configs and compares its `named_modules()` with this list, so neither can drift unseen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from jobs.recipe.load.limits import MAX_MODEL_SIZES

# Why LoRA cannot train a module. peft raises at get_peft_model on the first three. It wraps
# the other three, but the model never calls the wrapped layer (the fused kernel: wherever
# the kernel is installed, as on the GPU workers), so the adapter gets no gradient.
NOT_ADAPTABLE = (
    "not a layer type peft's LoRA can wrap (a container, norm, activation, router or expert "
    "stack); peft refuses it"
)
PEFT_MAMBA = "peft refuses LoRA on a Mamba mixer's out_proj and conv1d for this model type"
DEPTHWISE_CONV = (
    "a depthwise convolution: peft refuses a Conv1d whose groups do not divide the LoRA "
    "rank, and the mixer reads conv1d.weight directly, so an adapter would never train"
)
FUSED_KERNEL = (
    "the Mamba mixer's fused training kernel takes this weight directly, so wherever the "
    "kernel runs (CUDA with the mamba-ssm kernels) the adapter is bypassed"
)
UNUSED_SLOT = (
    "an adapter slot a shared attention block keeps for another hybrid layer: this layer never "
    "calls it, so an adapter on it never trains"
)
DIRECT_WEIGHT = (
    "the Mamba mixer multiplies by dt_proj.weight directly: an adapter on it never trains"
)

# Names beyond which a config's module list is not built (a config past any real model):
# the check is skipped rather than listing millions of names.
MAX_MODULES = 50_000
MAX_LAYERS = MAX_MODEL_SIZES["num_hidden_layers"]


@dataclass(frozen=True)
class Module:
    name: str  # full name as peft sees it
    linear: bool  # an nn.Linear: what match_all_linear adapts
    refusal: str | None  # why LoRA cannot train it; None when it can

    @property
    def layer_name(self) -> str:
        """The name below its layer index (`mamba.out_proj`; "" for a layer itself), or the
        full name of a module outside the layers."""
        _, sep, rest = self.name.partition(".layers.")
        index, _, below = rest.partition(".")
        return below if sep and index.isdigit() else self.name


Entry = tuple[str, bool, str | None]  # (name below the layer, nn.Linear?, refusal)


def _linear(name: str, refusal: str | None = None) -> Entry:
    return (name, True, refusal)


def _other(*names: str) -> list[Entry]:
    return [(name, False, NOT_ADAPTABLE) for name in names]


def _attention(prefix: str) -> list[Entry]:
    return [*_other(prefix), *(_linear(f"{prefix}.{p}_proj") for p in "qkvo")]


def _gated_mlp(prefix: str) -> list[Entry]:
    projections = [_linear(f"{prefix}.{p}_proj") for p in ("gate", "up", "down")]
    return [*_other(prefix, f"{prefix}.act_fn"), *projections]


def _mamba2(prefix: str, conv: str, out_proj: str | None, act: str = "act") -> list[Entry]:
    """A Mamba-2 mixer: in_proj -> depthwise conv1d -> SSM -> gated norm -> out_proj."""
    return [
        *_other(prefix, f"{prefix}.{act}", f"{prefix}.norm"),
        (f"{prefix}.conv1d", False, conv),
        _linear(f"{prefix}.in_proj"),
        _linear(f"{prefix}.out_proj", out_proj),
    ]


def _mamba1(prefix: str, conv: str, out_proj: str | None, x_proj: str | None) -> list[Entry]:
    """A Mamba-1 mixer: in_proj -> conv1d -> x_proj (dt, B, C) -> dt_proj -> SSM -> out_proj."""
    return [
        *_other(prefix, f"{prefix}.act"),
        (f"{prefix}.conv1d", False, conv),
        _linear(f"{prefix}.in_proj"),
        _linear(f"{prefix}.x_proj", x_proj),
        _linear(f"{prefix}.dt_proj", DIRECT_WEIGHT),
        _linear(f"{prefix}.out_proj", out_proj),
    ]


# Transformers' current layer-type names for its older spellings.
_LEGACY_KINDS = {
    "mamba": "linear_attention",
    "attention": "full_attention",
    "M": "linear_attention",
    "*": "full_attention",
    "E": "moe",
    "-": "mlp",
}


def _kinds(values: Any) -> list[str]:
    """Layer kinds from a list or a pattern string (ValueError past any real model)."""
    if len(values) > MAX_LAYERS:
        raise ValueError(f"more than {MAX_LAYERS} layers")
    return [_LEGACY_KINDS.get(str(v), str(v)) for v in values]


def _count(config: dict[str, Any], default: int) -> int:
    """`num_hidden_layers`, transformers' default for the family when absent (ValueError
    when it is not a layer count)."""
    value = config.get("num_hidden_layers", default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LAYERS:
        raise ValueError(f"num_hidden_layers must be an integer in 0..{MAX_LAYERS}")
    return value


def _falcon_h1(config: dict[str, Any]) -> tuple[list[Entry], list[list[Entry]]]:
    """Every layer runs a Mamba-2 mixer and attention side by side, then a gated MLP."""
    top = [*_other("model", "model.layers", "model.final_layernorm", "model.rotary_emb")]
    layer = [
        *_other("", "input_layernorm", "pre_ff_layernorm"),
        *_mamba2("mamba", PEFT_MAMBA, PEFT_MAMBA),
        *_attention("self_attn"),
        *_gated_mlp("feed_forward"),
    ]
    return [*top, ("model.embed_tokens", False, None)], [layer] * _count(config, 32)


def _nemotron_h(config: dict[str, Any]) -> tuple[list[Entry], list[list[Entry]]]:
    """One mixer per block: Mamba-2, attention, routed experts or a plain MLP."""
    if config.get("layers_block_type") is not None:
        kinds = _kinds(config["layers_block_type"])
    elif isinstance(config.get("hybrid_override_pattern"), str):
        kinds = _kinds(config["hybrid_override_pattern"])
    else:  # transformers' default
        kinds = ["linear_attention", "moe", "full_attention", "mlp"]
    latent = config.get("moe_latent_size") is not None
    latent_proj = [_linear(f"mixer.fc{i}_latent_proj") for i in (1, 2)]
    mixers = {
        "linear_attention": _mamba2("mixer", PEFT_MAMBA, PEFT_MAMBA),
        "full_attention": [_linear(f"mixer.{p}_proj") for p in "qkvo"],
        "moe": [
            *_other("mixer.experts", "mixer.experts.act_fn", "mixer.gate"),
            *_other("mixer.shared_experts", "mixer.shared_experts.act_fn"),
            _linear("mixer.shared_experts.up_proj"),
            _linear("mixer.shared_experts.down_proj"),
            *(latent_proj if latent else _other("mixer.fc1_latent_proj", "mixer.fc2_latent_proj")),
        ],
        "mlp": [*_other("mixer.act_fn"), _linear("mixer.up_proj"), _linear("mixer.down_proj")],
    }
    layers = [[*_other("", "norm", "mixer"), *mixers.get(kind, [])] for kind in kinds]
    top = [*_other("model", "model.layers", "model.norm_f"), ("model.embeddings", False, None)]
    return top, layers


def _jamba(config: dict[str, Any]) -> tuple[list[Entry], list[list[Entry]]]:
    """Attention every `attn_layer_period` layers (else Mamba-1 with dt/B/C norms); routed
    experts every `expert_layer_period` layers (else a gated MLP)."""
    attn = (config.get("attn_layer_period", 8), config.get("attn_layer_offset", 4))
    moe = (config.get("expert_layer_period", 2), config.get("expert_layer_offset", 1))
    experts = config.get("num_experts", 16)
    mamba = [
        *_mamba1("mamba", DEPTHWISE_CONV, None, None),
        *_other("mamba.dt_layernorm", "mamba.b_layernorm", "mamba.c_layernorm"),
    ]
    routed = _other(
        "feed_forward", "feed_forward.router", "feed_forward.experts", "feed_forward.experts.act_fn"
    )
    layers = []
    for i in range(_count(config, 32)):
        mixer = _attention("self_attn") if i % attn[0] == attn[1] else mamba
        sparse = experts > 1 and i % moe[0] == moe[1]
        layers.append(
            [
                *_other("", "input_layernorm", "pre_ff_layernorm"),
                *mixer,
                *(routed if sparse else _gated_mlp("feed_forward")),
            ]
        )
    top = [*_other("model", "model.layers", "model.final_layernorm")]
    return [*top, ("model.embed_tokens", False, None)], layers


def _bamba(config: dict[str, Any]) -> tuple[list[Entry], list[list[Entry]]]:
    """Attention at `attn_layer_indices`, Mamba-2 elsewhere; a gated MLP in every layer."""
    attention = set(config.get("attn_layer_indices") or [])
    mamba = _mamba2("mamba", DEPTHWISE_CONV, FUSED_KERNEL)
    common = [*_other("", "input_layernorm", "pre_ff_layernorm"), *_gated_mlp("feed_forward")]
    layers = [
        [*common, *(_attention("self_attn") if i in attention else mamba)]
        for i in range(_count(config, 32))
    ]
    top = [*_other("model", "model.layers", "model.final_layernorm", "model.rotary_emb")]
    return [*top, ("model.embed_tokens", False, None)], layers


def _granitemoehybrid(config: dict[str, Any]) -> tuple[list[Entry], list[list[Entry]]]:
    """Mamba-2 or attention per `layer_types`; routed experts (when any) and a shared MLP."""
    kinds = _kinds(config.get("layer_types") or ["linear_attention"] * _count(config, 32))
    moe = _other(
        "block_sparse_moe",
        "block_sparse_moe.router",
        "block_sparse_moe.experts",
        "block_sparse_moe.experts.act_fn",
    )
    common = [
        *_other("", "input_layernorm", "post_attention_layernorm"),
        *(moe if (config.get("num_local_experts", 8) or 0) > 0 else []),
        *_other("shared_mlp", "shared_mlp.activation"),
        _linear("shared_mlp.input_linear"),
        _linear("shared_mlp.output_linear"),
    ]
    mamba = _mamba2("mamba", DEPTHWISE_CONV, FUSED_KERNEL)
    layers = [
        [*common, *(mamba if kind == "linear_attention" else _attention("self_attn"))]
        for kind in kinds
    ]
    rope = config.get("position_embedding_type") == "rope"
    top = [*_other("model", "model.layers", "model.norm", *(["model.rotary_emb"] * rope))]
    return [*top, ("model.embed_tokens", False, None)], layers


def _zamba2_adapters(prefix: str, hybrid: int, own: int, blocks: int) -> list[Entry]:
    """A shared block's adapter slots, one per hybrid layer: a low-rank pair where the slot
    belongs to the block (an Identity elsewhere), called only by the hybrid layer `own`."""
    entries = _other(prefix)
    for slot in range(hybrid):
        entries += _other(f"{prefix}.{slot}")
        if slot % blocks == own % blocks:
            why = None if slot == own else UNUSED_SLOT
            entries += [_linear(f"{prefix}.{slot}.{i}", why) for i in (0, 1)]
    return entries


def _zamba2_hybrid(config: dict[str, Any], hybrid: int, own: int) -> list[Entry]:
    """Hybrid layer `own` (counted among hybrid layers): a shared attention block, a
    linear, then its own Mamba-2 layer."""
    blocks = max(1, config.get("num_mem_blocks", 1) or 1)
    attn, mlp = "shared_transformer.self_attn", "shared_transformer.feed_forward"
    adapters = []
    if config.get("use_shared_attention_adapter"):
        for kind in "qkv":
            adapters += _zamba2_adapters(f"{attn}.linear_{kind}_adapter_list", hybrid, own, blocks)
    return [
        *_other("", "shared_transformer", "shared_transformer.input_layernorm"),
        *_other("shared_transformer.pre_ff_layernorm", "mamba_decoder"),
        *_other("mamba_decoder.input_layernorm", f"{mlp}.act_fn"),
        _linear("linear"),
        *_mamba2("mamba_decoder.mamba", DEPTHWISE_CONV, FUSED_KERNEL),
        *_attention(attn),
        *adapters,
        *_other(mlp),
        _linear(f"{mlp}.gate_up_proj"),
        _linear(f"{mlp}.down_proj"),
        *_zamba2_adapters(f"{mlp}.gate_up_proj_adapter_list", hybrid, own, blocks),
    ]


# Zamba2Config's default layer mix (a layer kind per layer; "hybrid" adds shared attention).
_ZAMBA2_DEFAULT = (
    ["linear_attention"]
    + (["linear_attention"] * 5 + ["hybrid"]) * 7
    + ["linear_attention"] * 4
    + ["hybrid"]
    + ["linear_attention"] * 3
    + ["hybrid"]
    + ["linear_attention"] * 2
)


def _zamba2(config: dict[str, Any]) -> tuple[list[Entry], list[list[Entry]]]:
    """Mamba-2 layers; a hybrid layer adds one of `num_mem_blocks` shared attention blocks."""
    kinds = _kinds(config.get("layers_block_type") or _ZAMBA2_DEFAULT)
    hybrid = kinds.count("hybrid")
    if 12 * hybrid * hybrid > MAX_MODULES:  # every hybrid layer holds a slot per hybrid layer
        raise ValueError(f"{hybrid} hybrid layers")
    mamba = [*_other("", "input_layernorm"), *_mamba2("mamba", DEPTHWISE_CONV, FUSED_KERNEL)]
    layers, seen = [], 0
    for kind in kinds:
        if kind == "hybrid":
            layers.append(_zamba2_hybrid(config, hybrid, seen))
            seen += 1
        else:
            layers.append(mamba)
    rope = bool(config.get("use_mem_rope"))
    top = [
        *_other("model", "model.layers", "model.final_layernorm", *(["model.rotary_emb"] * rope))
    ]
    return [*top, ("model.embed_tokens", False, None)], layers


def _pure_mamba(mixer: Callable[[], list[Entry]], layers: int) -> Callable[[dict[str, Any]], Any]:
    """Mamba, Mamba-2 and Falcon-Mamba: a norm and a mixer per layer under `backbone`
    (`layers` of them when the config does not say)."""

    def listed(config: dict[str, Any]) -> tuple[list[Entry], list[list[Entry]]]:
        top = [*_other("backbone", "backbone.layers", "backbone.norm_f")]
        layer = [*_other("", "norm"), *mixer()]
        return [*top, ("backbone.embeddings", False, None)], [layer] * _count(config, layers)

    return listed


def _mamba_mixer() -> list[Entry]:
    return _mamba1("mixer", PEFT_MAMBA, PEFT_MAMBA, FUSED_KERNEL)


def _mamba2_mixer() -> list[Entry]:
    return _mamba2("mixer", PEFT_MAMBA, PEFT_MAMBA)


def _falcon_mamba_mixer() -> list[Entry]:
    norms = ("mixer.dt_layernorm", "mixer.b_layernorm", "mixer.c_layernorm")
    return [*_mamba1("mixer", PEFT_MAMBA, PEFT_MAMBA, FUSED_KERNEL), *_other(*norms)]


@dataclass(frozen=True)
class HybridFamily:
    architecture: str  # the Hugging Face class the trainer loads for it
    layers: str  # where its layers live: `model.layers` or `backbone.layers`
    listed: Callable[[dict[str, Any]], tuple[list[Entry], list[list[Entry]]]]


# config model_type -> the family's class and module list.
HYBRID_FAMILIES: dict[str, HybridFamily] = {
    "falcon_h1": HybridFamily("FalconH1ForCausalLM", "model.layers", _falcon_h1),
    "nemotron_h": HybridFamily("NemotronHForCausalLM", "model.layers", _nemotron_h),
    "jamba": HybridFamily("JambaForCausalLM", "model.layers", _jamba),
    "bamba": HybridFamily("BambaForCausalLM", "model.layers", _bamba),
    "granitemoehybrid": HybridFamily(
        "GraniteMoeHybridForCausalLM", "model.layers", _granitemoehybrid
    ),
    "zamba2": HybridFamily("Zamba2ForCausalLM", "model.layers", _zamba2),
    "mamba": HybridFamily("MambaForCausalLM", "backbone.layers", _pure_mamba(_mamba_mixer, 32)),
    "mamba2": HybridFamily("Mamba2ForCausalLM", "backbone.layers", _pure_mamba(_mamba2_mixer, 64)),
    "falcon_mamba": HybridFamily(
        "FalconMambaForCausalLM", "backbone.layers", _pure_mamba(_falcon_mamba_mixer, 32)
    ),
}


def hybrid_family(config: dict[str, Any] | None) -> HybridFamily | None:
    """The family of a config whose first architecture (if it names one) is the family's
    Hugging Face class; None for any other config."""
    if not isinstance(config, dict):
        return None
    family = HYBRID_FAMILIES.get(str(config.get("model_type")))
    archs = config.get("architectures")
    named = archs[0] if isinstance(archs, list) and archs else None
    return family if family and named in (None, family.architecture) else None


def hybrid_modules(config: dict[str, Any] | None) -> list[Module] | None:
    """Every module of the family's model (the model itself excepted, which peft never
    matches), or None when the config is not a hybrid family's or lists too many."""
    family = hybrid_family(config)
    if family is None or config is None:
        return None
    try:
        top, layers = family.listed(config)
    except (TypeError, ValueError, ZeroDivisionError):  # a malformed config: no list, no check
        return None
    if len(top) + sum(map(len, layers)) > MAX_MODULES:
        return None
    return [
        *(Module(n, lin, why) for n, lin, why in top),
        _lm_head(),
        *_layer_modules(family, layers),
    ]


def _lm_head() -> Module:
    return Module("lm_head", True, None)


def _layer_modules(family: HybridFamily, layers: list[list[Entry]]) -> Iterator[Module]:
    for index, entries in enumerate(layers):
        base = f"{family.layers}.{index}"
        for name, linear, refusal in entries:
            yield Module(f"{base}.{name}" if name else base, linear, refusal)
