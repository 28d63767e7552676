"""`plan.estimate`: memory per rank, FLOPs and time of a job, from its recipe and topology.

The model's weights come from its config through `jobs.recipe.plan.flops` (torch-free, exact
for the native families); `estimate_inputs` reads from the recipe and topology what the
memory model (`jobs.recipe.plan.memory_model`: the run's peak, phase by phase, split into
params, grads, optimizer state, activations and workspace) needs, and `basis` states them
with the phase that sets the peak. Time is FLOPs per step over
a throughput: the one learned from the queue's finished jobs, else `DEFAULT_FLOPS_PER_RANK`.
Every figure is checked before it is stored: integers within `MAX_PLAN_NUMBER`, floats
finite. The recipe's numbers and the model's sizes have maxima (`jobs.recipe.load.limits`)
that keep a real job's figures far inside; past it there is no estimate, as for a config
without sizes.
"""

from __future__ import annotations

import math
from typing import Any

from jobs.recipe.load.limits import MAX_PLAN_NUMBER
from jobs.recipe.plan.batches import seq_length_of
from jobs.recipe.plan.flops import Weight, flops_breakdown, lora_params, model_weights
from jobs.recipe.plan.memory_model import (
    CPU_BASE_WORKSPACE,
    CPU_RANK_WORKSPACE,
    EstimateInputs,
    memory_per_rank,
    phase_peaks,
)
from jobs.recipe.topology.setup import DistributedSetup

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Optimizer state tensors per trainable parameter, by the optimizer target's class name.
OPTIMIZER_STATES = {
    "AdamW": 2,
    "Adam": 2,
    "NAdam": 2,
    "RAdam": 2,
    "Adamax": 2,
    "Adagrad": 1,
    "RMSprop": 1,
    "Adadelta": 2,
    "SGD": 0,
    "ASGD": 1,
    "Rprop": 2,
    "LBFGS": 2,
    "Adafactor": 1,
    "SparseAdam": 2,
}
UNKNOWN_OPTIMIZER_STATES = 2
DEFAULT_FLOPS_PER_RANK = {"cpu": 2e10, "cuda": 4e14}  # used until a queue has finished jobs
MEMORY_MARGIN = 0.10  # of the device memory, kept free of the estimate
CONFIG_ERRORS = (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError)


def _dtype_bytes(model: dict[str, Any], config: dict[str, Any]) -> int:
    value = str(model.get("dtype") or model.get("torch_dtype") or "float32")
    if value.removeprefix("torch.") == "auto":
        value = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return DTYPE_BYTES.get(value.removeprefix("torch."), 4)


def _optimizer_states(optimizer: dict[str, Any]) -> int:
    name = str(optimizer.get("_target_") or "").replace(":", ".").rsplit(".", 1)[-1]
    states = OPTIMIZER_STATES.get(name, UNKNOWN_OPTIMIZER_STATES)
    if name == "SGD" and optimizer.get("momentum"):
        return 1
    if name == "RMSprop":
        return 1 + bool(optimizer.get("momentum")) + bool(optimizer.get("centered"))
    return states


def _widths(weights: list[Weight]) -> tuple[int, int, int]:
    """(attention width, MLP width per token, largest layer's parameters)."""
    layers = max((w.count for w in weights if w.name.endswith("input_layernorm")), default=1)
    attn = sum(
        w.shape[0] * w.per_token
        for w in weights
        if w.name.startswith("self_attn.") and w.kind == "linear" and not w.name.endswith("o_proj")
    )
    mlp = sum(
        w.shape[0] * w.per_token
        for w in weights
        if w.name.startswith("mlp.") and w.name.endswith(("up_proj", "gate_up_proj"))
    )
    layer = sum(w.total for w in weights if "." in w.name) // max(layers, 1)
    return attn // max(layers, 1), mlp // max(layers, 1), layer


def _compute_bytes(setup: DistributedSetup, accelerator: str, param_bytes: int) -> int:
    policy = getattr(setup.strategy_config, "mp_policy", None)
    if accelerator == "cuda" and policy is not None:
        return DTYPE_BYTES.get(policy.param_dtype, param_bytes)
    return param_bytes


