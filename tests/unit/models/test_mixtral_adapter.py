"""Mixtral state-dict adapter: checkpoint key names, expert order, reversibility, loading.

Native `mlp.gate` / `mlp.experts.{gate,up,down}_proj[e]` must map onto Mixtral's
`block_sparse_moe.gate` / `block_sparse_moe.experts.{e}.{w1,w3,w2}` exactly (w1 gate, w3 up,
w2 down), keep expert e at index e, round-trip bit for bit whatever the key order, refuse
missing or extra experts, and load by writing straight into the grouped parameters.
"""

from __future__ import annotations

import random

import pytest
import torch
from mistral_family_configs import mixtral_config

from models import AutoModelForCausalLM
from models.common.moe.state_dict_adapter import ExpertMappingError
from models.mixtral.state_dict_adapter import (
    MixtralStateDictAdapter,
    hf_key_to_native,
    native_key_to_hf,
)

A = MixtralStateDictAdapter


@pytest.fixture
def model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(mixtral_config())


def test_expected_key_mapping(model):
    hf = A.to_hf(model.state_dict(), model.config)
    layer0 = {k for k in hf if ".layers.0." in k and "_layernorm" not in k and "attn" not in k}
    experts = {
        f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight"
        for e in range(4)
        for w in ("w1", "w2", "w3")
    }
    assert layer0 == experts | {"model.layers.0.block_sparse_moe.gate.weight"}
    assert not any(".mlp." in k for k in hf)
    grouped = model.model.layers[0].mlp.experts
    for native_name, hf_name in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
        tensor = hf[f"model.layers.0.block_sparse_moe.experts.2.{hf_name}.weight"]
        assert torch.equal(tensor, getattr(grouped, native_name)[2]), native_name
    assert hf["model.layers.0.block_sparse_moe.experts.1.w2.weight"].shape == (64, 48)


def test_key_renames_are_inverse():
    keys = [
        "model.layers.3.mlp.gate.weight",
        "model.layers.3.mlp.experts.7.down_proj.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "lm_head.weight",
    ]
    for key in keys:
        assert hf_key_to_native(native_key_to_hf(key)) == key
    assert native_key_to_hf(keys[1]) == "model.layers.3.block_sparse_moe.experts.7.w2.weight"


def test_round_trip_is_exact_and_keeps_expert_order(model):
    native = model.state_dict()
    items = list(A.to_hf(native, model.config).items())
    random.Random(0).shuffle(items)  # order of keys must not matter, indices must
    back = A.from_hf(dict(items), model.config)
    assert sorted(back) == sorted(native)
    for key, tensor in native.items():
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor), key


def test_single_tensor_conversion_gives_views(model):
    grouped = model.model.layers[1].mlp.experts.up_proj
    pairs = A.convert_single_tensor_to_hf("model.layers.1.mlp.experts.up_proj", grouped)
    assert [k for k, _ in pairs] == [
        f"model.layers.1.block_sparse_moe.experts.{e}.w3.weight" for e in range(4)
    ]
    assert all(t.data_ptr() == grouped[e].data_ptr() for e, (_, t) in enumerate(pairs))
    gate = model.model.layers[1].mlp.gate.weight
    assert A.convert_single_tensor_to_hf("model.layers.1.mlp.gate.weight", gate) == [
        ("model.layers.1.block_sparse_moe.gate.weight", gate)
    ]


def test_missing_or_extra_experts_are_refused(model):
    hf = A.to_hf(model.state_dict(), model.config)
    missing = {k: v for k, v in hf.items() if ".experts.3." not in k}
    with pytest.raises(ExpertMappingError, match=r"missing \[3\]"):
        A.from_hf(missing, model.config)
    extra = {**hf, "model.layers.0.block_sparse_moe.experts.4.w1.weight": torch.zeros(48, 64)}
    with pytest.raises(ExpertMappingError, match="do not match"):
        A.from_hf(extra, model.config)


def test_load_targets_write_straight_into_parameters(model):
    targets = model.hf_load_targets()
    assert "model.layers.0.block_sparse_moe.experts.0.w1.weight" in targets
    with torch.no_grad():
        for i, tensor in enumerate(targets.values()):
            tensor.fill_(float(i + 1))
    assert 0.0 not in {float(p.detach().flatten()[0]) for p in model.parameters()}
    grouped = model.model.layers[0].mlp.experts.down_proj
    assert len({float(grouped.detach()[e].flatten()[0]) for e in range(4)}) == 4
