"""The hooks' sharding data, applied on 2 gloo ranks, matches one process.

Tensor parallelism (`tp_plan`, with and without sequence parallelism, native and Hugging
Face classes, tied and untied), FSDP2 per `decoder_layers` (dense and MoE), and the
trainer's `parallelize` (TP with sequence parallelism, then FSDP2) on every native family
whose registry row or class claims tensor parallelism. Each case
starts two plain Python processes (gloo, CPU) running `_tp_worker.py`; logits, loss and
every gradient of the sharded model must equal the unsharded model's.
"""

from __future__ import annotations

from pathlib import Path

from gloo_cases import assert_cases_pass_on_two_ranks

WORKER = Path(__file__).with_name("_tp_worker.py")


CASES = [
    "tp:hf:0:0",  # Hugging Face LlamaForCausalLM, plain TP
    "tp:hf:1:1",  # Hugging Face, sequence parallel, tied embeddings
    "tp:native:0:1",  # native, plain TP, tied
    "tp:native:1:0",  # native, sequence parallel, untied (rowwise embedding, colwise head)
    "fsdp:qwen3_moe",  # FSDP2 per decoder layer over grouped experts and the fp32 router
    "trainer_tp:qwen2:native:1:1",  # q/k/v bias sharded with its projection, tied
    "trainer_tp:qwen3:native:1:0",  # q/k norms: weight gradients summed over tp ranks
    "trainer_tp:qwen3:native:0:1",  # the same without sequence parallelism, tied
    "trainer_tp:qwen3:hf:1:0",  # Hugging Face Qwen3 under Qwen3's plan
]


def test_sharding_hooks_match_single_process(tmp_path):
    """All cases in one pair of processes (imports dominate the cost)."""
    assert_cases_pass_on_two_ranks(WORKER, CASES, tmp_path)
