"""gpt-oss expert parallelism on 2 gloo ranks matches one process; the plan's refusals.

Two plain Python processes run `_gpt_oss_worker.py`: `models.hooks.apply_expert_parallel`
alone, then the trainer's `parallelize` with `ep_size: 2` (experts spread, FSDP2 on the
rest). Logits, the summed loss, every gradient (expert weights and biases, router, sinks)
and the clipped gradient norm equal the unsharded model's. The common tensor-parallel
plan refuses gpt-oss (its MLPs are MoE blocks), and the registry row claims no TP.
"""

from __future__ import annotations

from pathlib import Path

from gloo_cases import assert_cases_pass_on_two_ranks
from gpt_oss_tiny import tiny_config

from models import AutoModelForCausalLM, registry
from models.gpt_oss.parallelize import GPT_OSS_PLAN
from models.hooks import ep_unsupported_reason, parallel_plan, tp_unsupported_reason

WORKER = Path(__file__).with_name("_gpt_oss_worker.py")


def test_expert_parallel_matches_single_process(tmp_path):
    assert_cases_pass_on_two_ranks(WORKER, ["hooks", "trainer"], tmp_path)


def test_plan_spreads_experts_and_refuses_tensor_parallelism():
    model = AutoModelForCausalLM.from_config(tiny_config())
    assert parallel_plan(model) is GPT_OSS_PLAN
    assert len(GPT_OSS_PLAN.fsdp_units(model)) == 2
    assert ep_unsupported_reason(model, 2) is None
    assert "not divisible by ep_size 3" in ep_unsupported_reason(model, 3)
    assert "not Llama-style" in tp_unsupported_reason(model, 2)
    capabilities = registry.capabilities_for("GptOssForCausalLM")
    assert capabilities.supports_ep and not capabilities.supports_tp
    assert not (capabilities.supports_pp or capabilities.supports_cp)
