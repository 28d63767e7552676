"""What tuneyard's trainer can run: every refusal it would make for a recipe, made at submit.

A job that validates must run: a recipe the trainer cannot train is refused here, at the
field to change, before it is stored, queued or given a GPU. Each rule below has a test
that names the trainer code it stands for (tests/unit/jobs/recipe/test_trainer_support.py
walks the trainer for its refusal sites and fails when one has no rule here).

`check_trainer_support` takes the normalized recipe (sections with every default filled)
and the job's accelerator.
"""

from __future__ import annotations

from fnmatch import fnmatch
from typing import Any

from jobs.recipe.errors import FieldError, shown
from jobs.recipe.plan.requirements import cuda_only_errors
from jobs.recipe.topology.pipeline import parallel_size, pipeline_errors
from models.registry import LORA_TP_PLANS, get_entry

BACKEND_OF = {"cuda": "nccl", "cpu": "gloo"}
NOT_YET = "is not supported by tuneyard's trainer yet"


def check_trainer_support(recipe: dict[str, Any], accelerator: str) -> list[FieldError]:
    distributed = recipe.get("distributed") or {}
    return [
        *_parallelism_errors(distributed),
        *_context_parallel_errors(recipe, distributed),
        *pipeline_errors(recipe),
        *_expert_parallel_errors(distributed),
        *_peft_errors(recipe.get("peft"), distributed),
        *_checkpoint_errors(recipe.get("checkpoint") or {}),
        *_quantization_errors(recipe, accelerator),
        *_backend_errors(recipe.get("dist_env") or {}, accelerator),
        *_cuda_attention_errors(recipe, accelerator),
        *cuda_only_errors(recipe, accelerator),
    ]


