"""What pipeline parallelism (`distributed.pp_size > 1`) runs with in tuneyard's trainer.

The trainer (`trainer.pipeline`) splits the native decoder stack into stages and runs a
`torch.distributed.pipelining` schedule under FSDP2, optionally with tensor parallelism.
These rules refuse, at submit and at the field to change, every recipe it would refuse
or could not run: the V-shaped schedules (their stage placement is not wired) and the
zero-bubble ones (their split weight gradients are wrong with FSDP2 stages), a local
batch that does not split into whole micro-batches or into as many as the schedule needs,
and the features not proven with stages (sequence parallelism, whose sequence-sharded
activations would cross stage boundaries as DTensors; distillation;
compile; asynchronous checkpoints; packed rows; the Hugging Face model classes, which
the stage split does not know). `pipeline_config_errors` checks the model's config:
its decoder layers must split into the stages (`stage_count`, the one definition of how
many stages a schedule gets, which the trainer uses too), its lm_head must not be tied
to the embeddings (they live on the first and the last stage), the router's
load-balancing loss (`output_router_logits`) is refused (it is a function of every MoE
layer's routing at once, and each stage sees only its own layers), and experts spread
within the stages only for an architecture whose registry row declares both pipeline and
expert parallelism (`trainer.pipeline.shard_stage`: over the pp rank's data-parallel x
context-parallel ranks, the rule `trainer_support._expert_parallel_errors` states).
Whether the architecture supports PP at all is the registry's capability
(`jobs.recipe.model.config`).
"""

from __future__ import annotations

from typing import Any

from jobs.recipe.errors import FieldError, shown
from models.registry import capabilities_for, registered_architectures

SINGLE_STAGE_SCHEDULES = ("1f1b", "gpipe")
LOOPED_SCHEDULES = ("interleaved1f1b", "loopedbfs")
# Zero-bubble schedules split each backward into input and weight gradients; with FSDP2
# stages their weight gradients come out wrong here (grad norm differs from the plain run).
ZERO_BUBBLE_SCHEDULES = ("interleavedzerobubble",)
NOT_WIRED = "is not supported with pipeline parallelism by tuneyard's trainer yet"
_NATIVE_ATTENTION = (None, "sdpa", "eager")
VIRTUAL_STAGES_PER_RANK = 2  # looped schedules without layers_per_stage


def parallel_size(distributed: dict[str, Any], key: str) -> int:
    """A parallel size of the distributed section; 1 when unset or not an int."""
    value = distributed.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def pipeline_errors(recipe: dict[str, Any]) -> list[FieldError]:
    """Every reason the trainer cannot run this recipe's pipeline layout (none if pp 1)."""
    distributed = recipe.get("distributed") or {}
    pp = parallel_size(distributed, "pp_size")
    if pp == 1:
        return []
    config = distributed.get("pipeline") or {}
    errors = _schedule_errors(config, recipe.get("step_scheduler") or {}, pp)
    fix = "set distributed.pp_size: 1 or change {loc}"
    errors += [
        FieldError(loc, msg, fix.format(loc=loc)) for loc, msg in _conflicts(recipe, distributed)
    ]
    return errors


