"""Qwen3's plan: the dense plan plus q/k norms run as SequenceParallel over the heads dim.

That the weight gradients of those norms then match one process is checked on two gloo
ranks in test_tp_plan.py (`trainer_tp:qwen3:*`).
"""

from __future__ import annotations

import pytest
import torch
from tiny_model_configs import make_config
from torch.distributed.tensor.parallel import SequenceParallel

from models import AutoModelForCausalLM, hooks
from models.common.parallelize import DENSE_PLAN
from models.qwen3.parallelize import QWEN3_PLAN, Qwen3ParallelPlan

NORMS = {"model.layers.*.self_attn.q_norm", "model.layers.*.self_attn.k_norm"}


@pytest.fixture(params=["native", "hf"])
def qwen3(request):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(make_config("qwen3"), force_hf=request.param == "hf")


def test_native_and_hugging_face_qwen3_get_qwen3s_plan(qwen3):
    assert hooks.parallel_plan(qwen3) is QWEN3_PLAN
    assert QWEN3_PLAN.tp_unsupported_reason(qwen3, 2) is None


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_qk_norms_are_sharded_over_the_heads_dim(qwen3, sequence_parallel):
    plan = QWEN3_PLAN.tp_plan(qwen3, sequence_parallel)
    assert set(plan) >= NORMS
    for key in NORMS:
        style = plan[key]
        assert isinstance(style, SequenceParallel)
        assert style.sequence_sharding[0].dim == 2 and style.use_local_output
    dense = set(DENSE_PLAN.tp_plan(AutoModelForCausalLM.from_config(make_config("llama"))))
    assert set(QWEN3_PLAN.tp_plan(qwen3)) - NORMS == dense


def test_qwen3_moe_extends_qwen3s_plan():
    from models.qwen3_moe.parallelize import QWEN3_MOE_PLAN

    assert isinstance(QWEN3_MOE_PLAN, Qwen3ParallelPlan)
    all_dense = AutoModelForCausalLM.from_config(make_config("qwen3_moe", mlp_only_layers=[0, 1]))
    assert set(QWEN3_MOE_PLAN.tp_plan(all_dense)) >= NORMS
