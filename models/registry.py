"""The native model registry: a torch-free table from architecture name to implementation.

Each row names the module and class that implement an architecture natively, what the
trainer can run for it (`ModelCapabilities`) and how it treats tied embeddings
(`TieSupport`). The API and `tuneyard validate` read this table without importing torch;
the loader in `models.auto` imports the class only when it builds a model.
Architectures not in the table fall back to the Hugging Face class and get
`HF_FALLBACK_CAPABILITIES` (data parallelism only).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from enum import StrEnum


class TieSupport(StrEnum):
    BOTH = "both"
    TIED_ONLY = "tied_only"
    UNTIED_ONLY = "untied_only"


@dataclass(frozen=True)
class ModelCapabilities:
    supports_tp: bool = False
    supports_pp: bool = False
    supports_cp: bool = False
    supports_ep: bool = False
    supports_sequence_parallel: bool = False
    supports_fsdp: bool = True
    supports_lora: bool = True


HF_FALLBACK_CAPABILITIES = ModelCapabilities()


@dataclass(frozen=True)
class ArchEntry:
    architecture: str
    module: str
    class_name: str
    capabilities: ModelCapabilities
    tie_support: TieSupport
    family: str
    notes: str = ""
    config_model_types: tuple[str, ...] = field(default_factory=tuple)


_DENSE_TP = ModelCapabilities(supports_tp=True, supports_sequence_parallel=True)
# Sparse MoE: FSDP2, LoRA and expert parallelism (experts spread over the dp ranks).
_MOE_NO_TP = ModelCapabilities(supports_tp=False, supports_ep=True)

_REGISTRY: dict[str, ArchEntry] = {}


def register(entry: ArchEntry, *, replace: bool = False) -> None:
    """Add an architecture (plugins call this). Refuses to shadow a row unless asked."""
    if entry.architecture in _REGISTRY and not replace:
        raise ValueError(f"architecture {entry.architecture!r} is already registered")
    _REGISTRY[entry.architecture] = entry


for _entry in (
    ArchEntry("LlamaForCausalLM", "models.llama.model", "LlamaForCausalLM", _DENSE_TP,
              TieSupport.BOTH, "llama", config_model_types=("llama",)),
    ArchEntry("Qwen2ForCausalLM", "models.qwen2.model", "Qwen2ForCausalLM", _DENSE_TP,
              TieSupport.BOTH, "qwen2", notes="sliding-window configs load with the HF class",
              config_model_types=("qwen2",)),
    ArchEntry("Qwen3ForCausalLM", "models.qwen3.model", "Qwen3ForCausalLM", _DENSE_TP,
              TieSupport.BOTH, "qwen3", notes="sliding-window configs load with the HF class",
              config_model_types=("qwen3",)),
    ArchEntry("Qwen3MoeForCausalLM", "models.qwen3_moe.model", "Qwen3MoeForCausalLM",
              _MOE_NO_TP, TieSupport.UNTIED_ONLY, "qwen3_moe",
              notes="no TP/EP plan yet (experts replicated per rank, FSDP shards them)",
              config_model_types=("qwen3_moe",)),
):  # fmt: skip
    register(_entry)


def get_entry(architecture: str) -> ArchEntry | None:
    return _REGISTRY.get(architecture)


def entry_for_model_type(model_type: str) -> ArchEntry | None:
    """The row whose config `model_type` matches (configs built without `architectures`)."""
    for entry in _REGISTRY.values():
        if model_type in entry.config_model_types:
            return entry
    return None


def load_class(entry: ArchEntry) -> type:
    """Import the row's implementation class (raises what the import raises)."""
    return getattr(importlib.import_module(entry.module), entry.class_name)


def registered_architectures() -> list[ArchEntry]:
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def capabilities_for(architecture: str | None) -> ModelCapabilities:
    """What the trainer can run for an architecture; HF fallback gets data parallel only."""
    entry = _REGISTRY.get(architecture or "")
    return entry.capabilities if entry else HF_FALLBACK_CAPABILITIES


def import_failures() -> dict[str, str]:
    """Rows whose implementation does not import, with the reason (reported, never dropped)."""
    failures: dict[str, str] = {}
    for name, entry in _REGISTRY.items():
        try:
            module = importlib.import_module(entry.module)
            getattr(module, entry.class_name)
        except Exception as exc:  # noqa: BLE001 - any import error is reported as is
            failures[name] = f"{type(exc).__name__}: {exc}"
    return failures
