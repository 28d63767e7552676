"""Context-parallel attention (`models.common.context_parallel`) equals one process.

The index arithmetic is checked in-process: each rank keeps chunks r and 2*cp-1-r, the
ranks' slices cover the sequence once, and reordering gathered slices restores it (and
the backward's rank order inverts it). The model cases run on two gloo ranks
(`_cp_worker.py`): logits, loss and every gradient of a context-parallel native model equal
the single-process model's for Llama (GQA and full multi-head), Llama 3 RoPE, Qwen2 (q/k/v
bias) and Qwen3 (q/k norm), at sequence lengths whose chunks are 4 and 3 tokens long, and
for packed rows (documents crossing chunk boundaries, position ids restarting at 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gloo_cases import assert_cases_pass_on_two_ranks

from models.common.context_parallel import (
    ContextParallel,
    _to_global_order,
    _to_rank_order,
    enable_context_parallel,
    sequence_indices,
)

WORKER = Path(__file__).with_name("_cp_worker.py")


def test_each_rank_keeps_a_load_balanced_pair_of_chunks():
    assert sequence_indices(16, 0, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert sequence_indices(16, 1, 2).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    slices = [sequence_indices(24, r, 3) for r in range(3)]
    assert sorted(torch.cat(slices).tolist()) == list(range(24))
    # causal work per rank: sum over local queries of the keys they see, equal on every rank
    assert len({int((s + 1).sum()) for s in slices}) == 1


def test_a_length_not_divisible_by_twice_cp_is_refused():
    with pytest.raises(ValueError, match="multiple of 2"):
        sequence_indices(10, 0, 3)


def test_gathered_slices_reorder_to_the_sequence_and_back():
    seq = torch.arange(24).view(1, 1, 24, 1).float()
    slices = [seq[:, :, sequence_indices(24, r, 3)] for r in range(3)]
    assert torch.equal(_to_global_order(slices, dim=2), seq)
    assert all(torch.equal(a, b) for a, b in zip(_to_rank_order(seq, 3, 2), slices, strict=True))


def test_sliding_window_layers_are_refused():
    layer = torch.nn.Linear(2, 2)
    layer.sliding_window = 8
    with pytest.raises(ValueError, match="sliding windows"):
        enable_context_parallel(torch.nn.Sequential(layer), group=None)


def test_native_attention_outside_the_decoder_stack_is_refused():
    from transformers import LlamaConfig

    from models.common.layers import Attention

    config = LlamaConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=2)
    with pytest.raises(ValueError, match="common decoder stack only"):
        enable_context_parallel(torch.nn.Sequential(Attention(config)), group=None)


def test_a_forward_without_position_ids_is_refused():
    with pytest.raises(ValueError, match="needs position_ids"):
        ContextParallel(group=None, rank=0, size=2).observe(None)


CASES = [
    "llama",  # GQA (4 query heads, 2 kv heads), chunks of 4 tokens
    "llama:12:4",  # full multi-head attention, chunks of 3 tokens
    "llama3_rope:16",  # Llama 3 frequency scaling with global positions
    "qwen2",  # q/k/v bias
    "qwen3:12",  # per-head q/k RMSNorm, head_dim 32
    "llama:16:0:packed",  # packed rows: document masks over global positions, local RoPE
    "qwen3:24:0:packed",  # the same with q/k norm, chunks of 6 tokens
]


def test_context_parallel_models_match_single_process(tmp_path):
    """All cases in one pair of processes (imports dominate the cost)."""
    assert_cases_pass_on_two_ranks(WORKER, CASES, tmp_path)
