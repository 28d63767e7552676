"""DeepSeek-V3 state-dict adapter, point by point: router weight and correction bias mapped
separately (fp32), shared experts apart from routed ones, expert index order kept, no
reshapes (exact reversible round trip), missing or extra experts refused, write-through
load targets (correction-bias buffer included)."""

from __future__ import annotations

import random

import pytest
import torch
from _deepseek_v3_worker import seed_routers, tiny_config

from models import AutoModelForCausalLM
from models.common.moe.state_dict_adapter import ExpertMappingError
from models.deepseek_v3.state_dict_adapter import DeepseekV3StateDictAdapter as A

PROJ = ("gate_proj", "up_proj", "down_proj")


@pytest.fixture
def model():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(), dtype="bfloat16")
    seed_routers(model)
    return model


def test_expected_key_mapping(model):
    hf = A.to_hf(model.state_dict(), model.config)
    moe = {k for k in hf if k.startswith("model.layers.1.mlp.")}
    routed = {f"model.layers.1.mlp.experts.{e}.{p}.weight" for e in range(8) for p in PROJ}
    shared = {f"model.layers.1.mlp.shared_experts.{p}.weight" for p in PROJ}
    router = {"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias"}
    assert moe == routed | shared | router
    assert {k for k in hf if k.startswith("model.layers.0.mlp.")} == {
        f"model.layers.0.mlp.{p}.weight" for p in PROJ
    }  # first_k_dense_replace layers stay dense
    assert hf["model.layers.1.mlp.experts.5.down_proj.weight"].shape == (64, 32)
    assert hf["model.layers.1.mlp.gate.weight"].dtype is torch.float32
    assert hf["model.layers.1.mlp.gate.e_score_correction_bias"].dtype is torch.float32
    assert hf["model.layers.1.mlp.experts.0.up_proj.weight"].dtype is torch.bfloat16


def test_round_trip_is_exact_and_keeps_expert_order(model):
    native = model.state_dict()
    hf = A.to_hf(native, model.config)
    items = list(hf.items())
    random.Random(0).shuffle(items)  # the order of keys must not matter, indices must
    back = A.from_hf(dict(items), model.config)
    assert sorted(back) == sorted(native)
    for key, tensor in native.items():
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor), key
    grouped = native["model.layers.1.mlp.experts.gate_proj"]
    for e in range(8):
        assert torch.equal(hf[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"], grouped[e])
    bias = native["model.layers.1.mlp.gate.e_score_correction_bias"]
    assert torch.equal(hf["model.layers.1.mlp.gate.e_score_correction_bias"], bias)


def test_missing_or_extra_experts_are_refused(model):
    hf = A.to_hf(model.state_dict(), model.config)
    missing = {k: v for k, v in hf.items() if ".experts.7." not in k}
    with pytest.raises(ExpertMappingError, match=r"missing \[7\]"):
        A.from_hf(missing, model.config)
    extra = {**hf, "model.layers.1.mlp.experts.8.up_proj.weight": torch.zeros(32, 64)}
    with pytest.raises(ExpertMappingError, match="do not match"):
        A.from_hf(extra, model.config)
    with pytest.raises(ExpertMappingError, match="4 experts, config says 8"):
        A.to_hf({"model.layers.1.mlp.experts.up_proj": torch.zeros(4, 32, 64)}, model.config)


def test_load_targets_write_through_into_parameters_and_the_bias(model):
    targets = model.hf_load_targets()
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in targets
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in targets
    with torch.no_grad():
        for i, tensor in enumerate(targets.values()):
            tensor.fill_(float(i + 1))
    seen = {float(t.detach().flatten()[0]) for t in model.state_dict().values()}
    assert 0.0 not in seen
    bias = model.model.layers[1].mlp.gate.e_score_correction_bias
    assert float(bias[0]) == float(targets["model.layers.1.mlp.gate.e_score_correction_bias"][0])
    grouped = model.model.layers[1].mlp.experts.down_proj
    assert len({float(grouped[e].detach().flatten()[0]) for e in range(8)}) == 8
    assert not A.supports_low_memory_dcp_load  # the shard-only path fills no buffers
