"""Trainer hooks as data: FSDP units, the tensor-parallel plan and the FLOPs formula.

The trainer never reaches into a model's code. It asks this module which modules are the
FSDP units (`decoder_layers`), which DTensor plan shards the model for tensor parallelism
(`tp_plan`, applied with `torch.distributed.tensor.parallel.parallelize_module`), whether
that plan is valid for the model (`supports_tp`), and how many FLOPs a token costs
(`model_flops_per_token`, for MFU), which modules hold grouped experts that expert
parallelism spreads over an `ep` mesh (`ep_unsupported_reason`, `apply_expert_parallel`:
modules with a `shard_experts(mesh)` method, e.g. Qwen3-MoE's `GroupedExperts`), and how native tensor names map to the Hugging Face
checkpoint layout when consolidating or restoring (`to_hf_tensors`, `from_hf_state_dict`;
identity except for the Qwen3-MoE grouped experts). The hooks work for the native classes and for the
Hugging Face Llama-style classes (Llama, Qwen2, Qwen3, Mistral), because both keep the
same module tree: `model.layers[i].self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`,
`input_layernorm`, `post_attention_layernorm`, `model.embed_tokens`, `model.norm`,
`lm_head`. Attention reshapes projections with `-1` heads, so colwise-sharded q/k/v
give each rank its local heads (tested in tests/unit/models/test_tp_plan.py).
"""

from __future__ import annotations

from typing import Any

from torch import nn

_ATTN_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def _unwrap(model: nn.Module) -> nn.Module:
    """The causal-LM module under PEFT / compile / DDP wrappers."""
    seen = 0
    while seen < 8:
        seen += 1
        if hasattr(model, "_orig_mod"):  # torch.compile
            model = model._orig_mod
        elif type(model).__name__.startswith("Peft") and hasattr(model, "base_model"):
            model = model.base_model
        elif type(model).__name__ == "LoraModel" and hasattr(model, "model"):
            model = model.model
        elif isinstance(getattr(model, "module", None), nn.Module) and not hasattr(
            model, "lm_head"
        ):
            model = model.module  # DistributedDataParallel
        else:
            break
    return model


