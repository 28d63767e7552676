"""Shard-only load (meta build + FSDP2 + per-tensor fill) of Gemma 2 / Gemma 3 text.

On one process with a 1-rank gloo mesh the filled model equals the full load exactly:
parameters, the tie, the RoPE buffers (Gemma 3: one per layer type, recomputed after the
meta build) and the soft-capped logits.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from family_checks import full_tensor, one_rank_gloo_mesh, shard_layers_then_model
from gemma_tiny_configs import GEMMA_FAMILIES, VOCAB, gemma_config, randomize_norms

from models.auto import AutoModelForCausalLM
from models.common import shard_load
from models.common.config import native_class_for

mesh = pytest.fixture(scope="module")(one_rank_gloo_mesh)


@pytest.mark.parametrize("family", GEMMA_FAMILIES)
def test_gemma_meta_build_and_fill_equal_the_full_load(family, tmp_path, mesh):
    cls, _ = native_class_for(gemma_config(family))
    assert shard_load.supports_shard_only_load(cls)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(gemma_config(family))
    randomize_norms(hf)
    hf.save_pretrained(tmp_path)
    old = AutoModelForCausalLM.from_pretrained(tmp_path)
    shard_layers_then_model(old, mesh)
    new, directory = shard_load.build_meta_native(tmp_path)
    shard_layers_then_model(new, mesh)
    shard_load.fill_sharded(new, directory, torch.device("cpu"))
    assert not shard_load.is_meta(new)
    assert new.lm_head.weight is new.model.embed_tokens.weight
    old_state, new_state = old.state_dict(), new.state_dict()
    assert list(old_state) == list(new_state)
    for key, value in old_state.items():
        assert torch.equal(full_tensor(new_state[key]), full_tensor(value)), key
    old_buffers, new_buffers = dict(old.named_buffers()), dict(new.named_buffers())
    expected = 2 if family == "gemma3" else 1
    assert len([k for k in old_buffers if k.endswith("inv_freq")]) == expected
    for key, value in old_buffers.items():
        assert torch.equal(new_buffers[key], value), key
    ids = torch.randint(1, VOCAB, (2, 12))
    assert torch.equal(new(ids).logits, old(ids).logits)
