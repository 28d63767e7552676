"""`peft.moe_rank_scaling`: AutoModel's expert LoRA rank dim // experts per token, kept
for the trainer where the model has experts, ignored for a model without them
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
    assert result.recipe["peft"]["moe_rank_scaling"] is False


def test_a_model_with_experts_keeps_it_for_the_trainer(validate, recipe, data_root):
    model = write_model_dir(data_root / "tiny-moe", TINY_MOE)
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    recipe["peft"] = {**PEFT, "moe_rank_scaling": True}
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.recipe["peft"]["moe_rank_scaling"] is True
    assert "peft.moe_rank_scaling" not in [w.loc for w in result.warnings]  # 8 // 2 = 4


def test_a_rank_below_one_is_refused_and_a_remainder_warned(validate, recipe, data_root):
    model = write_model_dir(data_root / "tiny-moe", TINY_MOE)
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    recipe["peft"] = {**PEFT, "dim": 1, "moe_rank_scaling": True}
    error = error_at(validate(recipe), "peft.moe_rank_scaling")
    assert "1 // 2 experts per token = 0" in error.msg and "peft.dim to at least 2" in error.fix
    recipe["peft"] = {**PEFT, "dim": 5, "moe_rank_scaling": True}
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    [warning] = [w for w in result.warnings if w.loc == "peft.moe_rank_scaling"]
    assert "rank 2" in warning.msg


def test_false_is_tuneyards_lora_and_is_accepted(validate, recipe, data_root):
    model = write_model_dir(data_root / "tiny-moe", TINY_MOE)
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    recipe["peft"] = {**PEFT, "moe_rank_scaling": False}
    result = validate(recipe)
    assert "peft.moe_rank_scaling" not in [e.loc for e in result.errors + result.warnings]


def test_a_non_bool_is_a_type_error(validate, recipe):
    recipe["peft"] = {**PEFT, "moe_rank_scaling": "yes"}
    assert "boolean" in error_at(validate(recipe), "peft.moe_rank_scaling").msg