def _parallelism_errors(distributed: dict[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    strategy = distributed.get("strategy")
    # megatron_fsdp runs as fsdp2 (`jobs.recipe.topology.megatron_fsdp`): no other name is left
    if strategy not in (None, "fsdp2", "ddp"):
        msg = f"strategy {shown(strategy)} {NOT_YET}"
        errors.append(FieldError("distributed.strategy", msg, "use strategy: fsdp2 or ddp"))
    if strategy == "ddp" and parallel_size(distributed, "tp_size") > 1:
        msg = "DDP replicates whole models and cannot shard them for tensor parallelism"
        errors.append(FieldError("distributed.tp_size", msg, "use strategy: fsdp2 or tp_size: 1"))
    return errors


def _context_parallel_errors(
    recipe: dict[str, Any], distributed: dict[str, Any]
) -> list[FieldError]:
    """What context parallelism (`trainer.context_parallel`) does not combine with.

    It runs in the native attention layers only, and shards the student's batch under
    FSDP2: the Hugging Face classes (no native attention) and distillation (the teacher
    would see a slice) are refused, and so are torch.compile and pipeline parallelism, not
    yet proven with it (tensor parallelism, expert parallelism, LoRA and packing are)."""
    if parallel_size(distributed, "cp_size") == 1:
        return []
    fix = "set distributed.cp_size: 1 or change {loc}"
    return [
        FieldError(loc, msg, fix.format(loc=loc))
        for loc, msg in _context_parallel_conflicts(recipe, distributed)
    ]


def _context_parallel_conflicts(
    recipe: dict[str, Any], distributed: dict[str, Any]
) -> list[tuple[str, str]]:
    model = recipe.get("model") or {}
    attn = model.get("attn_implementation")
    no_cp_attention = "which has no context-parallel attention (the native attention is sdpa)"
    conflicts = [
        (
            "recipe",
            recipe.get("recipe") == "llm_kd",
            "distillation's teacher runs on whole rows; context parallelism shards the student's",
        ),
        (
            "model.force_hf",
            bool(model.get("force_hf")),
            f"force_hf loads the Hugging Face class, {no_cp_attention}",
        ),
        (
            "model.attn_implementation",
            attn not in (None, "sdpa"),
            f"attn_implementation {shown(attn)} loads the Hugging Face class, {no_cp_attention}",
        ),
        (
            "compile.enabled",
            bool((recipe.get("compile") or {}).get("enabled")),
            f"torch.compile with context parallelism {NOT_YET}",
        ),
        *[
            (
                f"distributed.{key}",
                parallel_size(distributed, key) > 1,
                f"{what} with context parallelism {NOT_YET}",
            )
            for key, what in (("pp_size", "pipeline parallelism"),)
        ],
    ]
    return [(loc, msg) for loc, refused, msg in conflicts if refused]


def _expert_parallel_errors(distributed: dict[str, Any]) -> list[FieldError]:
    """Experts are spread over groups of ep_size data-parallel ranks (with their
    context-parallel peers: a MoE layer routes tokens, whichever slice of the sequence they
    come from), and the ranks that hold the same experts shard them (FSDP2): ep_size divides
    dp_size x cp_size, with tp 1 and no replicas. Under pipeline parallelism the same rule
    holds within each stage: its experts spread over the pp rank's dp (x cp) ranks
    (`trainer.pipeline.shard_stage`), for the architectures whose registry row declares
    both (`jobs.recipe.topology.pipeline` refuses the others)."""
    ep = parallel_size(distributed, "ep_size")
    if ep == 1:
        return []
    if distributed.get("strategy") != "fsdp2":
        return [
            FieldError(
                "distributed.ep_size",
                "expert parallelism needs strategy: fsdp2",
                "set distributed.strategy: fsdp2 or ep_size: 1",
            )
        ]
    dp, tp = distributed.get("dp_size"), parallel_size(distributed, "tp_size")
    replicate = parallel_size(distributed, "dp_replicate_size")
    span = dp * parallel_size(distributed, "cp_size") if isinstance(dp, int) else None
    if tp == 1 and replicate == 1 and span is not None and span % ep == 0:
        return []
    msg = (
        f"expert parallelism spreads experts over groups of ep_size data-parallel x "
        f"context-parallel ranks: ep_size {ep} must divide dp_size x cp_size ({span}) with "
        "tp_size 1 and dp_replicate_size 1"
    )
    return [FieldError("distributed.ep_size", msg, _ep_fix(span, tp == replicate == 1))]


def _ep_fix(span: Any, one_dp_axis: bool) -> str:
    divisors = [d for d in range(2, span + 1) if span % d == 0] if isinstance(span, int) else []
    if not one_dp_axis or not divisors:
        return "set distributed.ep_size: 1"
    if len(divisors) == 1:
        return f"set distributed.ep_size: {divisors[0]} or 1"
    return f"set distributed.ep_size to a divisor of {span} ({', '.join(map(str, divisors))}) or 1"


def _peft_errors(peft: dict[str, Any] | None, distributed: dict[str, Any]) -> list[FieldError]:
    """Tensor parallelism shards each LoRA projection's base layer and its two adapter
    factors consistently (`models.common.parallelize`); a DoRA magnitude vector, which
    normalises over the whole weight, has no placement there. Expert parallelism spreads
    the experts' adapters with them (`models.common.moe.lora`)."""
    if peft is None:
        return []
    errors = []
    if parallel_size(distributed, "tp_size") > 1 and peft.get("use_dora"):
        msg = f"DoRA with tensor parallelism {NOT_YET} (its magnitude normalises the whole weight)"
        errors.append(
            FieldError(
                "distributed.tp_size", msg, "set distributed.tp_size: 1 or peft.use_dora: false"
            )
        )
    errors += _lora_sequence_parallel_errors(peft, distributed)
    return errors


def _lora_sequence_parallel_errors(
    peft: dict[str, Any], distributed: dict[str, Any]
) -> list[FieldError]:
    """Sequence parallelism shards the embedding and lm_head as plain modules, so LoRA on
    them (a target_modules entry matching either; match_all_linear leaves them out) has no
    placement (`trainer.parallelize.apply_tensor_parallel`)."""
    tp, sp = parallel_size(distributed, "tp_size"), distributed.get("sequence_parallel")
    targets = [] if peft.get("match_all_linear") else peft.get("target_modules") or []
    if isinstance(targets, str):
        targets = [targets]
    ends = [
        t
        for t in targets
        for end in ("lm_head", "embed_tokens")
        if fnmatch(end, str(t).rsplit(".", 1)[-1])
    ]
    if tp == 1 or not sp or not ends:
        return []
    msg = f"LoRA on {shown(ends[0])} cannot be sharded with sequence parallelism"
    fix = "set distributed.sequence_parallel: false or leave lm_head and embed_tokens out"
    return [FieldError("distributed.sequence_parallel", msg, fix)]


def lora_tensor_parallel_errors(
    architecture: str, distributed: dict[str, Any], peft_enabled: bool
) -> list[FieldError]:
    """LoRA under tensor parallelism runs where the family's tensor-parallel plan places
    each projection's adapters beside its sharded base layer (`models.registry.LORA_TP_PLANS`:
    the common dense plan and those of Qwen3, Gemma 2/3 and Phi-3, proven equal to a 1-process run; the trainer refuses
    the rest in
    `trainer.parallelize.apply_tensor_parallel`). A family with its own plan shards other
    modules (latent attention, soft-capped or fused projections) that the adapters would
    wrap unplaced."""
    entry = get_entry(architecture)
    if not peft_enabled or parallel_size(distributed, "tp_size") == 1 or entry is None:
        return []
    if entry.parallel_plan in LORA_TP_PLANS or not entry.capabilities.supports_tp:
        return []  # (no tensor parallelism at all is refused by the capability rule)
    msg = (
        f"LoRA with tensor parallelism {NOT_YET} for {architecture} (only the common dense "
        "plan, of Llama, Mistral and Qwen2, and the plans of Qwen3, Gemma 2, Gemma 3 and "
        "Phi-3 place the adapters beside their sharded projections)"
    )
    fix = "set distributed.tp_size: 1 or remove the peft section"
    return [FieldError("distributed.tp_size", msg, fix)]


def _checkpoint_errors(checkpoint: dict[str, Any]) -> list[FieldError]:
    errors = []
    if checkpoint.get("model_save_format", "safetensors") != "safetensors":
        msg = (
            f"model_save_format {shown(checkpoint['model_save_format'])} {NOT_YET}: "
            "checkpoints are consolidated Hugging Face safetensors (loadable by transformers "
            "and peft)"
        )
        errors.append(
            FieldError("checkpoint.model_save_format", msg, "set model_save_format: safetensors")
        )
    return errors


def _quantization_errors(recipe: dict[str, Any], accelerator: str) -> list[FieldError]:
    errors = []
    for name, what in (("fp8", "FP8 training"), ("qat", "quantization-aware training")):
        if not (recipe.get(name) or {}).get("enabled"):
            continue
        if accelerator != "cuda":
            msg = f"{what} needs a CUDA accelerator (resources.accelerator: cuda), the job has {accelerator}"
        else:
            msg = f"{what} {NOT_YET} (it needs torchao's CUDA kernels, which the trainer does not wire)"
        errors.append(FieldError(f"{name}.enabled", msg, f"set {name}.enabled: false"))
    return errors


def _backend_errors(dist_env: dict[str, Any], accelerator: str) -> list[FieldError]:
    requested, actual = dist_env.get("backend"), BACKEND_OF.get(accelerator, "gloo")
    if requested in (None, actual):
        return []
    msg = f"{requested} cannot run on {accelerator} (the trainer uses {actual} there)"
    return [FieldError("dist_env.backend", msg, f"set dist_env.backend: {actual} or remove it")]


def _cuda_attention_errors(recipe: dict[str, Any], accelerator: str) -> list[FieldError]:
    """flash_attention_2 is the flash-attn package's CUDA kernels: a CPU job cannot run it
    (on CUDA the package is a requirement the worker must meet, `plan.requires`)."""
    if accelerator == "cuda":
        return []
    return [
        FieldError(
            f"{section}.attn_implementation",
            f"flash_attention_2 runs the flash-attn package's CUDA kernels; the job's "
            f"accelerator is {accelerator}",
            f"set {section}.attn_implementation: sdpa, or run on cuda",
        )
        for section in ("model", "teacher_model")
        if isinstance(recipe.get(section), dict)
        and recipe[section].get("attn_implementation") == "flash_attention_2"
    ]
