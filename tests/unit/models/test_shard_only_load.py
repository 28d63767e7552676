"""Shard-only load (models.common.shard_load): meta build + FSDP2 + per-tensor fill.

On one process with a 1-rank gloo mesh: sentinel values written through the load targets
reach the sharded parameters' storage (for every family that declares the capability),
the filled model equals the full load exactly (tied and untied, with rotary buffers), and
the family whose adapter cannot write through (Qwen3-MoE) reports False.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from tiny_model_configs import FAMILIES, make_config
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from models.auto import AutoModelForCausalLM
from models.common import shard_load
from models.common.config import native_class_for
from models.hooks import decoder_layers


@pytest.fixture(scope="module")
def mesh():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def _shard(model, mesh) -> None:
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _saved(family: str, tmp_path, **overrides):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config(family, **overrides))
    model.save_pretrained(tmp_path)
    return model


def _capable(family: str) -> bool:
    cls, _ = native_class_for(make_config(family))
    return shard_load.supports_shard_only_load(cls)


def test_only_the_moe_adapter_opts_out():
    assert {f: _capable(f) for f in FAMILIES} == {f: f != "qwen3_moe" for f in FAMILIES}
    cls, _ = native_class_for(make_config("qwen3_moe"))
    assert cls.state_dict_adapter().supports_low_memory_dcp_load is False


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "qwen3_moe"])
def test_sentinel_writes_through_targets_reach_sharded_storage(family, tmp_path, mesh):
    _saved(family, tmp_path)
    model, directory = shard_load.build_meta_native(tmp_path)
    _shard(model, mesh)
    shard_load.fill_sharded(model, directory, torch.device("cpu"))
    targets = shard_load._load_targets(model)
    params = dict(model.named_parameters())
    assert targets, family
    for index, (key, target) in enumerate(targets.items()):
        assert isinstance(target, DTensor), key
        with torch.no_grad():
            shard_load._destination(target).fill_(1000.0 + index)
        param = params[key]
        assert torch.all(param.to_local() == 1000.0 + index), key
    # the model's own state dict (what training and saving read) sees the sentinels
    state = model.state_dict()
    for index, key in enumerate(targets):
        assert torch.all(state[key].full_tensor() == 1000.0 + index), key


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "qwen3_moe"])
@pytest.mark.parametrize("tied", [False, True])
def test_meta_build_and_fill_equal_the_full_load(family, tied, tmp_path, mesh):
    _saved(family, tmp_path, tie_word_embeddings=tied)
    old = AutoModelForCausalLM.from_pretrained(tmp_path)
    _shard(old, mesh)
    new, directory = shard_load.build_meta_native(tmp_path)
    assert shard_load.is_meta(new)
    _shard(new, mesh)
    shard_load.fill_sharded(new, directory, torch.device("cpu"))
    assert not shard_load.is_meta(new)
    assert (new.lm_head.weight is new.model.embed_tokens.weight) == tied
    old_state, new_state = old.state_dict(), new.state_dict()
    assert list(old_state) == list(new_state)
    for key, value in old_state.items():
        got = new_state[key]
        value = value.full_tensor() if isinstance(value, DTensor) else value
        got = got.full_tensor() if isinstance(got, DTensor) else got
        assert got.dtype == value.dtype and torch.equal(got, value), key
    old_buffers, new_buffers = dict(old.named_buffers()), dict(new.named_buffers())
    assert old_buffers and list(old_buffers) == list(new_buffers)
    for key, value in old_buffers.items():
        assert torch.equal(new_buffers[key], value), key
    ids = torch.randint(1, 512, (2, 12))
    assert torch.equal(new(ids).logits, old(ids).logits)


def test_hf_fallback_and_force_hf_keep_the_full_load(tmp_path):
    _saved("llama", tmp_path)
    assert shard_load.build_meta_native(tmp_path, force_hf=True) is None
    _saved("qwen3_moe", tmp_path / "moe")
    assert shard_load.build_meta_native(tmp_path / "moe") is None


def test_a_checkpoint_of_another_shape_is_refused(tmp_path, mesh):
    _saved("llama", tmp_path)
    model, directory = shard_load.build_meta_native(tmp_path, num_hidden_layers=3)
    _shard(model, mesh)
    with pytest.raises(shard_load.CheckpointError, match="missing"):
        shard_load.fill_sharded(model, directory, torch.device("cpu"))
