"""Memory per rank over a whole run, phase by phase, as the trainer runs it.

A run's peak is the largest of its phases, each what one rank holds at that moment:
- load: shard-only (FSDP2, no PEFT, a `from_pretrained`): this rank's shards plus one whole
  checkpoint tensor being read and its piece; a full load: the whole model on every rank,
  and one tensor's shard beside it while FSDP2 replaces each;
- a training step's backward: parameters, gradients and optimizer state (from the second
  step on), the saved activations (collapsed to the layer inputs under activation
  checkpointing; peft's LoRA layers keep more), the logits with their fp32 copy and
  gradient, and FSDP2's gathered units (the head, kept gathered from forward to backward,
  and a decoder layer, each with its unsharded gradient; under LoRA the frozen base has
  none, so only the parameters are gathered);
- the optimizer step: its temporaries beside parameters, gradients and state (CUDA's
  foreach update: a share of every trainable shard; CPU's one tensor at a time: copies of
  the largest trainable tensor);
- the validation pass (no gradients: one layer's activations and the logits);
- the checkpoint save: gradients are gone; rank 0 gathers one whole tensor at a time
  (consolidation), and an asynchronous save also keeps a CPU copy of the whole model on
  rank 0 and of its optimizer shard on every rank (host memory: CPU only).
QLoRA keeps the decoder layers' linear weights quantized, whole on every rank.
Tensor parallelism splits parameters and activations by tp, pipeline stages by pp, context
parallelism the sequence by cp, expert parallelism the experts by ep; FSDP2 shards over
dp_shard x cp. CPU adds the process's own memory (fitted constants); CUDA counts
allocations only (`max_memory_allocated`) plus a fragmentation share. The CPU constants
were fitted on `bench/bench_estimate.py`'s FIT grid, under the worker's allocator setting
(`worker.launcher.CPU_ALLOCATOR_ENV`); the LoRA gathered units and the CPU optimizer
temporaries were then derived from what the trainer allocates (FIT, HELD_OUT and HELD_OUT_2
all fit data since) and checked once on HELD_OUT_3 (median error 6.5%, worst 26.9%: LoRA
runs on CPU vary by about +-60 MiB beyond these terms). That LoRA residual is glibc's heap
arena (`_lora_arena_bytes`): tensors below the worker's MALLOC_MMAP_THRESHOLD_ come from it
and their freed space stays resident (mallinfo2 after the first step: 47-134 MiB free in
the arena; malloc_trim returns it; a 64 KiB threshold removes it); peft's LoRA linear makes
four output-sized tensors where a plain linear makes one. The count (4, counted, not
fitted) was checked on FIT, HELD_OUT, HELD_OUT_2 and HELD_OUT_3 re-measured (all fit data
now; their 17 LoRA runs: median 9.9% -> 5.0%, worst 23.1% -> 17.4%; it overshoots where
every output is below the threshold, hidden 192: +16%) and estimated once on HELD_OUT_4,
written and measured before (median 2.6% -> 3.2%, worst 18.2% -> 10.9%). The CUDA terms
are not fitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Saved tensor elements per token per decoder layer: hidden-sized (norm inputs and
# outputs, residuals), attention-sized (q, k, v before and after RoPE, the attention
# output) and MLP-sized (gate, up, their product) tensors.
ACT_HIDDEN, ACT_ATTENTION, ACT_MLP = 5.6, 1.9, 3.7
# Under LoRA: the adapters' inputs and outputs are kept, the frozen base's weight gradients
# need nothing; fitted, a little less than a full fine-tune keeps.
ACT_LORA_FACTOR = 0.92
# Logit bytes per (token x vocab entry) beside the logits in the compute dtype: their fp32
# copy and its gradient (a chunked loss keeps neither).
LOGIT_FP32_BYTES, LOGIT_FP32_BYTES_CHUNKED = 8, 0
# The optimizer's update: on CUDA torch's foreach path holds temporaries of about this many
# trainable shards; on CPU (no foreach) it updates one tensor at a time, holding about this
# many copies of the largest trainable tensor (`torch.optim.AdamW` measured: 2.25-3x).
OPTIMIZER_TEMPORARY, OPTIMIZER_TEMPORARY_LARGEST = 1.43, 3.0
# FSDP2's gathered units in a backward, in units of (head + one decoder layer): their
# parameters, and (when the unit trains) their unsharded gradients. Under LoRA the frozen
# base has no gradient: only the parameters are gathered.
FSDP_GATHERED_PARAMS, FSDP_GATHERED_GRADS = 1.0, 1.0
# A consolidated save's gather of one tensor on rank 0: the gathered pieces and the whole.
SAVE_GATHER_COPIES = 2.0
# A full (not shard-only) load: the whole model on every rank.
LOAD_COPIES = 1.0
# What a CPU process adds beyond the model (modules the run imports while it builds, data
# loading, allocator slack); a torchrun rank also its collectives' buffers; a full load
# imports the Hugging Face model classes the shard-only path never touches.
CPU_BASE_WORKSPACE, CPU_RANK_WORKSPACE = 43 << 20, 11 << 20
CPU_FULL_LOAD_WORKSPACE = 115 << 20
CUDA_FRAGMENTATION = 0.05
# CPU: a tensor below glibc's mmap threshold (the worker sets MALLOC_MMAP_THRESHOLD_ to 1 MiB,
# `worker.launcher.CPU_ALLOCATOR_ENV`) comes from the heap arena, which keeps its freed space
# resident; a larger one is mmapped and returned when freed.
CPU_MMAP_THRESHOLD = 1 << 20
# peft's LoRA linear computes `base(x) + lora_B(lora_A(x)) * scaling`: four output-sized
# tensors (the base output, the adapter's, its scaled copy, the sum) where a plain linear
# makes one.
LORA_OUTPUT_TENSORS = 4


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
    largest_tensor: int = 0  # elements of the largest single tensor (read, gathered whole)
    head_params: int = 0  # the output projection (its own FSDP2 unit, kept gathered)
    saves: bool = False  # a checkpoint is saved inside the run
    async_save: bool = False
    save_optimizer: bool = True
    val_micro_batch: int = 0  # 0: no validation pass
    quant_bits: int = 0  # QLoRA: the decoder layers' linear weights in 4 or 8 bits (0: none)
    quant_double: bool = True  # 4-bit: the blocks' scales quantized too (double quantization)


def _shards(x: EstimateInputs) -> tuple[int, int]:
    """(divisor of dense parameters, divisor of expert parameters) on one rank. Expert
    parallelism (tp 1, fsdp2) gives each of the ep ranks of a group 1/ep of the experts, and
    FSDP2 shards that slice over the dp_shard x cp / ep ranks holding the same one: the
    experts divide by dp_shard x cp (x pp for the stage's layers), as dense parameters do."""
    fsdp = x.dp_shard * x.cp if x.strategy == "fsdp2" else 1
    dense = fsdp * x.tp * x.pp
    return dense, (fsdp * x.pp if x.ep > 1 else dense)


def _held_trained(x: EstimateInputs) -> tuple[float, float]:
    """(parameters held, parameters trained) on one rank; under LoRA only the adapters train."""
    dense, expert = _shards(x)
    held = (x.params - x.expert_params) / dense + x.expert_params / expert
    return held, (held if x.lora_rank is None else x.trainable / dense)


def _quantized(x: EstimateInputs) -> int:
    """Parameters QLoRA quantizes: the decoder layers' linear weights (not the embedding,
    the head or native grouped experts; norms are a negligible part of a layer)."""
    return x.params - x.root_params - x.expert_params if x.quant_bits else 0


def _held_param_bytes(x: EstimateInputs, held: float) -> float:
    """Bytes of the parameters a rank holds. QLoRA's quantized weights stay out of FSDP2's
    sharding (whole on every rank): 4 bits and a scale per 64-weight block (a byte under
    double quantization, else fp32), or 8 bits and a per-row fp32 scale."""
    quantized = _quantized(x)
    if not quantized:
        return held * x.param_bytes
    dense, _ = _shards(x)
    per_weight = (0.5 + (1 if x.quant_double else 4) / 64) if x.quant_bits == 4 else 1.0
    return (held - quantized / dense) * x.param_bytes + quantized * per_weight


def _grad_bytes(x: EstimateInputs, trained: float) -> float:
    copies = 2 if x.strategy == "ddp" and x.dp_shard * x.tp > 1 else 1  # DDP's buckets
    return trained * x.param_bytes * copies


def _tokens(x: EstimateInputs, micro_batch: int) -> int:
    return micro_batch * math.ceil(x.seq_length / x.cp)


def _layer_bytes(x: EstimateInputs, tokens: int) -> float:
    """One decoder layer's saved activations."""
    width = (
        ACT_HIDDEN * x.hidden + (ACT_ATTENTION * x.attention_width + ACT_MLP * x.mlp_width) / x.tp
    )
    lora = ACT_LORA_FACTOR if x.lora_rank is not None else 1.0
    return tokens * width * x.compute_bytes * lora


def _logit_bytes(x: EstimateInputs, tokens: int, training: bool) -> float:
    fp32 = LOGIT_FP32_BYTES_CHUNKED if x.chunked_loss else LOGIT_FP32_BYTES
    per_entry = 2 * x.compute_bytes + fp32 if training else x.compute_bytes + 4
    return tokens * x.vocab * per_entry / x.tp


def activation_bytes(x: EstimateInputs) -> int:
    """A training micro-batch's saved activations and logits, on one rank."""
    tokens = _tokens(x, x.micro_batch)
    per_layer = _layer_bytes(x, tokens)
    layers = math.ceil(x.layers / x.pp)
    inputs = tokens * x.hidden * x.compute_bytes  # what a checkpointed layer keeps
    if x.activation_checkpointing in (True, "full"):
        layer_total = layers * inputs + per_layer
    elif x.activation_checkpointing == "selective":  # every second layer wrapped
        kept = layers - layers // 2 - layers % 2
        layer_total = kept * per_layer + (layers - kept) * inputs + per_layer
    else:
        layer_total = layers * per_layer
    return int(layer_total + _logit_bytes(x, tokens, True))


def _gathered_bytes(x: EstimateInputs, backward: bool = True) -> float:
    """FSDP2's unsharded units beyond the local shards (none on one shard): parameters, and
    in a backward the unsharded gradients of units that train (none under LoRA, whose
    adapters are a negligible part of a unit)."""
    dense, _ = _shards(x)
    if x.strategy != "fsdp2" or dense <= 1:
        return 0.0
    # QLoRA's quantized layer weights are never gathered
    unit = (x.head_params or x.root_params) + (0 if x.quant_bits else x.layer_params)
    grads = FSDP_GATHERED_GRADS if backward and x.lora_rank is None else 0.0
    copies = FSDP_GATHERED_PARAMS + grads
    return copies * unit / x.tp * x.compute_bytes * (1 - 1 / dense)


def _load_bytes(x: EstimateInputs, held: float) -> float:
    """While the model loads: this rank's shards and one whole tensor being read, or (a
    full load) the whole model, each tensor freed once FSDP2 made its shard from it."""
    dense, _ = _shards(x)
    if x.full_load:
        return (LOAD_COPIES * x.params + x.largest_tensor) * x.param_bytes
    return (held + x.largest_tensor * (1 + 1 / dense)) * x.param_bytes


def _save_bytes(x: EstimateInputs, held: float, optimizer: float) -> float:
    """A save: no gradients; one whole tensor gathered; an asynchronous save's CPU copies."""
    gather = SAVE_GATHER_COPIES * x.largest_tensor * x.param_bytes
    snapshot = 0.0
    if x.async_save and x.accelerator != "cuda":  # the copies live in host memory
        snapshot = x.params * x.param_bytes + (optimizer if x.save_optimizer else 0.0)
    return _held_param_bytes(x, held) + optimizer + gather + snapshot


def _lora_arena_bytes(x: EstimateInputs) -> float:
    """CPU under LoRA: the heap arena's resident share of the adapted linears' outputs. Each
    decoder linear (q, k, v, o, gate, up, down; every one adapted, as `match_all_linear`)
    makes LORA_OUTPUT_TENSORS output-sized tensors per micro-batch; those below the mmap
    threshold come from the arena, which returns only its top when they are freed, so every
    layer's stay resident (free in the arena) from the first step on. A full fine-tune's
    arena (also measured: 30-70 MiB free after a step) is inside the CPU constants fitted on
    FIT's full fine-tunes."""
    if x.lora_rank is None or x.accelerator == "cuda":
        return 0.0
    tokens = _tokens(x, x.micro_batch)
    kv = max(0, (x.attention_width - x.hidden) // 2)
    column = (x.hidden, kv, kv, x.mlp_width, x.mlp_width)  # q, k, v, gate, up: split by tp
    widths = [w / x.tp for w in column] + [x.hidden, x.hidden]  # o, down: whole
    small = sum(w for w in widths if tokens * w * x.compute_bytes < CPU_MMAP_THRESHOLD)
    layers = math.ceil(x.layers / x.pp)
    return LORA_OUTPUT_TENSORS * small * tokens * x.compute_bytes * layers


def _optimizer_temporary_bytes(x: EstimateInputs, trained: float) -> float:
    """The optimizer update's temporaries: foreach (CUDA) over every trainable shard, else
    (CPU) one tensor at a time, the largest trainable one (under LoRA at most a layer's
    adapters, a bound far above one adapter and still negligible)."""
    if x.accelerator == "cuda":
        return trained * x.param_bytes * OPTIMIZER_TEMPORARY
    dense, _ = _shards(x)
    largest = x.largest_tensor / dense if x.lora_rank is None else x.trainable / max(x.layers, 1)
    return OPTIMIZER_TEMPORARY_LARGEST * min(largest, trained) * x.param_bytes


def phase_peaks(x: EstimateInputs) -> dict[str, float]:
    """Bytes one rank holds at the peak of each phase of the run (process overhead apart)."""
    held, trained = _held_trained(x)
    params, grads = _held_param_bytes(x, held), _grad_bytes(x, trained)
    optimizer = trained * x.param_bytes * x.optimizer_states
    arena = _lora_arena_bytes(x)  # resident from the first step on
    steady = params + grads + optimizer + arena
    phases = {
        "load": _load_bytes(x, held),
        "backward": steady + activation_bytes(x) + _gathered_bytes(x),
        "optimizer step": steady + _optimizer_temporary_bytes(x, trained),
    }
    if x.val_micro_batch:
        tokens = _tokens(x, x.val_micro_batch)
        val = (
            _layer_bytes(x, tokens)
            + _logit_bytes(x, tokens, False)
            + _gathered_bytes(x, backward=False)
        )
        phases["validation"] = params + optimizer + arena + val
    if x.saves:
        phases["save"] = _save_bytes(x, held, optimizer) + arena
    return phases


def _process_bytes(x: EstimateInputs, peak: float) -> float:
    """The process's own memory: CPU constants, or fragmentation on CUDA."""
    if x.accelerator == "cuda":
        return CUDA_FRAGMENTATION * peak
    process = CPU_BASE_WORKSPACE + (CPU_FULL_LOAD_WORKSPACE if x.full_load else 0)
    return process + (CPU_RANK_WORKSPACE if x.world_size > 1 else 0)


def peak_phase(x: EstimateInputs) -> str:
    """The phase that sets the run's peak."""
    phases = phase_peaks(x)
    return max(phases, key=lambda name: phases[name])


def memory_per_rank(x: EstimateInputs) -> dict[str, int]:
    """Bytes on one rank at the run's peak: params, grads, optimizer state, activations
    (with the logits) and workspace (what the peak phase holds beyond them: gathered units,
    load or save buffers, optimizer temporaries, the LoRA arena, the process's own), total."""
    held, trained = _held_trained(x)
    parts = {
        "params": int(_held_param_bytes(x, held)),
        "grads": int(_grad_bytes(x, trained)),
        "optimizer": int(trained * x.param_bytes * x.optimizer_states),
        "activations": activation_bytes(x),
    }
    peak = max(phase_peaks(x).values())
    total = int(peak + _process_bytes(x, peak))
    parts["workspace"] = max(0, total - sum(parts.values()))
    parts["total"] = sum(parts.values())
    return parts
