"""Pipeline layouts at submit: accepted for the families whose registry rows declare PP,
refused for the others, and every combination the trainer cannot run refused at the field
to change (jobs.recipe.topology.pipeline)."""

from __future__ import annotations

import pytest
from recipe_asserts import TINY_LLAMA_CONFIG, error_at, write_model_dir

from jobs.recipe.topology.pipeline import split_error, stage_count

MOE_CONFIG = {
    **TINY_LLAMA_CONFIG, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
}  # fmt: skip
MIXTRAL_CONFIG = {
    **TINY_LLAMA_CONFIG, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
    "num_local_experts": 4, "num_experts_per_tok": 2,
}  # fmt: skip
# A released DeepSeek-V3 config.json's aux-loss keys, which nothing reads (no aux loss).
DEEPSEEK_V3_CONFIG = {
    **TINY_LLAMA_CONFIG, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": 48, "kv_lora_rank": 32,
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "n_routed_experts": 8,
    "n_shared_experts": 1, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "first_k_dense_replace": 1, "aux_loss_alpha": 0.001,
    "seq_aux": True,
}  # fmt: skip
FOUR_LAYERS = {**TINY_LLAMA_CONFIG, "num_hidden_layers": 4}


def pp_recipe(recipe: dict, data_root, config: dict | None = None, **pipeline) -> dict:
    if config is not None:
        name = f"pp-{config['model_type']}-{config['num_hidden_layers']}"
        name += "-tied" if config.get("tie_word_embeddings") else ""
        recipe["model"]["pretrained_model_name_or_path"] = str(
            write_model_dir(data_root / name, config)
        )
    recipe["distributed"].update(pp_size=2, **({"pipeline": pipeline} if pipeline else {}))
    return recipe


@pytest.mark.parametrize(
    ("config", "pipeline", "nproc", "tp"),
    [(None, {}, 2, 1), (None, {"pp_schedule": "gpipe", "pp_microbatch_size": 2}, 2, 1),
     (FOUR_LAYERS, {"pp_schedule": "interleaved1f1b"}, 2, 1),
     (FOUR_LAYERS, {"pp_schedule": "looped_bfs", "layers_per_stage": 1}, 2, 1),
     (None, {}, 4, 2)],
)  # fmt: skip
def test_llama_pipeline_layouts_validate(validate, recipe, data_root, config, pipeline, nproc, tp):
    recipe["distributed"]["tp_size"] = tp
    result = validate(pp_recipe(recipe, data_root, config, **pipeline), nproc_per_node=nproc)
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.topology.mesh_shape["pp"] == 2


def test_a_family_without_pp_keeps_its_capability_error(validate, recipe, data_root):
    err = error_at(validate(pp_recipe(recipe, data_root, MIXTRAL_CONFIG), nproc_per_node=2),
                   "distributed.pp_size")  # fmt: skip
    assert "MixtralForCausalLM does not support pipeline parallelism" in err.msg
    assert err.fix == "set distributed.pp_size: 1"


@pytest.mark.parametrize(
    ("config", "nproc", "ep", "tp"),
    [(MOE_CONFIG, 2, 1, 1), (MOE_CONFIG, 4, 2, 1), (DEEPSEEK_V3_CONFIG, 2, 1, 1),
     (DEEPSEEK_V3_CONFIG, 4, 2, 1), (DEEPSEEK_V3_CONFIG, 4, 1, 2)],
    ids=["qwen3_moe-pp2", "qwen3_moe-pp2-ep2", "deepseek_v3-pp2", "deepseek_v3-pp2-ep2",
         "deepseek_v3-pp2-tp2"],
)  # fmt: skip
def test_moe_stages_validate_with_experts_spread_in_each(
    validate, recipe, data_root, config, nproc, ep, tp
):
    """tests/integration/trainer/test_moe_pipeline_runs.py proves each equal to one process
    (DeepSeek-V3's aux-loss keys are not read: it has no aux loss to split over stages)."""
    recipe = pp_recipe(recipe, data_root, config)
    recipe["distributed"].update(strategy="fsdp2", ep_size=ep, tp_size=tp)
    result = validate(recipe, nproc_per_node=nproc)
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.topology.mesh_shape["pp"] == 2
    assert (result.typed.topology.ep_size, result.typed.topology.mesh_shape["tp"]) == (ep, tp)


def test_experts_spread_over_a_stage_s_data_parallel_ranks(validate, recipe, data_root):
    recipe = pp_recipe(recipe, data_root, MOE_CONFIG)  # 2 ranks: one per stage, dp 1
    recipe["distributed"].update(strategy="fsdp2", ep_size=2)
    error = error_at(validate(recipe, nproc_per_node=2), "distributed.ep_size")
    assert "1 is not divisible by ep_size 2" in error.msg and "ep_size" in error.fix


def test_experts_in_stages_need_a_family_proven_with_both(validate, recipe, data_root):
    recipe = pp_recipe(recipe, data_root, MIXTRAL_CONFIG)
    recipe["distributed"].update(strategy="fsdp2", ep_size=2)
    result = validate(recipe, nproc_per_node=4)
    errors = [e for e in result.errors if e.loc == "distributed.ep_size"]
    assert len(errors) == 1, [str(e) for e in result.errors]
    assert "Qwen3MoeForCausalLM" in errors[0].msg and "'MixtralForCausalLM'" in errors[0].msg
    assert errors[0].fix == "set distributed.ep_size: 1 or distributed.pp_size: 1"
    assert "does not support pipeline" in error_at(result, "distributed.pp_size").msg


