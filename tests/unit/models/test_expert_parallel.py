"""Expert parallelism on 2 gloo ranks matches one process (logits, loss, every gradient).

Two plain Python processes run `_ep_worker.py`: the `models.hooks.apply_expert_parallel`
path alone, then the trainer's `parallelize` with `ep_size: 2` (experts spread, FSDP2 on
the rest, the trainer's loss scaling and gradient-norm clipping). The ranks feed batches
of different token counts. Single-process refusals are tested here too.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from gloo_cases import assert_cases_pass_on_two_ranks
from layouts import layout
from tiny_model_configs import make_config

from models import AutoModelForCausalLM
from models.hooks import ep_unsupported_reason

WORKER = Path(__file__).with_name("_ep_worker.py")
CASES = ["hooks", "trainer"]


def test_expert_parallel_matches_single_process(tmp_path):
    assert_cases_pass_on_two_ranks(WORKER, CASES, tmp_path)


def test_ep_reasons_name_the_problem():
    torch.manual_seed(0)
    moe = AutoModelForCausalLM.from_config(make_config("qwen3_moe", num_experts=4))
    assert ep_unsupported_reason(moe, 2) is None
    assert "not divisible by ep_size 3" in ep_unsupported_reason(moe, 3)
    dense = AutoModelForCausalLM.from_config(make_config("llama"))
    assert "no grouped experts" in ep_unsupported_reason(dense, 2)


@pytest.mark.parametrize(
    ("distributed", "world", "fix"),
    [
        ({"ep_size": 2, "tp_size": 2}, 4, "set distributed.ep_size: 1"),
        ({"ep_size": 4}, 6, "set distributed.ep_size to a divisor of 6 (2, 3, 6) or 1"),
        ({"ep_size": 2}, 1, "set distributed.ep_size: 1"),
    ],
)
def test_ep_not_dividing_the_dp_ranks_is_refused_at_submit(distributed, world, fix):
    from jobs.recipe.topology.trainer_support import check_trainer_support

    tp = int(distributed.get("tp_size", 1))
    section = {"strategy": "fsdp2", "dp_size": world // tp, **distributed}
    [error] = check_trainer_support({"distributed": section}, "cpu")
    assert error.loc == "distributed.ep_size" and "must divide dp_size" in error.msg
    assert error.fix == fix


@pytest.mark.parametrize("world", [2, 4, 8])
def test_ep_dividing_the_dp_ranks_is_valid_at_submit(world):
    from jobs.recipe.topology.trainer_support import check_trainer_support

    section = {"strategy": "fsdp2", "dp_size": world, "ep_size": 2}
    assert check_trainer_support({"distributed": section}, "cpu") == []


@pytest.mark.parametrize(
    ("family", "strategy", "message"),
    [
        ("qwen3_moe", "ddp", "needs strategy: fsdp2"),
        ("llama", "fsdp2", "ep_size: LlamaForCausalLM does not support it"),  # its row says so
    ],
)
def test_parallelize_refuses_ep_it_cannot_apply(family, strategy, message):
    from trainer.distributed import Topology
    from trainer.errors import TrainerError
    from trainer.parallelize import parallelize

    model = AutoModelForCausalLM.from_config(make_config(family))
    topology = Topology(mesh=None, dp_size=2, dp_rank=0, tp_size=1, ep_size=2)
    setup = replace(layout({"strategy": "fsdp2", "ep_size": 2}, 2), strategy=strategy)
    with pytest.raises(TrainerError, match=message):
        parallelize(model, topology, setup, torch.device("cpu"), None)