def _schedule_errors(config: dict[str, Any], step: dict[str, Any], pp: int) -> list[FieldError]:
    schedule = config.get("pp_schedule", "1f1b")
    loc = "distributed.pipeline.pp_schedule"
    if schedule not in SINGLE_STAGE_SCHEDULES + LOOPED_SCHEDULES:
        choices = ", ".join(SINGLE_STAGE_SCHEDULES + LOOPED_SCHEDULES)
        why = (
            "split weight gradients"
            if schedule in ZERO_BUBBLE_SCHEDULES
            else "V-shaped stage placement"
        )
        msg = f"schedule {shown(schedule)} ({why}) {NOT_WIRED}"
        return [FieldError(loc, msg, f"use one of {choices}")]
    size, local = int(config.get("pp_microbatch_size") or 1), step.get("local_batch_size")
    if not isinstance(local, int):
        return []
    loc = "distributed.pipeline.pp_microbatch_size"
    if local % size:
        msg = f"the local batch of {local} rows does not split into micro-batches of {size}"
        return [FieldError(loc, msg, f"set pp_microbatch_size to a divisor of {local}")]
    count = local // size
    if schedule == "1f1b" and count < pp:
        msg = f"1f1b needs at least pp_size ({pp}) micro-batches per batch; it gets {count}"
        return [FieldError(loc, msg, f"set pp_microbatch_size to at most {local // pp}")]
    rounds = max(1, count // pp)
    if schedule == "interleaved1f1b" and count % rounds:
        msg = (
            f"{schedule} needs the micro-batch count ({count}) to be a multiple of its "
            f"rounds ({rounds} = count // pp_size)"
        )
        return [
            FieldError(
                loc, msg, f"choose pp_microbatch_size so that {local} / it is a multiple of {pp}"
            )
        ]
    return []


def _conflicts(recipe: dict[str, Any], distributed: dict[str, Any]) -> list[tuple[str, str]]:
    model = recipe.get("model") or {}
    attn = model.get("attn_implementation")
    hf_class = "loads the Hugging Face class, which the pipeline stage split does not know"
    conflicts = [
        (
            "distributed.strategy",
            distributed.get("strategy") != "fsdp2",
            f"strategy {shown(distributed.get('strategy'))} {NOT_WIRED} "
            "(stages are sharded with fsdp2)",
        ),
        (
            "distributed.sequence_parallel",
            bool(distributed.get("sequence_parallel")),
            f"sequence parallelism {NOT_WIRED} (its activations would cross stages as DTensors)",
        ),
        ("recipe", recipe.get("recipe") == "llm_kd", f"distillation {NOT_WIRED}"),
        (
            "compile.enabled",
            bool((recipe.get("compile") or {}).get("enabled")),
            f"torch.compile {NOT_WIRED}",
        ),
        (
            "checkpoint.is_async",
            bool((recipe.get("checkpoint") or {}).get("is_async")),
            f"asynchronous checkpoint saves {NOT_WIRED}",
        ),
        (
            "packed_sequence.enabled",
            bool((recipe.get("packed_sequence") or {}).get("enabled")),
            f"packed sequences {NOT_WIRED}",
        ),
        ("model.force_hf", bool(model.get("force_hf")), f"force_hf {hf_class}"),
        (
            "model.attn_implementation",
            attn not in _NATIVE_ATTENTION,
            f"attn_implementation {shown(attn)} {hf_class}",
        ),
    ]
    return [(loc, msg) for loc, refused, msg in conflicts if refused]


def stage_count(
    schedule: str, pp: int, num_layers: int, config: dict[str, Any]
) -> tuple[int, int | None]:
    """(number of stages, layers per stage or None for an even split) of a schedule.

    One stage per pp rank for the single-stage schedules; for the looped ones
    `num_layers / layers_per_stage` stages (rounded to a multiple of pp_size when
    `round_virtual_stages_to_pp_multiple` says so, then split evenly), or two per rank.
    """
    per_stage = config.get("layers_per_stage")
    if schedule not in LOOPED_SCHEDULES:
        return pp, per_stage
    if not per_stage:
        return pp * VIRTUAL_STAGES_PER_RANK, None
    stages = max(1, num_layers // per_stage)
    rounding = config.get("round_virtual_stages_to_pp_multiple")
    if stages % pp and rounding:
        return (stages // pp + (1 if rounding == "up" else 0)) * pp or pp, None
    return stages, per_stage


def split_error(schedule: str, pp: int, num_layers: int, config: dict[str, Any]) -> str | None:
    """Why the model's decoder layers do not split into the schedule's stages."""
    stages, per_stage = stage_count(schedule, pp, num_layers, config)
    if stages % pp:
        return (
            f"layers_per_stage {per_stage} gives {stages} stages for {num_layers} layers, "
            f"not a multiple of pp_size {pp}"
        )
    if per_stage and per_stage * stages != num_layers:
        return f"layers_per_stage {per_stage} x {stages} stages is not the {num_layers} layers"
    if num_layers < stages:
        return f"{num_layers} decoder layers cannot fill {stages} stages"
    return None


def pipeline_config_errors(
    config: dict[str, Any] | None, distributed: dict[str, Any], architecture: str | None
) -> list[FieldError]:
    """What the model's config.json (and its `architecture`, as
    `jobs.recipe.model.config.architecture_of` reads it) rule out for the pipeline layout."""
    pp = parallel_size(distributed, "pp_size")
    if not config or pp == 1:
        return []
    errors = []
    if config.get("tie_word_embeddings"):
        errors.append(
            FieldError(
                "distributed.pp_size",
                "the model ties lm_head to the token embeddings, which live on different "
                f"pipeline stages; tied embeddings {NOT_WIRED}",
                "set distributed.pp_size: 1 or use a model with tie_word_embeddings: false",
            )
        )
    errors += _moe_stage_errors(config, distributed, architecture)
    layers, pipeline = config.get("num_hidden_layers"), distributed.get("pipeline") or {}
    schedule = pipeline.get("pp_schedule", "1f1b")
    reason = split_error(schedule, pp, layers, pipeline) if isinstance(layers, int) else None
    if reason:
        errors.append(
            FieldError(
                "distributed.pipeline.layers_per_stage",
                reason,
                "set layers_per_stage to num_hidden_layers / stages, or remove it",
            )
        )
    return errors


def _moe_stage_errors(
    config: dict[str, Any], distributed: dict[str, Any], architecture: str | None
) -> list[FieldError]:
    """The router's load-balancing loss, and experts in stages of an architecture whose row
    does not declare both pipeline and expert parallelism (capability_errors also names the
    missing one)."""
    errors = []
    if config.get("output_router_logits"):
        errors.append(
            FieldError(
                "model.output_router_logits",
                "the router's load-balancing loss is a function of every MoE layer's routing "
                f"at once, and each pipeline stage sees only its own layers; it {NOT_WIRED}",
                "set model.output_router_logits: false (it overrides config.json) or "
                "distributed.pp_size: 1",
            )
        )
    caps = capabilities_for(architecture)
    if parallel_size(distributed, "ep_size") > 1 and not (caps.supports_pp and caps.supports_ep):
        both = [
            e.architecture
            for e in registered_architectures()
            if e.capabilities.supports_pp and e.capabilities.supports_ep
        ]
        msg = (
            f"expert parallelism with pipeline parallelism runs for the architectures whose "
            f"stages are proven with experts ({', '.join(both) or 'none'}); "
            f"{shown(architecture)} is not one"
        )
        errors.append(
            FieldError(
                "distributed.ep_size", msg, "set distributed.ep_size: 1 or distributed.pp_size: 1"
            )
        )
    return errors
