"""gpt-oss and the shard-only load: the adapter's targets write through to FSDP2 shards.

On one process with a 1-rank gloo mesh, the native model built on meta and sharded with
FSDP2 is filled tensor by tensor (`models.common.shard_load.fill_sharded`) through the
adapter's targets, the transposed expert views included: it equals the full load exactly,
and sentinels written through every target reach the parameters' storage. The family still
declines the capability (`supports_low_memory_dcp_load = False`, so the trainer keeps the
full load), because on that path `to_empty` drops the expert parameters' gradient
hooks that expert parallelism registers.
"""

from __future__ import annotations

import pytest
import torch
from family_checks import full_tensor, one_rank_gloo_mesh, shard_layers_then_model
from gpt_oss_tiny import seeded_hf_model, token_batch

from models import AutoModelForCausalLM
from models.common import shard_load
from models.gpt_oss import GptOssForCausalLM

mesh = pytest.fixture(scope="module")(one_rank_gloo_mesh)


def test_fill_through_the_adapter_equals_the_full_load(tmp_path, mesh):
    seeded_hf_model().save_pretrained(tmp_path)
    old = AutoModelForCausalLM.from_pretrained(tmp_path)
    new = GptOssForCausalLM.meta_from_pretrained(tmp_path)
    shard_layers_then_model(new, mesh)
    shard_load.fill_sharded(new, tmp_path, torch.device("cpu"))
    old_state, new_state = old.state_dict(), new.state_dict()
    assert list(old_state) == list(new_state)
    for key, value in old_state.items():
        got = full_tensor(new_state[key])
        assert got.dtype == value.dtype and torch.equal(got, value), key
    ids = token_batch()
    assert torch.equal(new(ids).logits, old(ids).logits)
    targets = shard_load._load_targets(new)
    assert targets["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 32, 96)
    params = dict(new.named_parameters())
    for index, (key, target) in enumerate(targets.items()):
        with torch.no_grad():
            shard_load._destination(target).fill_(1000.0 + index)
        assert torch.all(full_tensor(params[key]) == 1000.0 + index), key


def test_the_family_keeps_the_full_load(tmp_path):
    assert not shard_load.supports_shard_only_load(GptOssForCausalLM)
    seeded_hf_model().save_pretrained(tmp_path)
    assert shard_load.build_meta_native(tmp_path) is None
