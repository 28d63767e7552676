"""Other field rules (issue 2, section 7): dtypes, LoRA, optimizer and scheduler bounds,
accelerator-only features."""

from __future__ import annotations

import copy

import pytest
from recipe_asserts import error_at

from jobs.recipe.settings import RecipeSettings
from jobs.recipe.validation import validate_job


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "auto", "torch.bfloat16"])
def test_known_dtypes(validate, recipe, dtype):
    recipe["model"]["dtype"] = dtype
    assert validate(recipe).valid


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
def test_unknown_dtype(validate, recipe, key):
    recipe["model"][key] = "fp8"
    assert "float32" in error_at(validate(recipe), f"model.{key}").fix


def test_trust_remote_code_is_refused_unless_allowed(validate, recipe):
    recipe["model"]["trust_remote_code"] = True
    error = error_at(validate(recipe), "model.trust_remote_code")
    assert "TUNEYARD_ALLOW_REMOTE_CODE=1" in error.fix and "allow_remote_code" in error.fix
    recipe["model"]["trust_remote_code"] = False
    assert validate(recipe).valid and validate(recipe).plan["trust_remote_code"] is False
    recipe["model"]["trust_remote_code"] = "yes"
    error_at(validate(recipe), "model.trust_remote_code")


def test_the_operator_or_a_project_grant_allows_remote_code(settings, recipe):
    recipe["model"]["trust_remote_code"] = True
    granted = validate_job(copy.deepcopy(recipe), settings=settings, allow_remote_code=True)
    assert granted.valid and granted.plan["trust_remote_code"] is True
    assert granted.typed.trust_remote_code is True
    operator = settings.model_copy(update={"allow_remote_code": True})
    assert validate_job(copy.deepcopy(recipe), settings=operator).valid


def test_the_operator_setting_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("TUNEYARD_ALLOW_REMOTE_CODE", "1")
    assert RecipeSettings().allow_remote_code is True
    monkeypatch.setenv("TUNEYARD_ALLOW_REMOTE_CODE", "0")
    assert RecipeSettings().allow_remote_code is False


def test_unknown_attention_implementation(validate, recipe):
    recipe["model"]["attn_implementation"] = "flash"
    error_at(validate(recipe), "model.attn_implementation")


def test_lora_fields_are_accepted_and_normalized(validate, recipe):
    recipe["peft"] = {
        "_target_": "nemo_automodel.components._peft.lora.PeftConfig",
        "target_modules": ["q_proj", "v_proj"],
        "exclude_modules": ["lm_head"],
        "dim": 8,
        "alpha": 16,
        "dropout": 0.1,
        "use_dora": False,
    }
    peft = validate(recipe).recipe["peft"]
    assert peft["dim"] == 8 and peft["match_all_linear"] is False


def test_lora_defaults_to_all_linear(validate, recipe):
    recipe["peft"] = {"dim": 4}
    assert validate(recipe).recipe["peft"]["match_all_linear"] is True


@pytest.mark.parametrize(
    ("key", "value"),
    [("dim", 0), ("dim", -8), ("alpha", 0), ("alpha", -1.0), ("dropout", 1.0), ("dropout", -0.1)],
)
def test_lora_bounds(validate, recipe, key, value):
    recipe["peft"] = {key: value}
    error_at(validate(recipe), f"peft.{key}")


def test_match_all_linear_excludes_target_modules(validate, recipe):
    recipe["peft"] = {"match_all_linear": True, "target_modules": ["q_proj"]}
    error_at(validate(recipe), "peft.target_modules")


def test_unknown_lora_field(validate, recipe):
    recipe["peft"] = {"dims": 4}
    assert "dim" in error_at(validate(recipe), "peft.dims").fix


def test_bad_peft_target(validate, recipe):
    recipe["peft"] = {"_target_": "peft.get_peft_model", "dim": 4}
    error_at(validate(recipe), "peft._target_")


@pytest.mark.parametrize("lr", [0, -1e-4, "fast", True])
def test_optimizer_lr_positive(validate, recipe, lr):
    recipe["optimizer"]["lr"] = lr
    error_at(validate(recipe), "optimizer.lr")


def test_min_lr_not_above_lr(validate, recipe):
    recipe["lr_scheduler"]["min_lr"] = 1e-2
    assert "0.001" in error_at(validate(recipe), "lr_scheduler.min_lr").fix


def test_negative_min_lr(validate, recipe):
    recipe["lr_scheduler"]["min_lr"] = -1.0
    error_at(validate(recipe), "lr_scheduler.min_lr")


def test_warmup_not_above_max_steps(validate, recipe):
    recipe["lr_scheduler"]["warmup_steps"] = 21
    error_at(validate(recipe), "lr_scheduler.warmup_steps")
    recipe["lr_scheduler"]["max_steps"] = 30
    assert validate(recipe).valid


@pytest.mark.parametrize("value", [-1, 2.5, "ten"])
def test_warmup_is_a_non_negative_integer(validate, recipe, value):
    recipe["lr_scheduler"]["warmup_steps"] = value
    error_at(validate(recipe), "lr_scheduler.warmup_steps")


@pytest.mark.parametrize("section", ["fp8", "qat"])
def test_fp8_and_qat_are_refused_at_submit_on_every_accelerator(validate, recipe, section):
    recipe[section] = {"enabled": True}
    assert "accelerator: cuda" in error_at(validate(recipe), f"{section}.enabled").msg
    on_cuda = error_at(validate(recipe, accelerator="cuda"), f"{section}.enabled")
    assert "not supported" in on_cuda.msg


def test_disabled_fp8_is_fine_on_cpu(validate, recipe):
    recipe["fp8"] = {"enabled": False}
    assert validate(recipe).valid


@pytest.mark.parametrize(
    ("field", "value"), [("nnodes", 0), ("nproc_per_node", -1), ("accelerator", "tpu")]
)
def test_resources_are_checked(validate, recipe, field, value):
    error_at(validate(recipe, **{field: value}), f"resources.{field}")


@pytest.mark.parametrize("key", ["max_seq_length", "limit_dataset_samples"])
def test_dataset_sizes_are_positive(validate, recipe, key):
    recipe["dataset"][key] = 0
    error_at(validate(recipe), f"dataset.{key}")


def test_packing_takes_its_size_from_the_dataset(validate, recipe):
    recipe["packed_sequence"] = {"enabled": True}
    result = validate(recipe)
    assert result.recipe["packed_sequence"]["packed_sequence_size"] == 64


def test_packing_size_alone_enables_packing(validate, recipe):
    recipe["packed_sequence"] = {"packed_sequence_size": 128}
    result = validate(recipe)
    assert result.recipe["packed_sequence"]["enabled"] is True
    assert result.plan["seq_length"] == 128


def test_packing_without_a_size(validate, recipe):
    recipe["packed_sequence"] = {"enabled": True}
    del recipe["dataset"]["max_seq_length"]
    error_at(validate(recipe), "packed_sequence.packed_sequence_size")


def test_restore_from_forms(validate, recipe, ckpt_root):
    (ckpt_root / "step_5").mkdir()
    for value in ("LATEST", {"path": "LATEST"}, str(ckpt_root / "step_5")):
        recipe["restore_from"] = value
        assert validate(recipe).valid, value
    recipe["restore_from"] = {"path": "LATEST", "strict": True}
    error_at(validate(recipe), "restore_from.strict")
    recipe["restore_from"] = 5
    error_at(validate(recipe), "restore_from.path")