def estimate_inputs(
    recipe: dict[str, Any], setup: DistributedSetup, accelerator: str, config: dict[str, Any]
) -> EstimateInputs | None:
    """What the memory model needs, or None when the config lacks the sizes."""

    try:
        weights = model_weights(config)
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        vocab = int(config["vocab_size"])
    except CONFIG_ERRORS:
        return None
    lora = _lora_spec(recipe)
    params = sum(w.total for w in weights)
    param_bytes = _dtype_bytes(recipe.get("model") or {}, config)
    attn, mlp, layer = _widths(weights)
    loss = str((recipe.get("loss_fn") or {}).get("_target_") or "")
    return EstimateInputs(
        params=params,
        expert_params=sum(w.total for w in weights if w.kind == "experts"),
        root_params=sum(w.total for w in weights if "." not in w.name),
        layer_params=layer,
        trainable=lora_params(weights, *lora)[0] if lora else params,
        lora_rank=lora[0] if lora else None,
        param_bytes=param_bytes,
        compute_bytes=_compute_bytes(setup, accelerator, param_bytes),
        optimizer_states=_optimizer_states(recipe.get("optimizer") or {}),
        hidden=hidden,
        attention_width=attn,
        mlp_width=mlp,
        layers=layers,
        vocab=vocab,
        seq_length=int(seq_length_of(recipe) or 0),
        micro_batch=int((recipe.get("step_scheduler") or {}).get("local_batch_size") or 1),
        activation_checkpointing=setup.activation_checkpointing,
        chunked_loss="Chunked" in loss or "Fused" in loss,
        strategy=setup.strategy,
        dp_shard=setup.dp_shard_size,
        tp=setup.sizes.tp_size,
        pp=setup.sizes.pp_size,
        cp=setup.sizes.cp_size,
        ep=setup.sizes.ep_size,
        accelerator=accelerator,
        world_size=setup.world_size,
        full_load=_full_load(recipe, setup),
        **_tensor_sizes(weights, layers),
        **_run_phases(recipe),
        **_quantization(recipe),
    )


def _quantization(recipe: dict[str, Any]) -> dict[str, Any]:
    """QLoRA's width and double quantization (`jobs.recipe.sections.quantization`)."""
    section = recipe.get("quantization")
    if not section:
        return {}
    return {"quant_bits": int(section["bits"]), "quant_double": bool(section["double_quant"])}


