"""The common dense plan, and every registered family resolving the plan its row names."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from tiny_model_configs import COMMON, make_config
from torch import nn

from models import AutoModelForCausalLM, hooks, registry
from models.common.parallelize import DENSE_PLAN, ParallelPlan, lora_on_sequence_parallel_ends

FAMILY_CONFIG = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                 "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe"}  # fmt: skip
ROWS = [registry.get_entry(name) for name in sorted(FAMILY_CONFIG)]


def tiny(architecture: str, **overrides) -> nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(make_config(FAMILY_CONFIG[architecture], **overrides))


@pytest.mark.parametrize("entry", ROWS, ids=lambda e: e.family)
def test_each_family_resolves_the_plan_its_row_names(entry):
    plan = registry.load_parallel_plan(entry)
    assert isinstance(plan, ParallelPlan)
    model = tiny(entry.architecture)
    assert model.tuneyard_backend == "native"
    assert hooks.parallel_plan(model) is plan
    assert plan.fsdp_units(model) == list(model.model.layers)
    assert plan.decoder_layer_list(model) is model.model.layers


@pytest.mark.parametrize("entry", registry.registered_architectures(), ids=lambda e: e.family)
def test_a_family_folder_has_a_parallelize_module_only_when_its_plan_differs(entry):
    own_module = f"models.{entry.family}.parallelize"
    has_own = importlib.util.find_spec(own_module) is not None
    if entry.parallel_plan == registry.DENSE_PARALLEL_PLAN:
        assert not has_own, f"{own_module} exists but the row uses the common dense plan"
        return
    assert entry.parallel_plan.startswith(f"{own_module}:")
    plan = registry.load_parallel_plan(entry)
    own = [c for c in type(plan).__mro__ if c not in (ParallelPlan, object)]  # mixins too
    overridden = [n for c in own for n in vars(c) if callable(getattr(ParallelPlan, n, None))]
    assert type(plan) is not ParallelPlan and overridden, "a family plan overrides something"


@pytest.mark.parametrize("entry", ROWS, ids=lambda e: e.family)
def test_the_row_claims_tp_and_ep_exactly_where_its_plan_applies(entry):
    model, caps = tiny(entry.architecture), entry.capabilities
    plan = registry.load_parallel_plan(entry)
    assert (plan.tp_unsupported_reason(model, 2) is None) == caps.supports_tp
    assert (plan.ep_unsupported_reason(model, 2) is None) == caps.supports_ep


@pytest.mark.parametrize("entry", ROWS, ids=lambda e: e.family)
def test_hugging_face_classes_get_their_family_plan(entry):
    config = make_config(FAMILY_CONFIG[entry.architecture])
    model = AutoModelForCausalLM.from_config(config, force_hf=True)
    assert model.tuneyard_backend == "hf"
    assert hooks.parallel_plan(model) is registry.load_parallel_plan(entry)


def test_unregistered_architectures_get_the_dense_plan():
    import transformers

    config = transformers.GraniteConfig(**COMMON)  # Llama-style names, not in the registry
    model = AutoModelForCausalLM.from_config(config)
    assert model.tuneyard_backend == "hf" and hooks.parallel_plan(model) is DENSE_PLAN
    assert hooks.tp_unsupported_reason(model, 2) is None


def test_dense_plan_refuses_per_head_qk_norms_it_does_not_shard():
    assert "per-head q/k norms" in DENSE_PLAN.tp_unsupported_reason(tiny("Qwen3ForCausalLM"), 2)


def test_the_plan_is_found_through_peft():
    from peft import LoraConfig, get_peft_model

    model = tiny("Qwen3MoeForCausalLM")
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    moe_row = registry.get_entry("Qwen3MoeForCausalLM")
    assert hooks.parallel_plan(wrapped) is registry.load_parallel_plan(moe_row)
    assert hooks.decoder_layers(wrapped) == list(model.model.layers)


def test_dense_plan_refuses_expert_parallelism():
    model = tiny("LlamaForCausalLM")
    assert "no grouped experts" in DENSE_PLAN.ep_unsupported_reason(model, 2)
    mesh = type("Mesh", (), {"size": lambda self: 2})()
    with pytest.raises(ValueError, match="expert parallelism unavailable"):
        DENSE_PLAN.apply_expert_parallel(model, mesh)


def test_sequence_parallel_plan_keeps_tied_embeddings_replicated():
    from torch.distributed.tensor.parallel import PrepareModuleOutput, RowwiseParallel

    tied = DENSE_PLAN.tp_plan(tiny("Qwen2ForCausalLM", tie_word_embeddings=True), True)
    untied = DENSE_PLAN.tp_plan(tiny("Qwen2ForCausalLM", tie_word_embeddings=False), True)
    assert isinstance(tied["model.embed_tokens"], PrepareModuleOutput)
    assert isinstance(untied["model.embed_tokens"], RowwiseParallel)
    assert list(tied) == list(untied)


def test_plan_keys_follow_a_wrapper_prefix():
    from peft import LoraConfig, get_peft_model

    model = tiny("Qwen3ForCausalLM")
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["lm_head"]))
    keys = hooks.tp_plan(wrapped)
    assert "base_model.model.model.layers.*.self_attn.q_proj" in keys
    assert "base_model.model.model.layers.*.self_attn.q_norm" in keys


def test_layers_without_llama_projections_are_refused():
    moe = tiny("Qwen3MoeForCausalLM")  # layer 0 is sparse
    assert "not Llama-style" in hooks.tp_unsupported_reason(moe)
    all_dense = tiny("Qwen3MoeForCausalLM", mlp_only_layers=[0, 1])
    assert hooks.tp_unsupported_reason(all_dense, 2) is None
    with pytest.raises(ValueError, match="no `layers` ModuleList"):
        DENSE_PLAN.decoder_layer_list(nn.Linear(2, 2))


def _lora(model: nn.Module, **config) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    projections = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return get_peft_model(model, LoraConfig(r=2, **{"target_modules": projections, **config}))


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_lora_pieces_follow_their_base_projection(sequence_parallel):
    """Colwise bases get lora_A whole and lora_B colwise; rowwise bases lora_A rowwise and
    lora_B whole (on sequence shards under sequence parallelism)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    wrapped = _lora(tiny("LlamaForCausalLM"))
    plan = DENSE_PLAN.tp_plan(wrapped, sequence_parallel)
    layer = "base_model.model.model.layers.*"
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.up_proj"):
        assert f"{layer}.{name}" not in plan
        assert isinstance(plan[f"{layer}.{name}.base_layer"], ColwiseParallel)
        assert isinstance(plan[f"{layer}.{name}.lora_B.default"], ColwiseParallel)
        assert type(plan[f"{layer}.{name}.lora_A.default"]).__name__ == "ReplicatedLinear"
    for name in ("self_attn.o_proj", "mlp.down_proj"):
        base, lora_a = plan[f"{layer}.{name}.base_layer"], plan[f"{layer}.{name}.lora_A.default"]
        assert isinstance(base, RowwiseParallel) and isinstance(lora_a, RowwiseParallel)
        assert lora_a.output_layouts == base.output_layouts
        assert base.output_layouts == ((Shard(1),) if sequence_parallel else base.output_layouts)
        assert type(plan[f"{layer}.{name}.lora_B.default"]).__name__ == "ReplicatedLinear"


def test_lora_the_plan_cannot_place_is_refused():
    dora = _lora(tiny("LlamaForCausalLM"), use_dora=True)
    assert "no DoRA" in DENSE_PLAN.tp_unsupported_reason(dora, 2)
    head = _lora(tiny("LlamaForCausalLM"), target_modules=["q_proj", "lm_head"])
    assert DENSE_PLAN.tp_unsupported_reason(head, 2) is None  # lm_head stays whole without SP
    assert lora_on_sequence_parallel_ends(head) == ["base_model.model.lm_head"]
    uneven = _lora(tiny("LlamaForCausalLM"), target_modules=["q_proj"], layers_to_transform=[0])
    assert "different decoder layers" in DENSE_PLAN.tp_unsupported_reason(uneven, 2)
    assert DENSE_PLAN.tp_unsupported_reason(_lora(tiny("LlamaForCausalLM")), 2) is None
