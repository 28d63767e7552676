"""trainer.pipeline without ranks: the recipe's schedule names resolve to torch's schedule
classes of the right kind, stages are placed round-robin over pp ranks, and a split the
model cannot take is a data error naming the field. The gradient norm over stages is
checked on a one-process group against the plain norm."""

from __future__ import annotations

import typing

import pytest
import torch
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

from jobs.recipe.topology.pipeline import LOOPED_SCHEDULES, SINGLE_STAGE_SCHEDULES
from jobs.recipe.topology.setup import PipelineConfig
from trainer.errors import TrainerError
from trainer.pipeline import clip_stage_grad_norm, stage_layout


def test_every_schedule_the_rules_accept_is_a_torch_schedule_of_its_kind():
    declared = set(typing.get_args(typing.get_type_hints(PipelineConfig)["pp_schedule"]))
    assert set(SINGLE_STAGE_SCHEDULES + LOOPED_SCHEDULES) < declared
    for name in SINGLE_STAGE_SCHEDULES:
        assert issubclass(get_schedule_class(name), PipelineScheduleSingle), name
    for name in LOOPED_SCHEDULES:
        assert not issubclass(get_schedule_class(name), PipelineScheduleSingle), name


def test_single_stage_schedules_give_each_rank_one_contiguous_stage():
    assert stage_layout("1f1b", 2, 0, 4, {}) == (2, [0], [range(0, 2), range(2, 4)])
    assert stage_layout("gpipe", 2, 1, 5, {})[1:] == ([1], [range(0, 3), range(3, 5)])


def test_looped_schedules_place_virtual_stages_round_robin():
    num_stages, mine, ranges = stage_layout("interleaved1f1b", 2, 1, 4, {})
    assert num_stages == 4 and mine == [1, 3] and ranges[3] == range(3, 4)
    assert stage_layout("loopedbfs", 2, 0, 6, {"layers_per_stage": 1})[:2] == (6, [0, 2, 4])


def test_a_split_the_model_cannot_take_is_a_data_error():
    with pytest.raises(TrainerError, match="layers_per_stage"):
        stage_layout("interleaved1f1b", 2, 0, 2, {})  # 4 stages, 2 layers


def test_stage_grad_norm_on_one_rank_is_the_plain_norm_and_clips(single_rank_group):
    import torch.distributed as dist

    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    params[0].grad = torch.tensor([3.0, 0.0, 0.0])
    params[1].grad = torch.tensor([0.0, 4.0])
    assert clip_stage_grad_norm(params, None, dist.group.WORLD) == pytest.approx(5.0)
    assert clip_stage_grad_norm(params, 1.0, dist.group.WORLD) == pytest.approx(5.0)
    clipped = torch.cat([p.grad for p in params]).norm()
    assert float(clipped) == pytest.approx(1.0, rel=1e-5)


def _tiny_qwen3_moe(**overrides):
    import sys
    from pathlib import Path

    from models import AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
    from tiny_model_configs import make_config

    config = make_config("qwen3_moe", num_experts=4, **overrides)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def test_stages_refuse_the_router_aux_loss_and_experts_beyond_a_stage_s_ranks():
    """The guards behind the submit rules (jobs.recipe.topology.pipeline): the
    load-balancing loss needs every stage's router logits; experts spread only over a pp
    rank's data-parallel x context-parallel ranks."""
    from types import SimpleNamespace

    from models import hooks
    from trainer.distributed import Topology
    from trainer.pipeline import _stage_refusal

    model = _tiny_qwen3_moe()
    plan = hooks.parallel_plan(model)
    mesh = SimpleNamespace(mesh_dim_names=("pp", "dp_shard", "tp"))

    def topology(dp: int, ep: int, tp: int = 1) -> Topology:
        return Topology(mesh, dp_size=dp, dp_rank=0, tp_size=tp, ep_size=ep, pp_size=2)

    assert _stage_refusal(model, plan, topology(dp=2, ep=2)) is None
    assert "must divide dp_size x cp_size (2)" in _stage_refusal(model, plan, topology(2, 4))
    assert "tp and dp_replicate sizes 1" in _stage_refusal(model, plan, topology(2, 2, tp=2))
    assert "not divisible by ep_size 3" in _stage_refusal(model, plan, topology(3, 3))
    model.config.output_router_logits = True
    reason = _stage_refusal(model, plan, topology(dp=1, ep=1))
    assert reason.startswith("model.output_router_logits:") and "pp_size: 1" in reason
