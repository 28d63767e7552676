"""AutoModel's `quantization:` (QLoRA) section: refused with its reason, on CPU and on CUDA
(jobs.recipe.sections.quantization)."""

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


def test_qlora_on_a_cpu_job_is_refused_with_the_reason(validate, qlora_recipe):
    error = error_at(validate(qlora_recipe, accelerator="cpu"), "quantization.load_in_4bit")
    assert "needs a CUDA accelerator" in error.msg and "the job has cpu" in error.msg
    assert "remove the quantization section" in error.fix


@pytest.mark.parametrize(("key", "bits"), [("load_in_4bit", "4-bit"), ("load_in_8bit", "8-bit")])
def test_qlora_on_cuda_is_refused_until_it_is_wired(validate, qlora_recipe, key, bits):
    qlora_recipe["quantization"] = {key: True}
    error = error_at(validate(qlora_recipe, accelerator="cuda"), f"quantization.{key}")
    assert f"QLoRA ({bits} base weights) needs bitsandbytes" in error.msg
    assert "not available" in error.msg


def test_a_section_that_quantizes_nothing_is_a_warning(validate, qlora_recipe):
    qlora_recipe["quantization"] = {"load_in_4bit": False, "load_in_8bit": False}
    result = validate(qlora_recipe)
    assert result.valid, [str(e) for e in result.errors]
    [warning] = [w for w in result.warnings if w.loc == "quantization"]
    assert "nothing is quantized" in warning.msg


@pytest.mark.parametrize(
    ("value", "loc", "words"),
    [
        ({"load_in_4bit": "yes"}, "quantization.load_in_4bit", "true or false"),
        ("nf4", "quantization", "must be a mapping"),
    ],
)
def test_a_malformed_section_is_an_error_at_its_field(validate, qlora_recipe, value, loc, words):
    qlora_recipe["quantization"] = value
    assert words in error_at(validate(qlora_recipe), loc).msg


def test_quantization_none_is_no_section(validate, qlora_recipe):
    qlora_recipe["quantization"] = "none"
    result = validate(qlora_recipe)
    assert result.valid and not [w for w in result.warnings if w.loc == "quantization"]