def _tensor_sizes(weights: list[Weight], layers: int) -> dict[str, int]:
    """The largest single tensor (a layer's grouped experts count as one) and the head."""
    largest = 0
    for w in weights:
        one = w.shape[0] * w.shape[1]
        largest = max(largest, w.total // max(layers, 1) if w.kind == "experts" else one)
    head = sum(w.total for w in weights if w.name == "lm_head")
    return {"largest_tensor": largest, "head_params": head}


def _run_phases(recipe: dict[str, Any]) -> dict[str, Any]:
    """What the run does beside its steps: a save inside it, a validation pass."""
    checkpoint = recipe.get("checkpoint") or {}
    validation = recipe.get("validation_dataset") is not None
    val_batch = (recipe.get("validation_dataloader") or {}).get("batch_size") or 1
    return {
        "saves": bool(checkpoint.get("enabled")),
        "async_save": bool(checkpoint.get("is_async")),
        "save_optimizer": bool(checkpoint.get("save_optimizer", True)),
        "val_micro_batch": int(val_batch) if validation else 0,
    }


def _full_load(recipe: dict[str, Any], setup: DistributedSetup) -> bool:
    """Whether each rank loads the whole checkpoint: the trainer's shard-only load needs
    FSDP2, no PEFT, no pipeline stages and a `from_pretrained` target."""
    target = str((recipe.get("model") or {}).get("_target_") or "")
    shard_only = (
        setup.strategy == "fsdp2"
        and recipe.get("peft") is None
        and setup.sizes.pp_size == 1
        and target.endswith("from_pretrained")
    )
    return not shard_only


def _lora_spec(recipe: dict[str, Any]) -> tuple[int, list[str] | None, list[str] | None] | None:
    peft = recipe.get("peft")
    if not isinstance(peft, dict):
        return None
    targets = None if peft.get("match_all_linear") else peft.get("target_modules")
    return int(peft.get("dim") or 8), targets, peft.get("exclude_modules")


def build_estimate(
    recipe: dict[str, Any],
    setup: DistributedSetup | None,
    plan: dict[str, Any],
    config: dict[str, Any] | None,
    flops_per_rank: float | None = None,
) -> dict[str, Any] | None:
    """The plan's `estimate`, or None when the topology or the model's sizes are unknown.

    `flops_per_rank` is the queue's learned throughput (FLOP/s per rank); without it the
    accelerator's `DEFAULT_FLOPS_PER_RANK` is used and `basis.throughput` says so."""
    if setup is None or not config:
        return None
    accelerator = str(plan.get("accelerator") or "cpu")
    inputs = estimate_inputs(recipe, setup, accelerator, config)
    if inputs is None or not inputs.seq_length:
        return None
    try:
        per_token = flops_breakdown(config, inputs.seq_length, lora=_lora_spec(recipe)).total
    except CONFIG_ERRORS:  # a config.json field of the wrong kind: no estimate, not a crash
        return None
    flops_per_step = per_token * int(plan.get("tokens_per_step") or 0)
    learned = flops_per_rank is not None and 0 < flops_per_rank < math.inf
    rate = flops_per_rank if learned else DEFAULT_FLOPS_PER_RANK.get(accelerator, 2e10)
    world = int(plan.get("world_size") or 1)
    step_seconds = flops_per_step / (rate * world)
    eta = step_seconds * int(plan.get("max_steps") or 0)
    estimate = {
        "memory_per_rank_bytes": memory_per_rank(inputs),
        "trainable_params": inputs.trainable,
        "flops_per_token": per_token,
        "flops_per_step": flops_per_step,
        "step_seconds": step_seconds,
        "eta_seconds": eta,
        "device_hours": eta * world / 3600,
        "basis": _basis(inputs, rate, learned),
    }
    return estimate if in_range(estimate) else None


def in_range(value: Any) -> bool:
    """Whether every number in `value` (nested dicts and lists) can be stored as it is:
    integers within +-`MAX_PLAN_NUMBER` (exact in a float64, far inside int64), floats
    finite. A figure past that is no estimate of a job that can run."""
    if isinstance(value, dict):
        return all(in_range(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(in_range(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return -MAX_PLAN_NUMBER <= value <= MAX_PLAN_NUMBER


def _basis(x: EstimateInputs, rate: float, learned: bool) -> dict[str, Any]:
    source = "learned from this queue's finished jobs" if learned else "default"
    phases = {name: int(value) for name, value in phase_peaks(x).items()}
    return {
        "inputs": dict(vars(x)),  # flat scalars: asdict's deep copies not needed
        "phases_bytes": phases,  # each phase's peak, before the process's own memory
        "peak_phase": max(phases, key=lambda name: phases[name]),
        "sequence": "every micro-batch filled to the sequence length (an upper bound)",
        "activations": "per decoder layer from hidden, attention and MLP widths; logits "
        f"{'chunked' if x.chunked_loss else 'with an fp32 copy and its gradient'}",
        "workspace": "what the peak phase holds beyond params, grads, optimizer state and "
        "activations (gathered FSDP2 units, load or save buffers, optimizer temporaries); "
        + (
            "CUDA: 5% fragmentation, allocations only (no CUDA context)"
            if x.accelerator == "cuda"
            else f"CPU: {CPU_BASE_WORKSPACE >> 20} MiB process overhead "
            f"({CPU_RANK_WORKSPACE >> 20} MiB more per torchrun rank), fitted on the bench grid "
            "with the worker's allocator setting"
        ),
        "throughput_flops_per_rank": rate,
        "throughput": source,
        "flops": "3 x forward matmuls (LoRA: 2 x base + 3 x adapters) + attention scores",
    }
