"""AutoModel's `quantization:` (QLoRA) section (jobs.recipe.sections.quantization): its keys
and defaults as AutoModel's `create_bnb_config` reads them, carried to the typed recipe, the
bitsandbytes requirement, the memory estimate, and what it cannot run with."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at

QLORA = {
    "load_in_4bit": True,
    "load_in_8bit": False,
    "bnb_4bit_compute_dtype": "bfloat16",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_quant_storage": "bfloat16",
}
PEFT = {"target_modules": ["q_proj", "v_proj"], "dim": 4, "alpha": 8}


@pytest.fixture
def qlora_recipe(recipe):
    return {**recipe, "peft": PEFT, "quantization": dict(QLORA)}


def quantization_warnings(result) -> list[str]:
    return [w.msg for w in result.warnings if w.loc.startswith("quantization")]


def test_qlora_on_cuda_reaches_the_typed_recipe_and_requires_bitsandbytes(validate, qlora_recipe):
    result = validate(qlora_recipe, accelerator="cuda")
    assert result.valid, [str(e) for e in result.errors]
    quantization = result.recipe["quantization"]
    assert quantization == {
        "bits": 4,
        "quant_type": "nf4",
        "compute_dtype": "bfloat16",
        "double_quant": True,
        "quant_storage": "bfloat16",
        "int8_threshold": 6.0,
    }
    assert "bitsandbytes" in result.plan["requires"]
    assert not quantization_warnings(result)


def test_automodel_defaults_and_torch_spelled_dtypes(validate, qlora_recipe):
    qlora_recipe["quantization"] = {"load_in_4bit": True, "bnb_4bit_compute_dtype": "torch.float16"}
    quantization = validate(qlora_recipe, accelerator="cuda").recipe["quantization"]
    assert quantization["compute_dtype"] == "float16"
    assert (quantization["quant_type"], quantization["double_quant"]) == ("nf4", True)
    assert quantization["quant_storage"] == "bfloat16"


def test_eight_bit(validate, qlora_recipe):
    qlora_recipe["quantization"] = {"load_in_8bit": True, "llm_int8_threshold": 4}
    quantization = validate(qlora_recipe, accelerator="cuda").recipe["quantization"]
    assert (quantization["bits"], quantization["int8_threshold"]) == (8, 4.0)


def test_a_cpu_job_runs_with_a_warning_about_speed(validate, qlora_recipe):
    result = validate(qlora_recipe, accelerator="cpu")
    assert result.valid, [str(e) for e in result.errors]
    [warning] = quantization_warnings(result)
    assert "CPU backend dequantizes" in warning and "4 bits" in warning


def test_the_estimate_holds_quantized_layers(validate, qlora_recipe):
    """The decoder layers' weights at ~4.1 bits instead of 32: the params term shrinks."""
    plain = validate({**qlora_recipe, "quantization": None}, accelerator="cuda")
    quantized = validate(qlora_recipe, accelerator="cuda")
    before = plain.plan["estimate"]["memory_per_rank_bytes"]["params"]
    after = quantized.plan["estimate"]["memory_per_rank_bytes"]["params"]
    inputs = quantized.plan["estimate"]["basis"]["inputs"]
    assert (inputs["quant_bits"], inputs["quant_double"]) == (4, True)
    layers = inputs["params"] - inputs["root_params"] - inputs["expert_params"]
    assert before - after == pytest.approx(layers * (4 - 0.5 - 1 / 64), abs=8)


def test_bitsandbytes_config_keys_automodel_ignores_are_warnings(validate, qlora_recipe):
    qlora_recipe["quantization"]["llm_int8_skip_modules"] = ["lm_head"]
    result = validate(qlora_recipe, accelerator="cuda")
    assert result.valid
    assert [w.loc for w in result.warnings if w.loc.startswith("quantization")] == [
        "quantization.llm_int8_skip_modules"
    ]


@pytest.mark.parametrize(
    ("change", "loc", "words"),
    [
        ({"peft": None}, "quantization", "has no peft"),
        ({"distributed": {"strategy": "fsdp2", "tp_size": 2}}, "distributed.tp_size", "whole"),
        ({"distributed": {"strategy": "fsdp2", "pp_size": 2}}, "distributed.pp_size", "whole"),
    ],
)
def test_what_a_quantized_base_cannot_run_with(validate, qlora_recipe, change, loc, words):
    recipe = {**qlora_recipe, **change}
    if recipe["peft"] is None:
        del recipe["peft"]
    result = validate(recipe, accelerator="cuda", nproc_per_node=2)
    assert words in error_at(result, loc).msg


def test_a_from_config_model_has_nothing_to_quantize(validate, qlora_recipe, model_dir):
    qlora_recipe["model"] = {
        "_target_": "tuneyard.models.AutoModelForCausalLM.from_config",
        "config": str(model_dir),
    }
    error = error_at(validate(qlora_recipe, accelerator="cuda"), "quantization")
    assert "no pretrained weights to quantize" in error.msg and "from_pretrained" in error.fix


def test_both_widths_is_an_error(validate, qlora_recipe):
    qlora_recipe["quantization"]["load_in_8bit"] = True
    error = error_at(validate(qlora_recipe, accelerator="cuda"), "quantization.load_in_8bit")
    assert "both true" in error.msg


def test_a_section_that_quantizes_nothing_is_a_warning(validate, qlora_recipe):
    qlora_recipe["quantization"] = {"load_in_4bit": False, "load_in_8bit": False}
    result = validate(qlora_recipe)
    assert result.valid, [str(e) for e in result.errors]
    [warning] = [w for w in result.warnings if w.loc == "quantization"]
    assert "nothing is quantized" in warning.msg
    assert result.recipe["quantization"] is None


@pytest.mark.parametrize(
    ("value", "loc", "words"),
    [
        ({"load_in_4bit": "yes"}, "quantization.load_in_4bit", "bool"),
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "nf3"}, "quantization.bnb_4bit_quant_type", "nf4"),
        ({"load_in_4bit": True, "bnb_4bit_compute_dtype": "int4"}, "quantization.bnb_4bit_compute_dtype", "bfloat16"),
        ({"load_in_4bit": True, "group_size": 64}, "quantization.group_size", ""),
        ("nf4", "quantization", "must be a mapping"),
    ],
)  # fmt: skip
def test_a_malformed_section_is_an_error_at_its_field(validate, qlora_recipe, value, loc, words):
    qlora_recipe["quantization"] = value
    assert words in error_at(validate(qlora_recipe), loc).msg


def test_quantization_none_is_no_section(validate, qlora_recipe):
    qlora_recipe["quantization"] = "none"
    result = validate(qlora_recipe)
    assert result.valid and not quantization_warnings(result)
    assert result.recipe["quantization"] is None
