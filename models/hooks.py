"""The trainer's one door into model code: find the family's row, call its plan or adapter.

The trainer never reaches into a model's code. `capabilities(model)` is the row's statement
of what the family supports (the one validation checked the recipe against), and
`parallel_plan(model)` looks up the registry row of the model's family (through every compile / DDP / FSDP / PEFT wrapper, by type) and
returns the family's `ParallelPlan`, which `trainer.parallelize` applies. The functions
below call that plan: the FSDP and activation-checkpoint units (`decoder_layers`), the
tensor-parallel plan and its refusals (`tp_plan`, `tp_unsupported_reason`, `supports_tp`),
and expert parallelism (`ep_unsupported_reason`, `apply_expert_parallel`). The row's
state-dict adapter maps native tensor names onto the Hugging Face checkpoint layout when
consolidating or restoring (`to_hf_tensors`, `from_hf_state_dict`; identity for families
without one); `to_hf_groups` / `to_hf_group_tensors` convert together the native tensors an
adapter fuses into one Hugging Face tensor (Phi-3's q/k/v -> `qkv_proj`), and
`lora_adapter_to_hf` maps a LoRA adapter the same way (`lora_adapter_from_hf` back, for
grouped expert adapters). A Hugging Face class of a
registered family (the fallback for configs the native class does not run) gets the
family's plan, since native classes keep the Hugging Face module tree, but no adapter,
since adapters map native names; an unregistered architecture gets the common dense plan. `model_flops_per_token` (for MFU) is re-exported
here so the trainer has one import.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from jobs.recipe.plan.flops import model_flops_per_token
from models import registry
from models.common.parallelize import DENSE_PLAN, ParallelPlan
from models.common.wrappers import unwrap_model

__all__ = [
    "apply_expert_parallel",
    "capabilities",
    "decoder_layers",
    "ep_unsupported_reason",
    "family_entry",
    "from_hf_state_dict",
    "has_state_dict_adapter",
    "lora_adapter_from_hf",
    "lora_adapter_to_hf",
    "model_flops_per_token",
    "native_entry",
    "parallel_plan",
    "supports_tp",
    "to_hf_tensors",
    "tp_plan",
    "to_hf_group_tensors",
    "to_hf_groups",
    "tp_unsupported_reason",
]


def native_entry(model: nn.Module) -> registry.ArchEntry | None:
    """The registry row whose class the unwrapped model is an instance of (nearest in its MRO)."""
    by_class: dict[type, registry.ArchEntry] = {}
    for entry in registry.registered_architectures():
        try:
            by_class[registry.load_class(entry)] = entry
        except Exception:  # noqa: BLE001 - a class that fails to import has no instances
            continue
    return next((by_class[c] for c in type(unwrap_model(model)).__mro__ if c in by_class), None)


def family_entry(model: nn.Module) -> registry.ArchEntry | None:
    """The row of the model's family: its native class's, or, for a Hugging Face class, the
    row whose `config_model_types` has the config's `model_type` (None when unregistered)."""
    entry = native_entry(model)
    if entry is not None:
        return entry
    from transformers import PreTrainedModel

    inner = unwrap_model(model)
    if not isinstance(inner, PreTrainedModel):
        return None
    return registry.entry_for_model_type(getattr(inner.config, "model_type", "") or "")


def capabilities(model: nn.Module) -> registry.ModelCapabilities:
    """What the family's row says the trainer may run (what validation read for the recipe);
    data parallelism only for an unregistered architecture."""
    entry = family_entry(model)
    return entry.capabilities if entry else registry.HF_FALLBACK_CAPABILITIES


def parallel_plan(model: nn.Module) -> ParallelPlan:
    """The family's plan; the common dense plan for an unregistered architecture."""
    entry = family_entry(model)
    return registry.load_parallel_plan(entry) if entry else DENSE_PLAN


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks: one FSDP unit (and activation-checkpoint unit) each."""
    return parallel_plan(model).fsdp_units(model)


def tp_unsupported_reason(model: nn.Module, tp_size: int | None = None) -> str | None:
    """Why the family's plan cannot shard this model (None when it can)."""
    return parallel_plan(model).tp_unsupported_reason(model, tp_size)


def supports_tp(model: nn.Module, tp_size: int | None = None) -> bool:
    """True when `tp_plan` applies to this model (and divides its heads when tp_size given)."""
    return tp_unsupported_reason(model, tp_size) is None


def tp_plan(model: nn.Module, sequence_parallel: bool = False) -> dict[str, Any]:
    """The family's DTensor plan, keyed by module names relative to `model`."""
    return parallel_plan(model).tp_plan(model, sequence_parallel)


def ep_unsupported_reason(model: nn.Module, ep_size: int) -> str | None:
    """Why expert parallelism over `ep_size` ranks cannot apply (None when it can)."""
    return parallel_plan(model).ep_unsupported_reason(model, ep_size)


def apply_expert_parallel(model: nn.Module, ep_mesh: Any) -> list[nn.Parameter]:
    """Keep E/ep experts per rank of the 1-D `ep_mesh`; returns the expert parameters
    (DTensors, Shard(0)), which the trainer shards over the ranks holding the same experts."""
    return parallel_plan(model).apply_expert_parallel(model, ep_mesh)


def _adapter(model: nn.Module) -> Any | None:
    entry = native_entry(model)
    return registry.load_state_dict_adapter(entry) if entry else None


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


def to_hf_groups(model: nn.Module, names: list[str]) -> list[tuple[str, ...]]:
    """Native tensor names in the groups that convert to Hugging Face together, in order:
    one name each, except the parts an adapter fuses into one tensor (`conversion_groups`)."""
    grouping = getattr(_adapter(model), "conversion_groups", None)
    return grouping(names) if grouping else [(name,) for name in names]


def to_hf_group_tensors(model: nn.Module, tensors: dict[str, Any]) -> list[tuple[str, Any]]:
    """The Hugging Face (name, tensor) pairs of one `to_hf_groups` group of full tensors;
    a group of several parts yields newly built fused tensors."""
    if len(tensors) == 1:
        return to_hf_tensors(model, *next(iter(tensors.items())))
    config = getattr(unwrap_model(model), "config", None)
    return list(_adapter(model).to_hf(tensors, config).items())


def lora_adapter_to_hf(
    model: nn.Module, state: dict[str, Any], peft_config: Any
) -> tuple[dict[str, Any], Any]:
    """A PEFT adapter's tensors and config in the Hugging Face class's layout: unchanged
    unless the family's adapter maps it (Phi-3 fuses q/k/v and gate/up adapters)."""
    convert = getattr(_adapter(model), "lora_to_hf", None)
    if convert is None:
        return state, peft_config
    return convert(state, peft_config, getattr(unwrap_model(model), "config", None))


def lora_adapter_from_hf(model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """A saved adapter's tensors back in the model's layout (`lora_adapter_to_hf`'s
    inverse where the family's adapter has one: grouped expert adapters)."""
    convert = getattr(_adapter(model), "lora_from_hf", None)
    if convert is None:
        return state
    return convert(state, getattr(unwrap_model(model), "config", None))


def from_hf_state_dict(model: nn.Module, hf_state: dict[str, Any]) -> dict[str, Any]:
    """Map a Hugging Face state dict onto `model`'s own names (stacks MoE experts)."""
    adapter = _adapter(model)
    config = getattr(unwrap_model(model), "config", None)
    return adapter.from_hf(hf_state, config) if adapter else dict(hf_state)
