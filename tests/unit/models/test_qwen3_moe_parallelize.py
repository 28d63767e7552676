"""Qwen3-MoE's plan: experts found by type, EP refusals, sharding on a one-rank mesh."""

from __future__ import annotations

import pytest
import torch
from tiny_model_configs import make_config
from torch import nn
from torch.distributed.tensor import DTensor

from models import AutoModelForCausalLM, hooks
from models.common.moe.layers import GroupedExperts
from models.common.moe.parallelize import grouped_experts
from models.qwen3_moe.parallelize import QWEN3_MOE_PLAN, Qwen3MoeParallelPlan


def moe(**overrides) -> nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(make_config("qwen3_moe", **overrides))


def test_native_qwen3_moe_gets_its_family_plan():
    assert isinstance(hooks.parallel_plan(moe()), Qwen3MoeParallelPlan)


def test_experts_are_found_by_type_not_by_method():
    model = moe()  # layer 0 sparse, layer 1 dense (mlp_only_layers)
    assert grouped_experts(model) == [model.model.layers[0].mlp.experts]

    class LooksLikeExperts(nn.Module):
        num_experts = 4

        def shard_experts(self, mesh):  # the method alone does not make it experts
            raise AssertionError("not experts")

    model.model.layers[1].mlp.extra = LooksLikeExperts()
    assert all(isinstance(m, GroupedExperts) for m in grouped_experts(model))


def test_ep_refusals_name_the_problem():
    assert QWEN3_MOE_PLAN.ep_unsupported_reason(moe(), 2) is None
    assert "not divisible by ep_size 3" in QWEN3_MOE_PLAN.ep_unsupported_reason(moe(), 3)
    all_dense = moe(mlp_only_layers=[0, 1])
    assert "no grouped experts" in QWEN3_MOE_PLAN.ep_unsupported_reason(all_dense, 2)


def test_apply_expert_parallel_shards_every_expert_tensor():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    model = moe(mlp_only_layers=[])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        params = QWEN3_MOE_PLAN.apply_expert_parallel(model, init_device_mesh("cpu", (1,)))
    finally:
        dist.destroy_process_group()
    assert len(params) == 2 * 3  # two sparse layers x gate/up/down
    assert all(isinstance(p, DTensor) and p.to_local().shape[0] == 4 for p in params)
    with pytest.raises(ValueError, match="not divisible"):
        QWEN3_MOE_PLAN.apply_expert_parallel(moe(), type("Mesh", (), {"size": lambda s: 3})())
