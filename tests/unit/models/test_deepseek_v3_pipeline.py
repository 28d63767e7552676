"""DeepSeek-V3's parallel plan on pipeline stages: a stage's layers keep their full-model
indices as names (`StageLayers`), and the latent-attention TP plan must name them so, or
the last stage's layers would be planned under the first stage's names
(tests/integration/trainer/test_moe_pipeline_runs.py runs pp2 x tp2 equal to one process)."""

from __future__ import annotations

from _deepseek_v3_worker import tiny_config

from models.common.pipeline_split import split_model, stage_layer_ranges
from models.deepseek_v3.model import DeepseekV3ForCausalLM
from models.deepseek_v3.parallelize import DEEPSEEK_V3_PLAN


def test_the_tp_plan_names_each_stage_s_layers_by_their_model_index():
    ranges = stage_layer_ranges(3, 2)  # stage 0: dense layer 0 + MoE layer 1; stage 1: 2
    for stage_id, want in ((0, {"0", "1"}), (1, {"2"})):
        model = DeepseekV3ForCausalLM.from_config(tiny_config(num_hidden_layers=3))
        _, (stage,) = split_model(model, [stage_id], ranges)
        assert DEEPSEEK_V3_PLAN.tp_unsupported_reason(stage, 2) is None
        plan = DEEPSEEK_V3_PLAN.tp_plan(stage)
        assert {key.split(".")[1] for key in plan} == want
        for key in plan:
            stage.get_submodule(key)  # raises if the plan names a module the stage lacks
    assert "layers.2.mlp.shared_experts.down_proj" in plan
    assert "layers.2.self_attn.kv_b_proj" in plan
