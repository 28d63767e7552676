"""Sharding: gradient clipping across meshes, the mixed-precision policy per device, and
every family decision taken from the plan the model's registry row names.

A plugin row (a class, a plan) is registered the way a new model would be; the trainer,
unedited, must shard and refuse exactly as that plan says.
"""

from __future__ import annotations

import pytest
import torch
from plugin_family import PluginLlama, registered_plugin
from torch import nn

from cli.demo_assets import tiny_llama_config
from trainer.parallelize import clip_grad_norm


def test_clip_grad_norm_matches_torch() -> None:
    params = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn(4, 4) * 10
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for c, p in zip(copies, params, strict=True):
        c.grad = p.grad.clone()
    expected = torch.nn.utils.clip_grad_norm_(copies, 1.0)
    assert clip_grad_norm(params, 1.0) == pytest.approx(float(expected), rel=1e-6)
    for c, p in zip(copies, params, strict=True):
        torch.testing.assert_close(p.grad, c.grad)


def test_mixed_precision_policy_applies_on_cuda_only() -> None:
    from jobs.recipe.typed import MixedPrecision
    from trainer.parallelize import _mp_policy

    config = MixedPrecision("bfloat16", "float32", None, cast_forward_inputs=True)
    assert _mp_policy(config, torch.device("cpu")).param_dtype is None
    policy = _mp_policy(config, torch.device("cuda", 0))
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
    # megatron_fsdp's grad_reduce_in_fp32: compute in the parameters' dtype, reduce in fp32
    reduce_only = MixedPrecision(None, "float32", None, cast_forward_inputs=True)
    policy = _mp_policy(reduce_only, torch.device("cuda", 0))
    assert policy.param_dtype is None and policy.reduce_dtype == torch.float32


@pytest.fixture
def plugin_row():
    with registered_plugin() as entry:
        yield entry


def test_fsdp_units_come_from_the_rows_plan(plugin_row, single_rank_group, one_rank_layout):
    from torch.distributed.fsdp import FSDPModule

    from trainer.distributed import build_mesh
    from trainer.parallelize import parallelize

    model = PluginLlama(tiny_llama_config())
    layout = one_rank_layout(activation_checkpointing=True)
    parallelize(model, build_mesh(single_rank_group, layout), layout, torch.device("cpu"), None)
    first, second = model.model.layers
    assert isinstance(first, FSDPModule) and not isinstance(second, FSDPModule)
    assert isinstance(model, FSDPModule)
    ids = torch.randint(1, 512, (1, 8))
    model(input_ids=ids, labels=ids).loss.backward()


def test_tp_refusal_comes_from_the_rows_plan(plugin_row, one_rank_layout):
    from trainer.distributed import Topology
    from trainer.errors import TrainerError
    from trainer.parallelize import parallelize

    model = PluginLlama(tiny_llama_config())
    topology = Topology(mesh=None, dp_size=1, dp_rank=0, tp_size=2)
    with pytest.raises(TrainerError, match="plugin plan has no tensor-parallel layout"):
        parallelize(model, topology, one_rank_layout(tp_size=2), torch.device("cpu"), None)


@pytest.mark.parametrize(
    ("field", "sizes"),
    [
        ("tp_size", {"tp_size": 2}),
        ("cp_size", {"cp_size": 2}),
        ("ep_size", {"ep_size": 2}),
        ("pp_size", {"pp_size": 2}),
        ("sequence_parallel", {"sequence_parallel": True}),
    ],
)
def test_the_trainer_refuses_what_the_row_does_not_support(field, sizes, one_rank_layout):
    """The row validation read is the one the trainer checks: a plugin row claiming nothing
    is refused every split, before any plan is asked (the plan could shard a Llama)."""
    import dataclasses

    from models import registry
    from trainer.distributed import Topology
    from trainer.errors import TrainerError
    from trainer.parallelize import parallelize

    with registered_plugin() as entry:
        registry.register(
            dataclasses.replace(entry, capabilities=registry.ModelCapabilities()), replace=True
        )
        model = PluginLlama(tiny_llama_config())
        topology = Topology(mesh=None, dp_size=1, dp_rank=0, tp_size=1)
        with pytest.raises(TrainerError, match=f"distributed.{field}: PluginLlama does not"):
            parallelize(model, topology, one_rank_layout(**sizes), torch.device("cpu"), None)


def test_a_model_without_decoder_layers_is_refused_as_a_user_error(
    single_rank_group, one_rank_layout
):
    from trainer.distributed import build_mesh
    from trainer.errors import TrainerError
    from trainer.parallelize import parallelize

    layout = one_rank_layout()
    topology = build_mesh(single_rank_group, layout)
    with pytest.raises(TrainerError, match="no `layers` ModuleList"):
        parallelize(nn.Linear(2, 2), topology, layout, torch.device("cpu"), None)


@pytest.mark.parametrize("tied", [False, True])
def test_untied_embedding_and_head_are_fsdp_units_of_their_own(
    tied, single_rank_group, one_rank_layout
):
    """Untied, the vocabulary-sized ends are their own units (the root gathers neither for
    the whole step); tied, the one shared weight stays in the root. Training runs."""
    from torch.distributed.fsdp import FSDPModule

    from models.auto import AutoModelForCausalLM
    from trainer.distributed import build_mesh
    from trainer.parallelize import parallelize

    model = AutoModelForCausalLM.from_config(tiny_llama_config(tie_word_embeddings=tied))
    layout = one_rank_layout()
    parallelize(model, build_mesh(single_rank_group, layout), layout, torch.device("cpu"), None)
    ends = (model.get_input_embeddings(), model.get_output_embeddings())
    assert [isinstance(m, FSDPModule) for m in ends] == [not tied, not tied]
    assert isinstance(model, FSDPModule)
    ids = torch.randint(1, 512, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def _peft(model: nn.Module, targets: list[str]) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=2, target_modules=targets))


def test_lora_with_tp_is_refused_outside_the_common_dense_plan() -> None:
    """Validation refuses it for such families; the trainer guards the same."""
    from types import SimpleNamespace

    from models import AutoModelForCausalLM, hooks
    from trainer.errors import TrainerError
    from trainer.parallelize import apply_tensor_parallel

    config = tiny_llama_config()
    model = _peft(AutoModelForCausalLM.from_config(config), ["q_proj"])
    own_plan = type("FamilyPlan", (type(hooks.parallel_plan(model)),), {})()
    with pytest.raises(TrainerError, match="FamilyPlan shards its own way"):
        apply_tensor_parallel(model, own_plan, SimpleNamespace(tp_size=2), False)
    head = _peft(AutoModelForCausalLM.from_config(config), ["q_proj", "lm_head"])
    with pytest.raises(TrainerError, match="LoRA on base_model.model.lm_head"):
        apply_tensor_parallel(head, hooks.parallel_plan(head), SimpleNamespace(tp_size=2), True)
