"""Trainer hooks: the row lookup by type, FSDP units, TP plan keys and refusals, adapters."""

from __future__ import annotations

import pytest
import torch
from plugin_family import PLUGIN_PLAN, PluginLlama, registered_plugin
from torch import nn

from cli.demo_assets import tiny_llama_config
from models import AutoModelForCausalLM, registry
from models.hooks import (
    decoder_layers,
    from_hf_state_dict,
    has_state_dict_adapter,
    native_entry,
    parallel_plan,
    supports_tp,
    to_hf_tensors,
    tp_plan,
)
from models.llama.model import LlamaForCausalLM


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
    assert supports_tp(wrapped)  # the dense plan places the adapters beside their base
    plan = tp_plan(wrapped)
    q = "base_model.model.model.layers.*.self_attn.q_proj"
    assert {f"{q}.base_layer", f"{q}.lora_A.default", f"{q}.lora_B.default"} <= set(plan)
    assert q not in plan


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


@pytest.fixture
def plugin_row():
    with registered_plugin() as entry:
        yield entry


def test_the_row_is_the_nearest_registered_class(plugin_row):
    plugin = PluginLlama(tiny_llama_config())
    assert native_entry(plugin) is plugin_row
    assert parallel_plan(plugin) is PLUGIN_PLAN
    assert decoder_layers(plugin) == [plugin.model.layers[0]]
    assert has_state_dict_adapter(plugin)
    llama = AutoModelForCausalLM.from_config(tiny_llama_config())
    assert native_entry(llama) is registry.get_entry("LlamaForCausalLM")


def test_hugging_face_classes_have_no_row_and_no_adapter():
    from tiny_model_configs import make_config

    hf_moe = AutoModelForCausalLM.from_config(make_config("qwen3_moe"), force_hf=True)
    assert native_entry(hf_moe) is None and not has_state_dict_adapter(hf_moe)
    native_moe = AutoModelForCausalLM.from_config(make_config("qwen3_moe"))
    assert has_state_dict_adapter(native_moe)


def test_the_row_is_found_through_the_fsdp2_class_swap():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = AutoModelForCausalLM.from_config(tiny_llama_config())
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    finally:
        dist.destroy_process_group()
    assert type(model) is not LlamaForCausalLM
    assert native_entry(model) is registry.get_entry("LlamaForCausalLM")
