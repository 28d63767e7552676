"""The native model registry: a torch-free table from architecture name to implementation.

Each row names the module and class that implement an architecture natively, what the
trainer can run for it (`ModelCapabilities`), how it treats tied embeddings (`TieSupport`),
and, as "module:attribute" references resolved only when used, the family's parallel plan
(`models.common.parallelize.ParallelPlan`: the common dense one unless the family folder
has its own `parallelize.py`) and its state-dict adapter (None when native names and
layouts equal Hugging Face's). The API and `tuneyard validate` read this table without
importing torch; the loader in `models.auto` imports the class only when it builds a model,
and `models.hooks` the plan and adapter only when the trainer shards or converts one.
Architectures not in the table fall back to the Hugging Face class and get
`HF_FALLBACK_CAPABILITIES` (data parallelism only).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


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
    # LoRA on the routed experts (`models.common.moe.lora`): grouped experts whose adapters
    # the family's state-dict adapter saves per expert (`lora_to_hf`)
    supports_expert_lora: bool = False


HF_FALLBACK_CAPABILITIES = ModelCapabilities()
# The rope scalings the native attention computes (`models.common.rope`); a config with another
# loads the Hugging Face class. Here, torch-free, so validation reads the same list.
NATIVE_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
DENSE_PARALLEL_PLAN = "models.common.parallelize:DENSE_PLAN"
# The plans that place a LoRA-wrapped projection's adapters beside its sharded base layer,
# each proven equal to one process under tp: the dense plan (`test_lora_tp_runs.py`) and
# the dense plan plus norms of Qwen3, Gemma 2 and Gemma 3, and Phi-3's dense plan
# (`test_family_lora_tp_runs.py`). The other family plans shard modules (latent
# attention, experts) whose adapters they do not place.
LORA_TP_PLANS = frozenset(
    {
        DENSE_PARALLEL_PLAN,
        "models.qwen3.parallelize:QWEN3_PLAN",
        "models.gemma2.parallelize:GEMMA2_PLAN",
        "models.gemma3.parallelize:GEMMA3_PLAN",
        "models.phi3.parallelize:PHI3_PLAN",
    }
)


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
    parallel_plan: str = DENSE_PARALLEL_PLAN
    state_dict_adapter: str | None = None


_DENSE_TP = ModelCapabilities(supports_tp=True, supports_sequence_parallel=True)
# Dense families whose native attention runs context parallel (models.common.context_parallel)
# and whose stage split, schedules and consolidated saves are proven under PP.
_DENSE_TP_CP = ModelCapabilities(
    supports_tp=True, supports_sequence_parallel=True, supports_cp=True, supports_pp=True
)
# Sparse MoE: FSDP2, LoRA and expert parallelism; sparse layers have no TP plan.
_MOE_EP = ModelCapabilities(supports_tp=False, supports_ep=True)
# Qwen3-MoE's native attention also runs context parallel, with experts spread over the
# dp x cp ranks (tests/integration/trainer/test_expert_parallel_layouts_run.py), and its
# stages run pipeline parallel, experts spread within each stage
# (tests/integration/trainer/test_moe_pipeline_runs.py); LoRA adapts its routed experts
# too, with or without EP (tests/integration/trainer/test_expert_lora_runs.py).
_MOE_EP_CP = ModelCapabilities(
    supports_tp=False,
    supports_ep=True,
    supports_cp=True,
    supports_pp=True,
    supports_expert_lora=True,
)
# DeepSeek-V3: latent-attention TP (+ sequence parallel), expert parallelism, LoRA (on the
# routed experts too), and pipeline stages with the experts spread within each
# (tests/integration/trainer/test_moe_pipeline_runs.py).
_DEEPSEEK_V3 = ModelCapabilities(
    supports_tp=True,
    supports_sequence_parallel=True,
    supports_ep=True,
    supports_pp=True,
    supports_expert_lora=True,
)

_REGISTRY: dict[str, ArchEntry] = {}


def registry_version() -> list[int]:
    """Changes whenever a row is added or replaced (what a cached validation checks)."""
    return [id(entry) for entry in _REGISTRY.values()]


def register(entry: ArchEntry, *, replace: bool = False) -> None:
    """Add an architecture (plugins call this). Refuses to shadow a row unless asked."""
    if entry.architecture in _REGISTRY and not replace:
        raise ValueError(f"architecture {entry.architecture!r} is already registered")
    _REGISTRY[entry.architecture] = entry


for _entry in (
    ArchEntry(
        "LlamaForCausalLM",
        "models.llama.model",
        "LlamaForCausalLM",
        _DENSE_TP_CP,
        TieSupport.BOTH,
        "llama",
        config_model_types=("llama",),
    ),
    ArchEntry(
        "Qwen2ForCausalLM",
        "models.qwen2.model",
        "Qwen2ForCausalLM",
        _DENSE_TP_CP,
        TieSupport.BOTH,
        "qwen2",
        notes="use_sliding_window layers run natively",
        config_model_types=("qwen2",),
    ),
    ArchEntry(
        "Qwen3ForCausalLM",
        "models.qwen3.model",
        "Qwen3ForCausalLM",
        _DENSE_TP_CP,
        TieSupport.BOTH,
        "qwen3",
        notes="use_sliding_window layers run natively",
        config_model_types=("qwen3",),
        parallel_plan="models.qwen3.parallelize:QWEN3_PLAN",
    ),
    ArchEntry(
        "Qwen3MoeForCausalLM",
        "models.qwen3_moe.model",
        "Qwen3MoeForCausalLM",
        _MOE_EP_CP,
        TieSupport.UNTIED_ONLY,
        "qwen3_moe",
        notes="expert parallelism spreads the experts over groups of data-parallel x "
        "context-parallel ranks (ep_size divides dp_size x cp_size, strategy fsdp2; LoRA "
        "adapters on the experts spread with them), "
        "within each stage under pipeline parallelism (no output_router_logits there); "
        "no tensor-parallel plan",
        config_model_types=("qwen3_moe",),
        parallel_plan="models.qwen3_moe.parallelize:QWEN3_MOE_PLAN",
        state_dict_adapter="models.common.moe.state_dict_adapter:GroupedExpertsStateDictAdapter",
    ),
    ArchEntry(
        "DeepseekV3ForCausalLM",
        "models.deepseek_v3.model",
        "DeepseekV3ForCausalLM",
        _DEEPSEEK_V3,
        TieSupport.UNTIED_ONLY,
        "deepseek_v3",
        notes="DeepSeek-V3 and Moonlight: latent attention, sigmoid group-limited router "
        "(fp32, correction bias frozen), shared experts; expert parallelism over "
        "all data-parallel ranks (within each stage under pipeline parallelism); "
        "tensor parallelism splits attention heads and shared experts (routed experts "
        "replicated), within each stage too; LoRA (match_all_linear also "
        "adapts the router weight and routed down_proj, as peft maps deepseek_v3; "
        "the correction bias stays frozen); FP8-quantized checkpoints load with "
        "the HF class",
        config_model_types=("deepseek_v3",),
        parallel_plan="models.deepseek_v3.parallelize:DEEPSEEK_V3_PLAN",
        state_dict_adapter="models.deepseek_v3.state_dict_adapter:DeepseekV3StateDictAdapter",
    ),
    ArchEntry(
        "Phi3ForCausalLM",
        "models.phi3.model",
        "Phi3ForCausalLM",
        _DENSE_TP,
        TieSupport.BOTH,
        "phi3",
        notes="fused qkv/gate_up split on load and fused on save; partial rotary, "
        "longrope, sliding_window and resid_pdrop native; LoRA adapters export "
        "fused (DoRA on all linears only); no TP while resid_pdrop > 0",
        config_model_types=("phi3",),
        parallel_plan="models.phi3.parallelize:PHI3_PLAN",
        state_dict_adapter="models.phi3.state_dict_adapter:Phi3StateDictAdapter",
    ),
    ArchEntry(
        "Gemma2ForCausalLM",
        "models.gemma2.model",
        "Gemma2ForCausalLM",
        _DENSE_TP,
        TieSupport.TIED_ONLY,
        "gemma2",
        notes="soft-capped attention runs eager (SDPA otherwise); bidirectional "
        "attention loads with the HF class",
        config_model_types=("gemma2",),
        parallel_plan="models.gemma2.parallelize:GEMMA2_PLAN",
    ),
    ArchEntry(
        "Gemma3ForCausalLM",
        "models.gemma3.model",
        "Gemma3ForCausalLM",
        _DENSE_TP,
        TieSupport.TIED_ONLY,
        "gemma3",
        notes="text only (Gemma3ForConditionalGeneration loads with the HF class); "
        "attn_logit_softcapping and bidirectional attention load with the HF class",
        config_model_types=("gemma3_text",),
        parallel_plan="models.gemma3.parallelize:GEMMA3_PLAN",
    ),
    ArchEntry(
        "MistralForCausalLM",
        "models.mistral.model",
        "MistralForCausalLM",
        _DENSE_TP,
        TieSupport.BOTH,
        "mistral",
        notes="sliding_window runs natively (masked SDPA)",
        config_model_types=("mistral",),
    ),
    ArchEntry(
        "GptOssForCausalLM",
        "models.gpt_oss.model",
        "GptOssForCausalLM",
        ModelCapabilities(supports_ep=True),
        TieSupport.UNTIED_ONLY,
        "gpt_oss",
        notes="attention sinks run eager; expert parallelism spreads the experts over "
        "groups of data-parallel ranks (ep_size divides dp_size, strategy fsdp2); no "
        "tensor-parallel plan; MXFP4-quantized checkpoints load with the HF class",
        config_model_types=("gpt_oss",),
        parallel_plan="models.gpt_oss.parallelize:GPT_OSS_PLAN",
        state_dict_adapter="models.gpt_oss.state_dict_adapter:GptOssStateDictAdapter",
    ),
    ArchEntry(
        "MixtralForCausalLM",
        "models.mixtral.model",
        "MixtralForCausalLM",
        _MOE_EP,
        TieSupport.BOTH,
        "mixtral",
        notes="expert parallelism as for Qwen3-MoE (ep_size divides dp_size, strategy "
        "fsdp2); no tensor-parallel plan; sliding_window runs natively",
        config_model_types=("mixtral",),
        parallel_plan="models.mixtral.parallelize:MIXTRAL_PLAN",
        state_dict_adapter="models.mixtral.state_dict_adapter:MixtralStateDictAdapter",
    ),
):
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


def resolve_reference(reference: str) -> Any:
    """The object a "package.module:attribute" reference names (raises what the import raises)."""
    module, sep, attribute = reference.partition(":")
    if not (sep and module and attribute):
        raise ValueError(f"{reference!r} is not a 'package.module:attribute' reference")
    return getattr(importlib.import_module(module), attribute)


def load_parallel_plan(entry: ArchEntry) -> Any:
    """The row's `ParallelPlan` (FSDP units, tensor- and expert-parallel plans)."""
    return resolve_reference(entry.parallel_plan)


def load_state_dict_adapter(entry: ArchEntry) -> Any | None:
    """The row's state-dict adapter class, or None when names match Hugging Face's."""
    return resolve_reference(entry.state_dict_adapter) if entry.state_dict_adapter else None


def registered_architectures() -> list[ArchEntry]:
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def capabilities_for(architecture: str | None) -> ModelCapabilities:
    """What the trainer can run for an architecture; HF fallback gets data parallel only."""
    entry = _REGISTRY.get(architecture or "")
    return entry.capabilities if entry else HF_FALLBACK_CAPABILITIES


def import_failures() -> dict[str, str]:
    """Rows whose class, parallel plan or state-dict adapter does not import, with the
    reason (reported, never dropped)."""
    failures: dict[str, str] = {}
    for name, entry in _REGISTRY.items():
        try:
            load_class(entry)
            load_parallel_plan(entry)
            load_state_dict_adapter(entry)
        except Exception as exc:  # noqa: BLE001 - any import error is reported as is
            failures[name] = f"{type(exc).__name__}: {exc}"
    return failures
