"""`peft.moe_rank_scaling`: AutoModel's expert LoRA rank dim // experts per token, refused
where experts may be adapted, ignored for a model without experts
(jobs.recipe.sections.values.check_moe_rank_scaling)."""

from __future__ import annotations

from recipe_asserts import TINY_LLAMA_CONFIG, error_at, write_model_dir

PEFT = {"target_modules": ["q_proj", "v_proj"], "dim": 8, "alpha": 16}
TINY_MOE = {**TINY_LLAMA_CONFIG, "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "head_dim": 16}  # fmt: skip


def test_a_dense_model_has_no_expert_rank_to_scale(validate, recipe):
    recipe["peft"] = {**PEFT, "moe_rank_scaling": True}
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    [warning] = [w for w in result.warnings if w.loc == "peft.moe_rank_scaling"]
    assert "'LlamaForCausalLM' has no experts" in warning.msg
    assert "moe_rank_scaling" not in result.recipe["peft"]


def test_a_model_with_experts_is_refused_with_why(validate, recipe, data_root):
    model = write_model_dir(data_root / "tiny-moe", TINY_MOE)
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    recipe["peft"] = {**PEFT, "moe_rank_scaling": True}
    error = error_at(validate(recipe), "peft.moe_rank_scaling")
    assert "dim // experts per token" in error.msg and "rank dim" in error.msg
    assert "not readable" not in error.msg
    assert error.fix.startswith("set peft.moe_rank_scaling: false")


def test_an_unreadable_config_cannot_rule_experts_out(validate, recipe):
    recipe["model"]["pretrained_model_name_or_path"] = "deepseek-ai/DeepSeek-V3.2-Exp"
    recipe["peft"] = {**PEFT, "moe_rank_scaling": True}
    error = error_at(validate(recipe), "peft.moe_rank_scaling")
    assert "experts cannot be ruled out" in error.msg


def test_false_is_tuneyards_lora_and_is_accepted(validate, recipe, data_root):
    model = write_model_dir(data_root / "tiny-moe", TINY_MOE)
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    recipe["peft"] = {**PEFT, "moe_rank_scaling": False}
    result = validate(recipe)
    assert "peft.moe_rank_scaling" not in [e.loc for e in result.errors + result.warnings]


def test_a_non_bool_is_a_type_error(validate, recipe):
    recipe["peft"] = {**PEFT, "moe_rank_scaling": "yes"}
    assert "boolean" in error_at(validate(recipe), "peft.moe_rank_scaling").msg
