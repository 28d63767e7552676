"""`plan.estimate`: memory per rank, FLOPs and time of a job, from its recipe and topology.

The model's weights come from its config through `jobs.recipe.plan.flops` (torch-free, exact
for the native families). Memory per rank is split into params, grads, optimizer state,
activations and workspace, each divided by the topology: FSDP2 shards parameters, gradients
and optimizer state over dp_shard x cp, tensor parallelism splits them (and the activations)
by tp, pipeline stages by pp, expert parallelism the experts by ep; LoRA leaves the frozen
base without gradients or optimizer state. Activations are counted per decoder layer from
hidden, heads, intermediate size, sequence length and micro-batch, and collapse to the
layer inputs under activation checkpointing. The constants below were fitted to measured
CPU runs (`bench/bench_estimate.py`) and are stated in `basis`. Time is FLOPs per step over
a throughput: the one learned from the queue's finished jobs, else `DEFAULT_FLOPS_PER_RANK`.
Every figure is checked before it is stored: integers within `MAX_PLAN_NUMBER`, floats
finite. The recipe's numbers and the model's sizes have maxima (`jobs.recipe.load.limits`)
that keep a real job's figures far inside; past it there is no estimate, as for a config
without sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from jobs.recipe.load.limits import MAX_PLAN_NUMBER
from jobs.recipe.plan.batches import seq_length_of
from jobs.recipe.plan.flops import Weight, flops_breakdown, lora_params, model_weights
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
# Saved tensor elements per token per decoder layer, fitted on CPU runs: hidden-sized
# (norm inputs and outputs, residuals), attention-sized (q, k, v before and after RoPE, the
# attention output) and MLP-sized (gate, up, their product) tensors. LoRA keeps the same:
# the adapters need every projection's input.
ACT_HIDDEN, ACT_ATTENTION, ACT_MLP = 5.9, 2.0, 3.9
# peft's LoRA layers keep more per layer (each adapter's input and output besides the base's).
ACT_LORA_FACTOR = 1.4
# Logit bytes per (token x vocab entry): the logits in the model dtype, their fp32 copy and
# its gradient (a chunked loss keeps only the logits and their gradient).
LOGIT_FP32_BYTES, LOGIT_FP32_BYTES_CHUNKED = 8, 0
# The optimizer's foreach update holds temporaries of about 1.7x the trainable parameters.
OPTIMIZER_TEMPORARY = 1.7
# What a process adds beyond the model on CPU (the modules the run imports while it builds,
# data loading, allocator slack; a torchrun rank also its communication buffers): constants
# measured on the grid. CUDA: 5% of the total for fragmentation.
CPU_BASE_WORKSPACE, CPU_RANK_WORKSPACE = 52 << 20, 16 << 20
# A full load imports the Hugging Face model classes the shard-only path never touches.
CPU_FULL_LOAD_WORKSPACE = 116 << 20
# A CPU rank's collectives (gloo: all-gather and reduce-scatter buffers per FSDP2 unit, freed
# into per-thread heaps the process keeps) stay resident: about this many whole models.
CPU_RANK_COPIES = 1.8
CUDA_FRAGMENTATION = 0.05
# A full (not shard-only) load holds the whole model and its checkpoint's pages at once.
LOAD_COPIES = 2.0
DEFAULT_FLOPS_PER_RANK = {"cpu": 2e10, "cuda": 4e14}  # used until a queue has finished jobs
MEMORY_MARGIN = 0.10  # of the device memory, kept free of the estimate
CONFIG_ERRORS = (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError)


@dataclass(frozen=True)
class EstimateInputs:
    """Everything the memory model reads, so a fix can change one field and re-estimate."""

    params: int
    expert_params: int
    root_params: int  # embedding, lm_head and final norm (FSDP2's root unit)
    layer_params: int  # the largest decoder layer (one FSDP2 unit)
    trainable: int
    lora_rank: int | None
    param_bytes: int
    compute_bytes: int
    optimizer_states: int
    hidden: int
    attention_width: int  # q + 2 kv (or latent) elements per token
    mlp_width: int  # the intermediate elements a token passes through per layer
    layers: int
    vocab: int
    seq_length: int
    micro_batch: int
    activation_checkpointing: bool | str
    chunked_loss: bool
    strategy: str
    dp_shard: int
    tp: int
    pp: int
    cp: int
    ep: int
    accelerator: str
    world_size: int = 1
    full_load: bool = True  # every rank loads the whole model (else FSDP2's shard-only load)


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
    step, lora = recipe.get("step_scheduler") or {}, _lora_spec(recipe)
    params = sum(w.total for w in weights)
    experts = sum(w.total for w in weights if w.kind == "experts")
    rank = lora[0] if lora else None
    trainable = lora_params(weights, *lora)[0] if lora else params
    attn, mlp, layer = _widths(weights)
    param_bytes = _dtype_bytes(recipe.get("model") or {}, config)
    sizes = setup.sizes
    loss = str((recipe.get("loss_fn") or {}).get("_target_") or "")
    return EstimateInputs(
        params,
        experts,
        sum(w.total for w in weights if "." not in w.name),
        layer,
        trainable,
        rank,
        param_bytes,
        _compute_bytes(setup, accelerator, param_bytes),
        _optimizer_states(recipe.get("optimizer") or {}),
        hidden,
        attn,
        mlp,
        layers,
        vocab,
        int(seq_length_of(recipe) or 0),
        int(step.get("local_batch_size") or 1),
        setup.activation_checkpointing,
        "Chunked" in loss or "Fused" in loss,
        setup.strategy,
        setup.dp_shard_size,
        sizes.tp_size,
        sizes.pp_size,
        sizes.cp_size,
        sizes.ep_size,
        accelerator,
        setup.world_size,
        _full_load(recipe, setup),
    )


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


def _shards(x: EstimateInputs) -> tuple[int, int]:
    """(divisor of dense parameters, divisor of expert parameters) on one rank."""
    fsdp = x.dp_shard * x.cp if x.strategy in ("fsdp2", "megatron_fsdp") else 1
    dense = fsdp * x.tp * x.pp
    return dense, (x.ep * x.pp if x.ep > 1 else dense)


def _activation_bytes(x: EstimateInputs) -> int:
    tokens = x.micro_batch * math.ceil(x.seq_length / x.cp)
    width = (
        ACT_HIDDEN * x.hidden + (ACT_ATTENTION * x.attention_width + ACT_MLP * x.mlp_width) / x.tp
    )
    lora = ACT_LORA_FACTOR if x.lora_rank is not None else 1.0
    per_layer = tokens * width * x.compute_bytes * lora
    layers = math.ceil(x.layers / x.pp)
    inputs = tokens * x.hidden * x.compute_bytes  # what a checkpointed layer keeps
    if x.activation_checkpointing in (True, "full"):
        layer_total = layers * inputs + per_layer
    elif x.activation_checkpointing == "selective":  # every second layer wrapped
        kept = layers - layers // 2 - layers % 2
        layer_total = kept * per_layer + (layers - kept) * inputs + per_layer
    else:
        layer_total = layers * per_layer
    fp32 = LOGIT_FP32_BYTES_CHUNKED if x.chunked_loss else LOGIT_FP32_BYTES
    logits = tokens * x.vocab * (2 * x.compute_bytes + fp32) // x.tp
    return int(layer_total + logits)


def memory_per_rank(x: EstimateInputs) -> dict[str, int]:
    """Bytes on one rank: params, grads, optimizer, activations, workspace, total."""
    dense, expert = _shards(x)
    held = (x.params - x.expert_params) / dense + x.expert_params / expert
    trained = held if x.lora_rank is None else x.trainable / dense  # LoRA: the adapters
    params = held * x.param_bytes
    grads = trained * x.param_bytes
    if x.strategy == "ddp" and x.dp_shard * x.tp > 1:
        grads *= 2  # DDP's gradient buckets copy the gradients
    optimizer = trained * x.param_bytes * (x.optimizer_states + OPTIMIZER_TEMPORARY)
    activations = _activation_bytes(x)
    trained_total = params + grads + optimizer + activations
    workspace = _workspace(x, trained_total)
    workspace += max(0.0, _load_bytes(x, held) - trained_total)  # loading is the peak
    parts = {
        "params": params,
        "grads": grads,
        "optimizer": optimizer,
        "activations": activations,
        "workspace": workspace,
    }
    out = {key: int(value) for key, value in parts.items()}
    out["total"] = sum(out.values())
    return out


def _load_bytes(x: EstimateInputs, held: float) -> float:
    """The peak while the model loads: the weights (whole, or this rank's shard) and the
    checkpoint pages being read."""
    weights = x.params if x.full_load else held
    return LOAD_COPIES * weights * x.param_bytes


def _workspace(x: EstimateInputs, model_bytes: float) -> float:
    """FSDP2's gathered units (the root and two decoder layers, beyond the local shard)
    plus the process's own: a CPU constant, or fragmentation on CUDA."""
    dense, _ = _shards(x)
    gathered = 0.0
    if x.strategy == "fsdp2" and dense > 1:
        gathered = (x.root_params + 2 * x.layer_params) / x.tp * x.compute_bytes * (1 - 1 / dense)
    if x.accelerator == "cuda":
        return gathered + CUDA_FRAGMENTATION * (model_bytes + gathered)
    process = CPU_BASE_WORKSPACE + (CPU_FULL_LOAD_WORKSPACE if x.full_load else 0)
    if x.world_size > 1:
        process += CPU_RANK_WORKSPACE + CPU_RANK_COPIES * x.params * x.param_bytes
    return gathered + process


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
    return {
        "inputs": dict(vars(x)),  # flat scalars: asdict's deep copies not needed
        "sequence": "every micro-batch filled to the sequence length (an upper bound)",
        "activations": "per decoder layer from hidden, attention and MLP widths; logits "
        f"{'chunked' if x.chunked_loss else 'with an fp32 copy and its gradient'}",
        "workspace": "CUDA: 5% fragmentation, allocations only (no CUDA context)"
        if x.accelerator == "cuda"
        else f"CPU: {CPU_BASE_WORKSPACE >> 20} MiB process overhead ({CPU_RANK_WORKSPACE >> 20} "
        "MiB per torchrun rank), fitted on the bench grid; while loading is the peak, the "
        "load's excess",
        "throughput_flops_per_rank": rate,
        "throughput": source,
        "flops": "3 x forward matmuls (LoRA: 2 x base + 3 x adapters) + attention scores",
    }
