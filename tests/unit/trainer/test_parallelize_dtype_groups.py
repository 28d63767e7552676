"""FSDP2 groups of one dtype (`trainer.parallelize.dtype_groups`): a bf16 model whose family
keeps some parameters fp32 (routers, gpt-oss's attention sinks) is sharded with those
parameters in groups of their own, and trains like the unsharded model.

FSDP2 refuses a group whose trainable parameters mix dtypes ("FSDP expects uniform
original parameter dtype"), so before this split no bf16 MoE model could run under FSDP2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from trainer.parallelize import dtype_groups

# the tiny MoE configs the model tests share
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))


def _moe(family: str, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    from models import AutoModelForCausalLM

    torch.manual_seed(0)
    if family == "gpt_oss":
        from gpt_oss_tiny import tiny_config

        return AutoModelForCausalLM.from_config(tiny_config(), dtype=dtype)
    from tiny_model_configs import make_config

    config = make_config("qwen3_moe", mlp_only_layers=[], num_experts=4)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _names(model: nn.Module, groups: list) -> list:
    names = {id(m): n for n, m in model.named_modules()}
    return [[names[id(m)] for m in g] if isinstance(g, list) else names[id(g)] for g in groups]


def test_a_bf16_router_is_a_group_of_its_own() -> None:
    model = _moe("qwen3_moe")
    layer = model.model.layers[0]
    assert _names(model, dtype_groups(layer, set())) == ["model.layers.0.mlp.gate"]
    assert dtype_groups(_moe("qwen3_moe", torch.float32).model.layers[0], set()) == []


def test_the_router_not_its_block_when_the_experts_are_left_out() -> None:
    """With expert parallelism the experts are not FSDP2's (ignored): the router alone, not
    the MoE block around it, becomes the group (the smallest module holding it)."""
    model = _moe("qwen3_moe")
    experts = set(model.model.layers[0].mlp.experts.parameters())
    assert _names(model, dtype_groups(model.model.layers[0], experts)) == [
        "model.layers.0.mlp.gate"
    ]


def test_gpt_oss_sinks_take_their_attention_module_and_its_projections_group_together() -> None:
    """The fp32 sinks are the attention module's own parameter, so that module is their
    group and its bf16 projections leave it as one group (one all-gather, not four)."""
    model = _moe("gpt_oss")
    attn = "model.layers.0.self_attn"
    assert _names(model, dtype_groups(model.model.layers[0], set())) == [
        [f"{attn}.{p}_proj" for p in "qkvo"],
        "model.layers.0.mlp.router",
        attn,
    ]


def test_frozen_parameters_do_not_count() -> None:
    model = _moe("qwen3_moe")
    layer = model.model.layers[0]
    layer.mlp.gate.weight.requires_grad_(False)
    assert dtype_groups(layer, set()) == []


def test_a_module_holding_two_dtypes_itself_is_refused() -> None:
    from trainer.errors import TrainerError

    module = nn.Module()
    module.a = nn.Parameter(torch.zeros(2))
    module.b = nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    with pytest.raises(TrainerError, match="holds trainable parameters of dtypes"):
        dtype_groups(module, set())


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_bf16_moe_under_fsdp2_trains_like_the_unsharded_model(
    family, single_rank_group, one_rank_layout
) -> None:
    """One rank: FSDP2's gathers and reductions are copies, so the bf16 gradients (fp32 for
    the kept parameters) equal the unsharded model's bit for bit."""
    from torch.distributed.tensor import DTensor

    from trainer.distributed import build_mesh
    from trainer.parallelize import parallelize

    reference, model = _moe(family), _moe(family)
    layout = one_rank_layout(activation_checkpointing=True)
    sharded = parallelize(
        model, build_mesh(single_rank_group, layout), layout, torch.device("cpu"), None
    )
    ids = torch.randint(1, 128, (2, 12))
    reference(input_ids=ids, labels=ids).loss.backward()
    sharded(input_ids=ids, labels=ids).loss.backward()
    grads = {n: p.grad for n, p in reference.named_parameters()}
    for name, param in model.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        name = name.replace("_checkpoint_wrapped_module.", "")
        assert grad.dtype == grads[name].dtype and torch.equal(grad, grads[name]), name
