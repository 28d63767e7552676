"""Trainer hooks: FSDP units, TP plan keys and refusals, and the FLOPs formula."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models import AutoModelForCausalLM
from models.hooks import (
    decoder_layers,
    from_hf_state_dict,
    model_flops_per_token,
    supports_tp,
    to_hf_tensors,
    tp_plan,
)
from trainer.assets import tiny_llama_config


@pytest.fixture(params=["native", "hf"])
def model(request):
    return AutoModelForCausalLM.from_config(tiny_llama_config(), force_hf=request.param == "hf")


def test_decoder_layers_are_the_blocks(model):
    layers = decoder_layers(model)
    assert layers == list(model.model.layers) and len(layers) == 2


def test_decoder_layers_under_peft(model):
    from peft import LoraConfig, get_peft_model

    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert [id(x) for x in decoder_layers(wrapped)] == [id(x) for x in model.model.layers]
    assert not supports_tp(wrapped)
    with pytest.raises(ValueError, match="LoRA-wrapped"):
        tp_plan(wrapped)


def test_tp_plan_covers_projections(model):
    plan = tp_plan(model, sequence_parallel=False)
    assert set(plan) == {
        f"model.layers.*.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")
    } | {f"model.layers.*.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")}
    sp_plan = tp_plan(model, sequence_parallel=True)
    assert {"model.embed_tokens", "lm_head", "model.norm"} <= set(sp_plan)


def test_supports_tp_checks_head_divisibility(model):
    assert supports_tp(model) and supports_tp(model, 2)
    assert not supports_tp(model, 3)  # 4 heads, 2 kv heads


def test_tp_refused_for_models_without_llama_layers():
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4)])

    assert not supports_tp(Plain())
    with pytest.raises(ValueError, match="not Llama-style"):
        tp_plan(Plain())
    with pytest.raises(ValueError, match="no `layers`"):
        decoder_layers(nn.Linear(2, 2))


def test_flops_formula_counts_matmul_params():
    config = tiny_llama_config()
    h, inter, v, layers, seq = 64, 128, 512, 2, 128
    attn = 2 * h * h + 2 * h * (h // 2)  # 4 heads of 16, 2 kv heads
    expected = 6 * (layers * (attn + 3 * h * inter) + h * v) + 12 * layers * 4 * 16 * seq
    assert model_flops_per_token(config, seq) == expected
    assert model_flops_per_token(config.to_dict(), seq) == expected


def test_flops_formula_counts_active_experts_only():
    dense = {
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "vocab_size": 512,
        "intermediate_size": 128,
    }
    moe = {**dense, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    base = model_flops_per_token(dense, 16) - 6 * 3 * 64 * 128
    assert model_flops_per_token(moe, 16) == base + 6 * (64 * 8 + 2 * 3 * 64 * 32)


def test_hf_name_mapping_hooks(model):
    weight = model.model.layers[0].mlp.up_proj.weight
    assert to_hf_tensors(model, "model.layers.0.mlp.up_proj.weight", weight) == [
        ("model.layers.0.mlp.up_proj.weight", weight)
    ]
    state = model.state_dict()
    assert from_hf_state_dict(model, state).keys() == state.keys()


def test_hf_name_mapping_hooks_split_and_stack_moe_experts():
    from tiny_model_configs import make_config

    moe = AutoModelForCausalLM.from_config(make_config("qwen3_moe"))
    grouped = moe.model.layers[0].mlp.experts.down_proj
    pairs = to_hf_tensors(moe, "model.layers.0.mlp.experts.down_proj", grouped)
    assert [n for n, _ in pairs][1] == "model.layers.0.mlp.experts.1.down_proj.weight"
    back = from_hf_state_dict(moe, dict(pairs))
    assert torch.equal(back["model.layers.0.mlp.experts.down_proj"], grouped)
