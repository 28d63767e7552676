"""The grouped experts' state-dict adapter on a Qwen3-MoE model: key mapping, expert order,
reversibility, write-through load."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_model_configs import make_config

from models import AutoModelForCausalLM
from models.common.moe.state_dict_adapter import ExpertMappingError, GroupedExpertsStateDictAdapter

A = GroupedExpertsStateDictAdapter


@pytest.fixture
def model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(make_config("qwen3_moe"))


def test_expected_key_mapping(model):
    hf = A.to_hf(model.state_dict(), model.config)
    layer0 = {k for k in hf if k.startswith("model.layers.0.mlp.")}
    experts = {
        f"model.layers.0.mlp.experts.{e}.{p}.weight"
        for e in range(4)
        for p in ("gate_proj", "up_proj", "down_proj")
    }
    assert layer0 == experts | {"model.layers.0.mlp.gate.weight"}
    assert "model.layers.1.mlp.gate_proj.weight" in hf  # mlp_only_layers stay dense
    assert hf["model.layers.0.mlp.experts.2.down_proj.weight"].shape == (64, 32)


def test_round_trip_is_exact_and_keeps_expert_order(model):
    native = model.state_dict()
    hf = A.to_hf(native, model.config)
    items = list(hf.items())
    random.Random(0).shuffle(items)  # order of keys must not matter, indices must
    back = A.from_hf(dict(items), model.config)
    assert sorted(back) == sorted(native)
    for key, tensor in native.items():
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor), key
    experts = native["model.layers.0.mlp.experts.up_proj"]
    for e in range(4):
        assert torch.equal(hf[f"model.layers.0.mlp.experts.{e}.up_proj.weight"], experts[e])


def test_single_tensor_conversion_gives_views(model):
    grouped = model.model.layers[0].mlp.experts.gate_proj
    pairs = A.convert_single_tensor_to_hf("model.layers.0.mlp.experts.gate_proj", grouped)
    assert [k for k, _ in pairs] == [
        f"model.layers.0.mlp.experts.{e}.gate_proj.weight" for e in range(4)
    ]
    assert all(t.data_ptr() == grouped[e].data_ptr() for e, (_, t) in enumerate(pairs))
    assert A.convert_single_tensor_to_hf("model.norm.weight", grouped) == [
        ("model.norm.weight", grouped)
    ]


def test_missing_or_extra_experts_are_refused(model):
    hf = A.to_hf(model.state_dict(), model.config)
    missing = {k: v for k, v in hf.items() if ".experts.3." not in k}
    with pytest.raises(ExpertMappingError, match=r"missing \[3\]"):
        A.from_hf(missing, model.config)
    extra = {**hf, "model.layers.0.mlp.experts.4.up_proj.weight": torch.zeros(32, 64)}
    with pytest.raises(ExpertMappingError, match="do not match"):
        A.from_hf(extra, model.config)
    wrong = {"model.layers.0.mlp.experts.up_proj": torch.zeros(3, 32, 64)}
    with pytest.raises(ExpertMappingError, match="3 experts"):
        A.to_hf(wrong, model.config)


def test_load_targets_write_straight_into_parameters(model):
    """Sentinel writes through every target reach the model's own storage."""
    targets = model.hf_load_targets()
    assert A.supports_low_memory_load(model)
    with torch.no_grad():
        for i, tensor in enumerate(targets.values()):
            tensor.fill_(float(i + 1))
    seen = {float(p.detach().flatten()[0]) for p in model.parameters()}
    assert 0.0 not in seen
    grouped = model.model.layers[0].mlp.experts.down_proj
    assert len({float(grouped[e].flatten()[0]) for e in range(4)}) == 4


def test_sharded_parameters_disable_low_memory_load(model):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        experts = model.model.layers[0].mlp.experts
        experts.up_proj = torch.nn.Parameter(distribute_tensor(experts.up_proj.data, mesh))
        assert not A.supports_low_memory_load(model)
    finally:
        dist.destroy_process_group()