def _layers_prefix(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The dotted name and ModuleList of the decoder layers, e.g. ("model.layers", ...)."""
    best: tuple[str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        is_layers = isinstance(module, nn.ModuleList) and name.split(".")[-1] == "layers"
        if is_layers and (best is None or len(name) < len(best[0])):
            best = (name, module)
    return best


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks: one FSDP unit (and activation-checkpoint unit) each."""
    found = _layers_prefix(model)
    if found is None:
        raise ValueError(f"{type(model).__name__} has no `layers` ModuleList to shard per layer")
    return list(found[1])


def _layer_is_llama_style(layer: nn.Module) -> bool:
    attn = getattr(layer, "self_attn", None)
    mlp = getattr(layer, "mlp", None)
    if attn is None or mlp is None:
        return False
    if not all(isinstance(getattr(attn, p, None), nn.Linear) for p in _ATTN_PROJECTIONS):
        return False
    return all(isinstance(getattr(mlp, p, None), nn.Linear) for p in _MLP_PROJECTIONS)


def _head_counts(model: nn.Module) -> tuple[int, int]:
    config = getattr(_unwrap(model), "config", None)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return heads, kv_heads


def tp_unsupported_reason(model: nn.Module, tp_size: int | None = None) -> str | None:
    """Why the plan cannot shard this model (None when it can)."""
    found = _layers_prefix(_unwrap(model))
    if found is None:
        return f"{type(model).__name__} has no decoder `layers` list"
    attn = getattr(found[1][0], "self_attn", None) if len(found[1]) else None
    if any(hasattr(getattr(attn, p, None), "base_layer") for p in _ATTN_PROJECTIONS):
        return "LoRA-wrapped projections cannot be tensor-parallel sharded; use tp_size: 1"
    if not all(_layer_is_llama_style(layer) for layer in found[1]):
        return (
            f"{type(_unwrap(model)).__name__} layers are not Llama-style "
            "(self_attn.q/k/v/o_proj + mlp.gate/up/down_proj as nn.Linear)"
        )
    heads, kv_heads = _head_counts(model)
    if tp_size and (heads % tp_size or kv_heads % tp_size):
        return (
            f"attention heads ({heads}) and key/value heads ({kv_heads}) must be divisible "
            f"by tp_size {tp_size}"
        )
    return None


def supports_tp(model: nn.Module, tp_size: int | None = None) -> bool:
    """True when `tp_plan` applies to this model (and divides its heads when tp_size given)."""
    return tp_unsupported_reason(model, tp_size) is None


def tp_plan(model: nn.Module, sequence_parallel: bool = False) -> dict[str, Any]:
    """The DTensor plan, keyed by module names relative to `model` (wildcards per layer).

    Without sequence parallelism only attention and MLP projections are sharded; the
    embeddings, norms and lm_head stay replicated (FSDP still shards them). With sequence
    parallelism activations between blocks are sharded on the sequence dimension, the
    norms run as `SequenceParallel`, the embedding is rowwise and the lm_head colwise
    (gathering logits), except for tied embeddings, which stay replicated so the alias holds.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    reason = tp_unsupported_reason(model)
    if reason:
        raise ValueError(f"tensor parallelism unavailable: {reason}")
    inner = _unwrap(model)
    prefix = _layers_prefix(inner)[0]
    root = _root_prefix(model, inner)
    layer = f"{root}{prefix}.*"
    base = root + prefix.rsplit(".", 1)[0] + "." if "." in prefix else root
    plan: dict[str, Any] = {}
    if not sequence_parallel:
        for name in ("q_proj", "k_proj", "v_proj"):
            plan[f"{layer}.self_attn.{name}"] = ColwiseParallel()
        plan[f"{layer}.self_attn.o_proj"] = RowwiseParallel()
        plan[f"{layer}.mlp.gate_proj"] = ColwiseParallel()
        plan[f"{layer}.mlp.up_proj"] = ColwiseParallel()
        plan[f"{layer}.mlp.down_proj"] = RowwiseParallel()
        return plan

    tied = _embeddings_tied(inner)
    if tied:
        plan[f"{base}embed_tokens"] = PrepareModuleOutput(
            output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=False
        )
        plan[f"{root}lm_head"] = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        )
    else:
        plan[f"{base}embed_tokens"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
        )
        plan[f"{root}lm_head"] = ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True
        )
    plan[f"{base}norm"] = SequenceParallel(use_local_output=False)
    plan[f"{layer}.input_layernorm"] = SequenceParallel(use_local_output=False)
    plan[f"{layer}.post_attention_layernorm"] = SequenceParallel(use_local_output=False)
    plan[f"{layer}.self_attn"] = PrepareModuleInput(
        input_kwarg_layouts={"hidden_states": Shard(1)},
        desired_input_kwarg_layouts={"hidden_states": Replicate()},
        use_local_output=True,
    )
    for name in ("q_proj", "k_proj", "v_proj"):
        plan[f"{layer}.self_attn.{name}"] = ColwiseParallel()
    plan[f"{layer}.self_attn.o_proj"] = RowwiseParallel(
        output_layouts=Shard(1), use_local_output=False
    )
    plan[f"{layer}.mlp"] = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
    )
    plan[f"{layer}.mlp.gate_proj"] = ColwiseParallel()
    plan[f"{layer}.mlp.up_proj"] = ColwiseParallel()
    plan[f"{layer}.mlp.down_proj"] = RowwiseParallel(
        output_layouts=Shard(1), use_local_output=False
    )
    return plan


def _root_prefix(model: nn.Module, inner: nn.Module) -> str:
    """Dotted path from `model` down to the unwrapped causal LM ('' when they are the same)."""
    if inner is model:
        return ""
    for name, module in model.named_modules():
        if module is inner:
            return name + "." if name else ""
    return ""


def _embeddings_tied(model: nn.Module) -> bool:
    head = getattr(model, "lm_head", None)
    get_embed = getattr(model, "get_input_embeddings", None)
    embed = get_embed() if callable(get_embed) else None
    return head is not None and embed is not None and head.weight is embed.weight


def _cfg(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def model_flops_per_token(config: Any, seq_len: int) -> float:
    """Training FLOPs per token: 6 * (active matmul params) + 12 * layers * heads * head_dim * seq.

    Matmul parameters are the attention and MLP projections of every layer (for MoE: the
    router plus `num_experts_per_tok` routed experts and any shared expert) and the lm_head;
    the embedding lookup is not a matmul and is left out (PaLM / torchtitan convention).
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


def _adapter(model: nn.Module) -> Any:
    return getattr(_unwrap(model), "state_dict_adapter", None)


def has_state_dict_adapter(model: nn.Module) -> bool:
    """True when the model's names or layouts differ from Hugging Face's (e.g. MoE experts)."""
    return _adapter(model) is not None


def to_hf_tensors(model: nn.Module, name: str, tensor: Any) -> list[tuple[str, Any]]:
    """The Hugging Face (name, tensor) pairs for one full (gathered) tensor of `model`.

    Consolidating a checkpoint calls this per tensor: dense families return it unchanged;
    Qwen3-MoE splits a grouped expert tensor into per-expert views (no copy).
    """
    adapter = _adapter(model)
    return adapter.convert_single_tensor_to_hf(name, tensor) if adapter else [(name, tensor)]


def from_hf_state_dict(model: nn.Module, hf_state: dict[str, Any]) -> dict[str, Any]:
    """Map a Hugging Face state dict onto `model`'s own names (stacks MoE experts)."""
    adapter = _adapter(model)
    config = getattr(_unwrap(model), "config", None)
    return adapter.from_hf(hf_state, config) if adapter else dict(hf_state)


def _grouped_experts(model: nn.Module) -> list[nn.Module]:
    return [m for m in _unwrap(model).modules() if callable(getattr(m, "shard_experts", None))]


def ep_unsupported_reason(model: nn.Module, ep_size: int) -> str | None:
    """Why expert parallelism over `ep_size` ranks cannot apply (None when it can)."""
    found = _grouped_experts(model)
    if not found:
        return f"{type(_unwrap(model)).__name__} has no grouped experts to spread over ranks"
    counts = sorted({int(m.num_experts) for m in found})
    if any(count % ep_size for count in counts):
        return f"num_experts {counts[0]} is not divisible by ep_size {ep_size}"
    return None


def apply_expert_parallel(model: nn.Module, ep_mesh: Any) -> list[nn.Parameter]:
    """Keep E/ep experts per rank of the 1-D `ep_mesh`; returns the expert parameters
    (DTensors, Shard(0)), which data parallelism must leave alone. Each local expert's
    gradient is that of the sum of all ep ranks' losses."""
    reason = ep_unsupported_reason(model, ep_mesh.size())
    if reason:
        raise ValueError(f"expert parallelism unavailable: {reason}")
    return [p for module in _grouped_experts(model) for p in module.shard_experts(ep_mesh)]
