"""Phi-3 state-dict adapter: every HF key mapped, exact reversible split/fuse, checked shapes,
loads that write straight into the parameters, and the shard-only load declined."""

from __future__ import annotations

import random

import pytest
import torch
import transformers
from phi3_tiny import phi3_config
from safetensors.torch import load_file, save_file

from models import AutoModelForCausalLM
from models.common import shard_load
from models.common.config import native_class_for
from models.common.safetensors_io import CheckpointError
from models.phi3.state_dict_adapter import FusedMappingError, Phi3StateDictAdapter

A = Phi3StateDictAdapter


@pytest.fixture
def hf_model():
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(phi3_config()).eval()


def test_every_hf_key_maps_with_its_shape(hf_model):
    config, hf = hf_model.config, hf_model.state_dict()
    native = A.from_hf(hf, config)
    layer = "model.layers.1."
    assert native[layer + "self_attn.q_proj.weight"].shape == (64, 64)
    assert native[layer + "self_attn.k_proj.weight"].shape == (32, 64)
    assert native[layer + "self_attn.v_proj.weight"].shape == (32, 64)
    assert native[layer + "mlp.gate_proj.weight"].shape == (96, 64)
    assert native[layer + "mlp.up_proj.weight"].shape == (96, 64)
    fused = {k for k in hf if "qkv_proj" in k or "gate_up_proj" in k}
    assert len(fused) == 4 and not fused & set(native)
    assert set(hf) - fused <= set(native)  # everything else passes through by name
    assert len(native) == len(hf) + 3 * 2  # each layer: 2 fused -> 5 parts
    model = AutoModelForCausalLM.from_config(config)
    assert set(native) == set(model.state_dict())  # nothing dropped, nothing extra


def test_round_trip_is_exact_and_order_independent(hf_model):
    hf = hf_model.state_dict()
    items = list(hf.items())
    random.Random(0).shuffle(items)
    native = A.from_hf(dict(items), hf_model.config)
    back = A.to_hf(native, hf_model.config)
    assert sorted(back) == sorted(hf)
    for key, tensor in hf.items():
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor), key
    qkv = hf["model.layers.0.self_attn.qkv_proj.weight"]
    assert torch.equal(native["model.layers.0.self_attn.k_proj.weight"], qkv[64:96])
    gate_up = hf["model.layers.0.mlp.gate_up_proj.weight"]
    assert torch.equal(native["model.layers.0.mlp.up_proj.weight"], gate_up[96:])


def test_split_parts_are_views_not_copies(hf_model):
    hf = hf_model.state_dict()
    native = A.from_hf(hf, hf_model.config)
    qkv = hf["model.layers.0.self_attn.qkv_proj.weight"]
    v = native["model.layers.0.self_attn.v_proj.weight"]
    assert v.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()


def test_wrong_shapes_and_missing_parts_are_refused(hf_model):
    config, hf = hf_model.config, hf_model.state_dict()
    bad = dict(hf)
    bad["model.layers.0.self_attn.qkv_proj.weight"] = torch.zeros(120, 64)
    with pytest.raises(CheckpointError, match=r"fused shape \(120, 64\) != \(128, 64\)"):
        A.from_hf(bad, config)
    native = A.from_hf(hf, config)
    del native["model.layers.0.mlp.up_proj.weight"]
    with pytest.raises(FusedMappingError, match=r"missing \['up_proj'\]"):
        A.to_hf(native, config)
    native = A.from_hf(hf, config)
    native["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)
    with pytest.raises(FusedMappingError, match="k_proj has shape"):
        A.to_hf(native, config)


def test_a_checkpoint_fused_for_another_config_is_refused_on_load(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match=r"qkv_proj.weight: fused shape \(128, 64\) != \(192, 64\)"
    ):
        AutoModelForCausalLM.from_pretrained(tmp_path, num_key_value_heads=4)


def test_load_reads_row_ranges_straight_into_parameters(hf_model, tmp_path):
    """Sentinel rows in the checkpoint land in the parameters' own storage, in place."""
    hf_model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    state[qkv] = torch.arange(128.0).repeat_interleave(64).reshape(128, 64)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model = AutoModelForCausalLM.from_config(hf_model.config)
    attn = model.model.layers[0].self_attn
    pointers = {p: getattr(attn, p).weight.data_ptr() for p in ("q_proj", "k_proj", "v_proj")}
    model.load_hf_weights(tmp_path)
    assert {p: getattr(attn, p).weight.data_ptr() for p in pointers} == pointers
    assert torch.equal(attn.q_proj.weight[:, 0], torch.arange(64.0))
    assert torch.equal(attn.k_proj.weight[:, 0], torch.arange(64.0, 96.0))
    assert torch.equal(attn.v_proj.weight[:, 0], torch.arange(96.0, 128.0))


def test_bf16_checkpoint_loads_into_fp32_parameters(hf_model, tmp_path):
    hf_model.to(torch.bfloat16).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype="float32")
    ref = A.from_hf(hf_model.state_dict(), hf_model.config)
    for key, tensor in model.state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, ref[key].float()), key


def test_save_matches_to_hf_and_shards(hf_model, tmp_path):
    model = AutoModelForCausalLM.from_config(hf_model.config)
    model.save_pretrained(tmp_path, max_shard_size=40_000)
    files = sorted(tmp_path.glob("*.safetensors"))
    assert len(files) > 1 and (tmp_path / "model.safetensors.index.json").exists()
    saved = {k: v for f in files for k, v in load_file(f).items()}
    expected = A.to_hf(model.state_dict(), model.config)
    assert sorted(saved) == sorted(expected)
    for key, tensor in expected.items():
        assert torch.equal(saved[key], tensor), key


def test_single_tensor_conversion_refuses_a_part_alone():
    assert A.convert_single_tensor_to_hf("model.norm.weight", torch.ones(2))[0][0] == (
        "model.norm.weight"
    )
    with pytest.raises(FusedMappingError, match="one part of a fused"):
        A.convert_single_tensor_to_hf("model.layers.0.mlp.gate_proj.weight", torch.ones(2))


def test_shard_only_load_is_declined_and_the_full_load_is_used(hf_model, tmp_path):
    cls, _ = native_class_for(hf_model.config)
    assert cls.state_dict_adapter().supports_low_memory_dcp_load is False
    assert not shard_load.supports_shard_only_load(cls)
    hf_model.save_pretrained(tmp_path)
    assert shard_load.build_meta_native(tmp_path) is None


def test_per_key_load_targets_are_refused_with_the_reason(hf_model):
    model = AutoModelForCausalLM.from_config(hf_model.config)
    with pytest.raises(FusedMappingError, match="feed several parameters"):
        model.hf_load_targets()


def test_sharded_hf_checkpoint_loads_exactly(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    ref = A.from_hf(hf_model.state_dict(), hf_model.config)
    for key, tensor in model.state_dict().items():
        assert torch.equal(tensor, ref[key]), key
