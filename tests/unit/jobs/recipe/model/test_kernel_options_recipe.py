"""The model loader's kernel keywords at submit (jobs.recipe.automodel.sections.KernelValues,
kernel_option_notes): typed strictly, carried in the typed recipe's model call, and the
warnings that say what will not apply."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.recipe.typed import Recipe


def _warnings(result, loc: str) -> list[str]:
    return [w.msg for w in result.warnings if w.loc == loc]


def test_liger_and_sdpa_keys_reach_the_typed_model_call(validate, recipe: dict[str, Any]):
    recipe["model"].update(
        use_liger_kernel=True, use_sdpa_patching=True, sdpa_method=["flash_attention", "math"]
    )
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    kwargs = result.typed.model.kwargs
    assert kwargs["use_liger_kernel"] is True and kwargs["use_sdpa_patching"] is True
    assert kwargs["sdpa_method"] == ["flash_attention", "math"]
    assert Recipe.from_json(result.typed.to_json()) == result.typed
    note = _warnings(result, "model.use_liger_kernel")
    assert note and "fused linear cross-entropy" in note[0] and "kernel_fallback" in note[0]
    assert not [w for w in result.warnings if "accepted and ignored" in w.msg and "model." in w.loc]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("use_liger_kernel", "yes"),
        ("use_liger_kernel", 1),
        ("use_sdpa_patching", "true"),
        ("sdpa_method", "flash_attention"),
        ("sdpa_method", ["flash"]),
        ("sdpa_method", []),
        ("sdpa_method", ["math", "math"]),
    ],
)
def test_kernel_keys_are_typed_strictly(validate, recipe, key, value):
    recipe["model"][key] = value
    if key == "sdpa_method":
        recipe["model"]["use_sdpa_patching"] = True
    result = validate(recipe)
    assert not result.valid
    locs = [e.loc for e in result.errors]
    assert any(loc == f"model.{key}" or loc.startswith(f"model.{key}.") for loc in locs), locs


def test_from_config_takes_the_kernel_keys(validate, recipe, model_dir):
    recipe["model"] = {
        "_target_": "tuneyard.models.AutoModelForCausalLM.from_config",
        "config": {"_target_": "transformers.AutoConfig.from_pretrained",
                   "pretrained_model_name_or_path": str(model_dir)},
        "use_liger_kernel": False,
        "use_sdpa_patching": True,
    }  # fmt: skip
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.model.kwargs["use_sdpa_patching"] is True


def test_sdpa_method_alone_turns_patching_on_as_automodel_does(validate, recipe):
    recipe["model"]["sdpa_method"] = ["efficient_attention"]
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.model.kwargs["use_sdpa_patching"] is True
    assert "AutoModel's default" in _warnings(result, "model.use_sdpa_patching")[0]


def test_sdpa_method_with_patching_off_is_reported_ignored(validate, recipe):
    recipe["model"].update(use_sdpa_patching=False, sdpa_method=["math"])
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert "sdpa_method" not in result.typed.model.kwargs
    assert "accepted and ignored" in _warnings(result, "model.sdpa_method")[0]


def test_sdpa_patching_under_another_attention_changes_nothing(validate, recipe):
    recipe["model"].update(use_sdpa_patching=True, attn_implementation="flex_attention")
    result = validate(recipe)
    assert "changes nothing" in _warnings(result, "model.use_sdpa_patching")[0]


def test_liger_is_turned_off_under_tensor_parallelism(validate, recipe):
    recipe["model"]["use_liger_kernel"] = True
    recipe["distributed"] = {"strategy": "fsdp2", "tp_size": 2}
    result = validate(recipe, nnodes=1, nproc_per_node=2, accelerator="cpu")
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.model.kwargs["use_liger_kernel"] is False
    assert "distributed.tp_size: 2" in _warnings(result, "model.use_liger_kernel")[0]


def test_liger_off_gets_no_note(validate, recipe):
    recipe["model"]["use_liger_kernel"] = False
    result = validate(recipe)
    assert result.valid
    assert not _warnings(result, "model.use_liger_kernel")  # false: nothing to say
