"""A megatron_fsdp setup runs as FSDP2: the one fold, with what it means said as warnings.

Megatron-FSDP (Megatron-Core's CUDA FSDP) and torch's FSDP2 (`fully_shard`) implement the
same ZeRO sharding: parameters, gradients and optimizer state spread over the data-parallel
(x context-parallel) ranks, gathered for a layer's forward and backward, gradients
reduce-scattered. The training math is the same; the buffers, bucketing and overlap that
make Megatron-FSDP fast on GPUs are its own. So a `megatron_fsdp` recipe is checked by its
own topology rules (no pp, no ep, no HSDP, no selective checkpointing: `rules.py`), then
`as_fsdp2` turns its setup into the FSDP2 setup the plan, the memory model and the trainer
all read, mapping each Megatron-FSDP option that has an FSDP2 equivalent:
- `zero_dp_strategy` 3 -> `reshard_after_forward: true`; 2 -> `false` (parameters kept
  gathered from forward to backward); 1 and 0 (only optimizer state, or nothing, sharded)
  -> `false`, with a warning: FSDP2 always shards gradients and optimizer state, so the job
  shards more than asked (the same math, less memory, more communication);
- `grad_reduce_in_fp32: true` -> `mp_policy` reducing in float32 and computing in the
  parameters' own dtype, as Megatron-FSDP does (false: reduce in that dtype, FSDP2's
  default here);
- `sequence_parallel` and the setup's activation checkpointing, as for fsdp2.
The options that only tune Megatron-FSDP's own machinery are accepted, and named in a
warning when they ask for something other than their default.
"""

from __future__ import annotations

from dataclasses import fields, replace

from jobs.recipe.errors import FieldError
from jobs.recipe.topology.setup import (
    LOC,
    DistributedSetup,
    FSDP2Config,
    MegatronFSDPConfig,
    MixedPrecision,
)

RUNS_AS_FSDP2 = (
    "accepted: megatron_fsdp runs as FSDP2 here (torch's fully_shard), not Megatron-Core's "
    "FSDP: the same ZeRO sharding of parameters, gradients and optimizer state over the "
    "data-parallel x context-parallel ranks, so the training math is the same; memory, speed "
    "and the checkpoint layout are FSDP2's (no Megatron-FSDP buffers, bucketing or overlap "
    "tuning), and the plan shows strategy fsdp2"
)
RUNS_AS_FSDP2_FIX = f"write {LOC}.strategy: fsdp2 to say what runs"
# Megatron-FSDP's zero_dp_strategy -> what it shards, for the warning when FSDP2 shards more
SHARDS = {0: "nothing (every rank a full replica)", 1: "only the optimizer state"}
# Options with no FSDP2 counterpart: what each tunes, all of it Megatron-FSDP's own.
NO_EFFECT = {
    "init_fsdp_with_meta_device": "initialization on the meta device",
    "preserve_fp32_weights": "an fp32 main copy of low-precision weights; FSDP2 keeps "
    "the weights in the dtype the model loads in",
    "overlap_grad_reduce": "overlap of gradient reduction",
    "overlap_param_gather": "overlap of parameter gathering",
    "average_in_collective": "averaging inside the collective",
    "disable_bucketing": "bucketing",
    "calculate_per_token_loss": "per-token loss scaling",
    "megatron_fsdp_unit_modules": "its wrap units",
    "check_for_nan_in_grad": "a gradient NaN check",
    "report_nan_in_param_grad": "a gradient NaN check",
    "keep_fp8_transpose_cache": "an FP8 transpose cache",
    "nccl_ub": "NCCL user buffers",
    "fsdp_double_buffer": "double buffering",
}
NO_EFFECT_WHY = (
    "they tune Megatron-FSDP's own buffers, communication and checks, which FSDP2 does not "
    "have (FSDP2 shards each decoder layer, overlaps its collectives itself, and the trainer "
    "normalizes the loss by the step's label tokens)"
)


def as_fsdp2(setup: DistributedSetup | None) -> tuple[DistributedSetup | None, list[FieldError]]:
    """The FSDP2 setup a megatron_fsdp setup runs as, and the warnings that say how; any
    other setup as is, without warnings."""
    if setup is None or not isinstance(setup.strategy_config, MegatronFSDPConfig):
        return setup, []
    config = setup.strategy_config
    fsdp2 = FSDP2Config(
        sequence_parallel=config.sequence_parallel,
        reshard_after_forward=config.zero_dp_strategy == 3,
        mp_policy=(
            MixedPrecision(param_dtype=None, reduce_dtype="float32", output_dtype=None)
            if config.grad_reduce_in_fp32
            else None
        ),
    )
    warnings = [FieldError(f"{LOC}.strategy", RUNS_AS_FSDP2, RUNS_AS_FSDP2_FIX)]
    warnings += _zero_dp_warnings(config.zero_dp_strategy) + _no_effect_warnings(config)
    return replace(setup, strategy_config=fsdp2), warnings


def _zero_dp_warnings(level: int) -> list[FieldError]:
    if level not in SHARDS:
        return []
    msg = (
        f"accepted as zero_dp_strategy 2: Megatron-FSDP's zero_dp_strategy {level} shards "
        f"{SHARDS[level]}; FSDP2 always shards gradients and optimizer state, so the job runs "
        "as reshard_after_forward: false (parameters gathered from forward to backward) and "
        "shards more than asked: the same training math, less memory per rank, more "
        "communication"
    )
    fix = f"set {LOC}.zero_dp_strategy: 2 or 3" + (
        f", or {LOC}.strategy: ddp for full replicas" if level == 0 else ""
    )
    return [FieldError(f"{LOC}.zero_dp_strategy", msg, fix)]


def _no_effect_warnings(config: MegatronFSDPConfig) -> list[FieldError]:
    """One warning naming every tuning option given a value other than its default."""
    given = [
        f.name
        for f in fields(MegatronFSDPConfig)
        if f.name in NO_EFFECT and getattr(config, f.name) != f.default
    ]
    if not given:
        return []
    named = ", ".join(f"{name} ({NO_EFFECT[name]})" for name in given)
    loc = f"{LOC}.{given[0]}" if len(given) == 1 else LOC
    return [FieldError(loc, f"accepted without effect here: {named}; {NO_EFFECT_WHY}")]
