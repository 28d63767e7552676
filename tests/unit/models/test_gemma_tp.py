"""Gemma 2 / Gemma 3 sharded on 2 gloo ranks give the single-process logits, loss, gradients.

Tensor parallelism with each family's plan (`models.gemma2.parallelize`,
`models.gemma3.parallelize`), with and without sequence parallelism (sandwich norms and
Gemma 3's per-head q/k norms sum their weight gradients over the ranks), through the
trainer's `parallelize` (TP then FSDP2), and FSDP2 alone. Tied embeddings stay tied and
the final soft-cap is applied to the gathered logits. The transformers Gemma classes run
under the same plans. One pair of `_gemma_worker.py`
processes runs every case.
"""

from __future__ import annotations

from pathlib import Path

from gloo_cases import assert_cases_pass_on_two_ranks

WORKER = Path(__file__).with_name("_gemma_worker.py")

CASES = [
    "tp:gemma2:0",  # plain TP: eager soft-capped attention on local heads
    "tp:gemma2:1",  # sequence parallel: the four sandwich norms sharded on the sequence
    "tp:gemma3:0",  # q/k norms: weight gradients summed over the tp ranks
    "tp:gemma3:1",
    "tp:gemma2:1:hf",  # the transformers classes under the same plans (force_hf keeps TP)
    "tp:gemma3:0:hf",
    "trainer_tp:gemma2:1",  # trainer parallelize: TP + SP, then FSDP2
    "trainer_tp:gemma3:0",
    "fsdp:gemma2",
    "fsdp:gemma3",
]


def test_gemma_sharding_matches_single_process(tmp_path):
    assert_cases_pass_on_two_ranks(WORKER, CASES, tmp_path)
