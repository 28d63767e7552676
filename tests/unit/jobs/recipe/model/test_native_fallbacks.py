"""DeepSeek-V3 configs that load with the Hugging Face class cannot run tensor parallelism:
refused at submit, with a torch-free rule that agrees with the native class's own."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at, write_model_dir
from test_deepseek_v3_family_rules import DEEPSEEK_V3

from jobs.recipe.model.native_fallbacks import hf_fallback_reason

VARIANTS = [
    {},
    {"quantization_config": {"quant_method": "fp8"}},
    {"scoring_func": "softmax"},
    {"topk_method": "greedy"},
    {"num_key_value_heads": 2},
    {"n_shared_experts": 0},
    {"n_group": 3},
    {"topk_group": 5},
    {"num_experts_per_tok": 5, "topk_group": 1},
]


@pytest.mark.parametrize("change", VARIANTS, ids=lambda c: ",".join(c) or "native")
def test_the_rule_agrees_with_the_native_class(change):
    import transformers

    from models.deepseek_v3.model import DeepseekV3ForCausalLM

    values = {**DEEPSEEK_V3, **change}
    config = transformers.DeepseekV3Config(
        **{k: v for k, v in values.items() if k != "architectures"}
    )
    native = DeepseekV3ForCausalLM.unsupported_reason(config)
    assert (hf_fallback_reason("DeepseekV3ForCausalLM", values) is None) == (native is None), native


def test_tensor_parallelism_of_a_fallback_config_is_refused(validate, recipe, data_root):
    config = {**DEEPSEEK_V3, "scoring_func": "softmax"}
    recipe["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / "ds", config)
    )
    recipe["distributed"].update(tp_size=2)
    error = error_at(validate(recipe, nproc_per_node=2), "distributed.tp_size")
    assert "Hugging Face class" in error.msg and "scoring_func" in error.msg
    recipe["distributed"].update(tp_size=1)
    assert validate(recipe, nproc_per_node=2).valid


def test_force_hf_with_tensor_parallelism_is_refused(validate, recipe, data_root):
    recipe["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / "ds", DEEPSEEK_V3)
    )
    recipe["model"]["force_hf"] = True
    recipe["distributed"].update(tp_size=2)
    assert "native class only" in error_at(validate(recipe, nproc_per_node=2), "model.force_hf").msg
