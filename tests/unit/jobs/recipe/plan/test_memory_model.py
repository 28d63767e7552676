"""The memory model: a run's peak is its largest phase (load, backward, optimizer step,
validation, save), each phase holding what the trainer holds then."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jobs.recipe.plan import memory_model as mm

# A 2-rank FSDP2 fp32 Llama-like model: 8 layers of hidden 512, vocab 32000, AdamW.
BASE = mm.EstimateInputs(
    params=60_000_000, expert_params=0, root_params=32_768_512, layer_params=3_400_000,
    trainable=60_000_000, lora_rank=None, param_bytes=4, compute_bytes=4, optimizer_states=2,
    hidden=512, attention_width=1536, mlp_width=1536, layers=8, vocab=32000, seq_length=256,
    micro_batch=2, activation_checkpointing=False, chunked_loss=False, strategy="fsdp2",
    dp_shard=2, tp=1, pp=1, cp=1, ep=1, accelerator="cpu", world_size=2, full_load=False,
    largest_tensor=16_384_000, head_params=16_384_000,
)  # fmt: skip


def test_parts_add_up_to_the_total_and_cover_the_peak_phase():
    memory = mm.memory_per_rank(BASE)
    assert memory["total"] == sum(v for k, v in memory.items() if k != "total")
    assert memory["total"] >= max(mm.phase_peaks(BASE).values())
    assert memory["workspace"] >= mm.CPU_BASE_WORKSPACE


def test_a_full_load_peaks_above_the_shard_only_load():
    shard_only = mm.phase_peaks(BASE)["load"]
    full = mm.phase_peaks(replace(BASE, full_load=True))["load"]
    assert shard_only < BASE.params * BASE.param_bytes < full


def test_save_and_validation_are_phases_only_when_the_run_has_them():
    assert set(mm.phase_peaks(BASE)) == {"load", "backward", "optimizer step"}
    both = mm.phase_peaks(replace(BASE, saves=True, val_micro_batch=2))
    assert {"save", "validation"} <= set(both)
    assert both["save"] < both["backward"]  # gradients are gone, one tensor gathered


@pytest.mark.parametrize(("accelerator", "grows"), [("cpu", True), ("cuda", False)])
def test_an_async_save_copies_the_whole_model_in_host_memory(accelerator, grows):
    sync = replace(BASE, saves=True, accelerator=accelerator)
    copied = mm.phase_peaks(replace(sync, async_save=True))["save"] - mm.phase_peaks(sync)["save"]
    assert (copied >= BASE.params * BASE.param_bytes) is grows
    assert copied >= 0


def test_activation_checkpointing_and_lora_lower_the_backward():
    backward = mm.phase_peaks(BASE)["backward"]
    assert mm.phase_peaks(replace(BASE, activation_checkpointing=True))["backward"] < backward
    lora = replace(BASE, lora_rank=8, trainable=500_000, full_load=True)
    assert mm.phase_peaks(lora)["backward"] < backward
    assert mm.peak_phase(lora) in mm.phase_peaks(lora)


def test_more_shards_lower_every_phase_but_the_process():
    two, four = mm.phase_peaks(BASE), mm.phase_peaks(replace(BASE, dp_shard=4, world_size=4))
    assert all(four[name] < two[name] for name in two)


def test_fsdp2_gathers_unsharded_gradients_only_for_units_that_train():
    unit_bytes = (BASE.head_params + BASE.layer_params) * BASE.compute_bytes
    beyond_shard = 1 - 1 / BASE.dp_shard
    lora = replace(BASE, lora_rank=8, trainable=500_000, full_load=True)
    # a full fine-tune: the head and a layer with their unsharded gradients
    assert mm._gathered_bytes(BASE) == pytest.approx(2 * unit_bytes * beyond_shard)
    # LoRA: the frozen base has no gradient, only its parameters are gathered
    assert mm._gathered_bytes(lora) == pytest.approx(unit_bytes * beyond_shard)
    # validation gathers parameters only, either way
    for x in (BASE, lora):
        assert mm._gathered_bytes(x, backward=False) == pytest.approx(unit_bytes * beyond_shard)
    assert mm._gathered_bytes(replace(lora, dp_shard=1, world_size=1)) == 0.0


def test_optimizer_temporaries_cpu_follow_the_largest_tensor_cuda_every_shard():
    steady = {"cpu": 0.0, "cuda": 0.0}
    peaks = {}
    for accelerator in steady:
        x = replace(BASE, accelerator=accelerator)
        memory = mm.memory_per_rank(x)
        steady[accelerator] = memory["params"] + memory["grads"] + memory["optimizer"]
        peaks[accelerator] = mm.phase_peaks(x)["optimizer step"] - steady[accelerator]
    shard = BASE.params / BASE.dp_shard * BASE.param_bytes
    largest_shard = BASE.largest_tensor / BASE.dp_shard * BASE.param_bytes
    # CPU: torch's single-tensor update, a few copies of the largest tensor's shard
    assert peaks["cpu"] == pytest.approx(mm.OPTIMIZER_TEMPORARY_LARGEST * largest_shard, abs=8)
    # CUDA: the foreach update's temporaries over every trainable shard
    assert peaks["cuda"] == pytest.approx(mm.OPTIMIZER_TEMPORARY * shard, abs=8)
    # more (smaller) tensors of the same total: CPU's temporaries shrink, CUDA's do not
    small = replace(BASE, largest_tensor=BASE.largest_tensor // 4)
    assert mm.phase_peaks(small)["optimizer step"] < mm.phase_peaks(BASE)["optimizer step"]
    cuda_small = replace(small, accelerator="cuda")
    assert mm.phase_peaks(cuda_small)["optimizer step"] == pytest.approx(
        steady["cuda"] + peaks["cuda"], abs=8
    )


# A LoRA run of BASE's model on one micro-batch of 256 tokens: hidden-sized outputs (q, k, v,
# o, down: 256 x 512 fp32 = 0.5 MiB) come from the heap arena, the MLP's (1.5 MiB) are mmapped.
LORA = replace(BASE, lora_rank=8, trainable=500_000, full_load=True, micro_batch=1)


def test_lora_on_cpu_keeps_its_small_linear_outputs_resident_in_the_arena():
    # by hand: 4 output-sized tensors x 5 linears x 0.5 MiB x 8 layers
    assert mm._lora_arena_bytes(LORA) == 4 * 5 * (256 * 512 * 4) * 8 == 80 << 20
    # not for a full fine-tune (its arena is in the fitted constants), nor on CUDA
    assert mm._lora_arena_bytes(replace(LORA, lora_rank=None, trainable=BASE.params)) == 0
    assert mm._lora_arena_bytes(replace(LORA, accelerator="cuda")) == 0
    # outputs at or above the mmap threshold are returned when freed: 512 tokens x 512 = 1 MiB
    assert mm._lora_arena_bytes(replace(LORA, micro_batch=2)) == 0
    # tensor parallelism splits the column-parallel outputs: the MLP's (0.75 MiB) join in
    split = replace(LORA, tp=2)
    assert mm._lora_arena_bytes(split) == 4 * (3 * 256 + 2 * 768 + 2 * 512) * 256 * 4 * 8


def test_the_lora_arena_is_held_from_the_first_step_on_but_not_while_loading(monkeypatch):
    lora = replace(LORA, saves=True, val_micro_batch=1)
    with_arena = mm.phase_peaks(lora)
    monkeypatch.setattr(mm, "CPU_MMAP_THRESHOLD", 0)  # every tensor mmapped: no arena
    without = mm.phase_peaks(lora)
    assert with_arena["load"] == without["load"]
    for phase in ("backward", "optimizer step", "validation", "save"):
        assert with_arena[phase] - without[phase] == pytest.approx(80 << 20)


def test_the_mmap_threshold_is_the_workers_allocator_setting():
    from worker.launcher import CPU_ALLOCATOR_ENV

    assert int(CPU_ALLOCATOR_ENV["MALLOC_MMAP_THRESHOLD_"]) == mm.CPU_MMAP_THRESHOLD


def test_experts_spread_over_fewer_ranks_than_dp_are_sharded_again():
    """ep 2 over dp_shard 4: each rank holds half the experts' slice (FSDP2 over the two
    ranks holding the same slice), a quarter of the experts, as with ep 4."""
    x = replace(BASE, expert_params=40_000_000, dp_shard=4, world_size=4)
    ep2, ep4 = replace(x, ep=2), replace(x, ep=4)
    assert mm.memory_per_rank(ep2)["params"] == mm.memory_per_rank(ep4)["params"]
    assert mm.memory_per_rank(ep2)["params"] == 60_000_000 // 4 * x.param_bytes