@pytest.mark.parametrize("where", ["override", "config"])
def test_the_router_aux_loss_is_refused_with_stages(validate, recipe, data_root, where):
    config = {**MOE_CONFIG, "output_router_logits": where == "config"}
    recipe = pp_recipe(recipe, data_root, config)
    if where == "override":
        recipe["model"]["output_router_logits"] = True
    error = error_at(validate(recipe, nproc_per_node=2), "model.output_router_logits")
    assert "load-balancing loss" in error.msg and "each pipeline stage" in error.msg
    assert error.fix.startswith("set model.output_router_logits: false")
    recipe["model"]["output_router_logits"] = False  # the fix, whichever set it
    assert validate(recipe, nproc_per_node=2).valid


def test_lora_with_pipeline_stages_validates(validate, recipe, data_root):
    """The adapters travel inside the stages' layers (tests/integration/trainer/
    test_lora_pipeline_runs.py proves the run equal to a 1-process LoRA run)."""
    recipe = pp_recipe(recipe, data_root)
    recipe["peft"] = {"dim": 4, "match_all_linear": True}
    result = validate(recipe, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]


CONFLICTS = [
    ({"distributed": {"tp_size": 2, "sequence_parallel": True}}, "distributed.sequence_parallel"),
    ({"checkpoint": {"is_async": True}}, "checkpoint.is_async"),
    ({"compile": {"enabled": True}}, "compile.enabled"),
    ({"model": {"force_hf": True}}, "model.force_hf"),
    ({"model": {"attn_implementation": "flash_attention_2"}}, "model.attn_implementation"),
]


@pytest.mark.parametrize(("change", "loc"), CONFLICTS, ids=[c[1] for c in CONFLICTS])
def test_what_stages_do_not_run_with_is_refused_at_its_field(
    validate, recipe, data_root, change, loc
):
    recipe = pp_recipe(recipe, data_root)
    for section, values in change.items():
        recipe[section] = {**recipe.get(section, {}), **values}
    nproc = 4 if recipe["distributed"].get("tp_size", 1) > 1 else 2
    error = error_at(validate(recipe, nproc_per_node=nproc), loc)
    assert "pipeline" in error.msg and "pp_size: 1" in error.fix


def test_v_shaped_schedules_are_refused(validate, recipe, data_root):
    recipe = pp_recipe(recipe, data_root, FOUR_LAYERS, pp_schedule="ZBVZeroBubble")
    error = error_at(validate(recipe, nproc_per_node=2), "distributed.pipeline.pp_schedule")
    assert "V-shaped" in error.msg and "interleaved1f1b" in error.fix


def test_zero_bubble_is_refused(validate, recipe, data_root):
    recipe = pp_recipe(recipe, data_root, FOUR_LAYERS, pp_schedule="InterleavedZeroBubble")
    error = error_at(validate(recipe, nproc_per_node=2), "distributed.pipeline.pp_schedule")
    assert "split weight gradients" in error.msg and "loopedbfs" in error.fix


@pytest.mark.parametrize(
    ("pipeline", "msg"),
    [({"pp_microbatch_size": 3}, "does not split"),  # local batch 4
     ({"pp_microbatch_size": 4}, "at least pp_size")],  # one micro-batch, two stages
)  # fmt: skip
def test_micro_batches_must_fill_the_schedule(validate, recipe, data_root, pipeline, msg):
    error = error_at(validate(pp_recipe(recipe, data_root, **pipeline), nproc_per_node=2),
                     "distributed.pipeline.pp_microbatch_size")  # fmt: skip
    assert msg in error.msg


def test_gpipe_runs_a_single_micro_batch(validate, recipe, data_root):
    recipe = pp_recipe(recipe, data_root, pp_schedule="gpipe", pp_microbatch_size=4)
    assert validate(recipe, nproc_per_node=2).valid


def test_the_model_config_must_split_into_the_stages(validate, recipe, data_root):
    two_layers = pp_recipe(recipe, data_root, pp_schedule="interleaved1f1b")  # 4 stages
    error = error_at(
        validate(two_layers, nproc_per_node=2), "distributed.pipeline.layers_per_stage"
    )
    assert "cannot fill 4 stages" in error.msg


def test_tied_embeddings_are_refused_from_the_config(validate, recipe, data_root):
    tied = {**TINY_LLAMA_CONFIG, "tie_word_embeddings": True}
    result = validate(pp_recipe(recipe, data_root, tied), nproc_per_node=2)
    assert "ties lm_head" in error_at(result, "distributed.pp_size").msg


def test_stage_counts_per_schedule():
    assert stage_count("1f1b", 2, 8, {}) == (2, None)
    assert stage_count("interleaved1f1b", 2, 8, {}) == (4, None)
    assert stage_count("interleaved1f1b", 2, 8, {"layers_per_stage": 1}) == (8, 1)
    rounding = {"layers_per_stage": 2, "round_virtual_stages_to_pp_multiple": "up"}
    assert stage_count("loopedbfs", 4, 12, rounding) == (8, None)  # 6 stages -> 8, even split
    assert stage_count(
        "loopedbfs", 4, 12, {**rounding, "round_virtual_stages_to_pp_multiple": "down"}
    ) == (4, None)
    assert split_error("loopedbfs", 4, 12, {"layers_per_stage": 2}) is not None  # 6 stages
    assert split_error("1f1b", 2, 4, {"layers_per_stage": 1}) is not None
    assert split_error("1f1b", 2, 4, {"layers_per_stage": 2}) is None
