"""Model-loader keywords (jobs.recipe.targets.loader_kwargs): transformers' loader options
refused at `model.<key>` whether or not the model's config is readable at submit, config
overrides only as attribute names, `use_safetensors: false` only with the operator's grant."""

from __future__ import annotations

from typing import Any

import pytest
from recipe_asserts import TINY_LLAMA_CONFIG, error_at, write_model_dir

from jobs.recipe.validation import validate_job

AM_LOADER = "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained"
FROM_CONFIG = "tuneyard.models.AutoModelForCausalLM.from_config"
AUTO_CONFIG = "transformers.AutoConfig.from_pretrained"
KD_CLASS = "nemo_automodel.recipes.llm.kd.KnowledgeDistillationRecipeForNextTokenPrediction"
UNCACHED_HUB_ID = "some-org/not-cached"  # the test cache is empty: its config is unreadable

# Keywords NeMo AutoModel's published recipes give the loader (less the path).
PUBLISHED = {
    "torch_dtype": "torch.bfloat16",
    "attn_implementation": "sdpa",
    "use_liger_kernel": False,
    "use_sdpa_patching": True,
    "trust_remote_code": False,
}
# transformers' loader options, each with a value a recipe could use to reach files,
# the hub, pickle or device placement.
LOADER_OPTIONS = {
    "cache_dir": "/tmp/elsewhere",
    "subfolder": "../..",
    "offload_folder": "/tmp/offload",
    "offload_state_dict": True,
    "offload_buffers": True,
    "device_map": "auto",
    "max_memory": {"0": "1GiB"},
    "low_cpu_mem_usage": True,
    "gguf_file": "model.gguf",
    "from_tf": True,
    "from_flax": True,
    "weights_only": False,
    "variant": "fp16",
    "local_files_only": False,
    "token": "hf_secret",
    "use_auth_token": "hf_secret",
    "proxies": {"https": "http://proxy:3128"},
    "mirror": "tuna",
    "resume_download": True,
    "force_download": True,
    "revision": "refs/pr/1",
    "code_revision": "main",
    "_commit_hash": "0123abcd",
    "quantization_config": {"load_in_4bit": True},
    "use_kernels": True,
    "config": "/tmp/elsewhere/config.json",
    "adapter_kwargs": {"token": "x"},
    "ignore_mismatched_sizes": True,
    "output_loading_info": True,
}


@pytest.fixture(params=["uncached hub id", "local dir"])
def source(request, model_dir) -> str:
    return UNCACHED_HUB_ID if request.param == "uncached hub id" else str(model_dir)


@pytest.fixture
def published(recipe: dict[str, Any], source: str) -> dict[str, Any]:
    """The test recipe whose model is written as AutoModel's published recipes write it."""
    recipe["model"] = {"_target_": AM_LOADER, "pretrained_model_name_or_path": source}
    recipe["model"].update(PUBLISHED)
    return recipe


def _error_locs(result) -> list[str]:
    return [e.loc for e in result.errors]


@pytest.mark.parametrize("key", sorted(LOADER_OPTIONS))
def test_a_loader_option_is_refused_at_its_key_whatever_the_config(validate, published, key):
    published["model"][key] = LOADER_OPTIONS[key]
    result = validate(published)
    assert set(_error_locs(result)) == {f"model.{key}"}, [str(e) for e in result.errors]
    assert "model-loader option" in result.errors[0].msg
    assert result.errors[0].fix.startswith("remove")


@pytest.mark.parametrize(
    "device_map", ["disk", {"": "disk"}, {"model.layers.0": 0, "lm_head": "disk"}]
)
def test_a_device_map_to_disk_is_refused_as_disk_offload(validate, published, device_map):
    published["model"]["device_map"] = device_map
    err = error_at(validate(published), "model.device_map")
    assert "offloads weights to disk" in err.msg


@pytest.mark.parametrize("key", ["Bad-Key", "_private", "__class__", "a.b", "x" * 65])
def test_a_keyword_that_no_config_attribute_can_be_named_is_refused(validate, published, key):
    published["model"][key] = 1
    err = error_at(validate(published), f"model.{key}")
    assert "config attribute name" in err.msg


@pytest.mark.parametrize("key", ["offload_folder", "cache_dir", "device_map"])
def test_the_teacher_gets_the_same_refusals(validate, kd_recipe, source, key):
    kd_recipe["teacher_model"]["pretrained_model_name_or_path"] = source
    kd_recipe["teacher_model"][key] = LOADER_OPTIONS[key]
    result = validate(kd_recipe)
    assert _error_locs(result) == [f"teacher_model.{key}"], [str(e) for e in result.errors]
    assert "model-loader option" in result.errors[0].msg


@pytest.mark.parametrize("key", ["cache_dir", "trust_remote_code", "use_safetensors"])
def test_a_nested_auto_config_refuses_loader_options(validate, recipe, key):
    recipe["model"] = {
        "_target_": FROM_CONFIG,
        "config": {"_target_": AUTO_CONFIG, "pretrained_model_name_or_path": UNCACHED_HUB_ID,
                   key: True},
    }  # fmt: skip
    error_at(validate(recipe), f"model.config.{key}")


def test_from_config_refuses_a_weights_path_and_use_safetensors(validate, recipe, model_dir):
    recipe["model"] = {"_target_": FROM_CONFIG, "config": str(model_dir), "use_safetensors": True}
    recipe["model"]["pretrained_model_name_or_path"] = str(model_dir)
    result = validate(recipe)
    assert "from_pretrained" in error_at(result, "model.pretrained_model_name_or_path").fix
    assert "only a from_pretrained load" in error_at(result, "model.use_safetensors").msg


def _validate(recipe: dict[str, Any], settings, allow_pickle: bool):
    allowed = settings.model_copy(update={"allow_pickle_weights": allow_pickle})
    return validate_job(recipe, [], None, allowed)


def test_pickle_weights_need_the_operator_setting(published, settings):
    published["model"].update(use_safetensors=False, force_hf=True)
    err = error_at(_validate(published, settings, False), "model.use_safetensors")
    assert "pickled .bin weights" in err.msg and "TUNEYARD_ALLOW_PICKLE_WEIGHTS=1" in err.fix
    result = _validate(published, settings, True)
    assert result.valid, [str(e) for e in result.errors]
    assert "model.use_safetensors" not in [w.loc for w in result.warnings]


@pytest.mark.parametrize("value", [True, False])
def test_use_safetensors_loads_with_the_hugging_face_class_only(published, settings, value):
    published["model"]["use_safetensors"] = value
    err = error_at(_validate(published, settings, True), "model.use_safetensors")
    assert "force_hf: true" in err.fix
    published["model"]["force_hf"] = True
    result = _validate(published, settings, True)
    assert result.valid, [str(e) for e in result.errors]


@pytest.mark.parametrize("value", [None, "false", 0])
def test_use_safetensors_is_a_boolean(published, settings, value):
    published["model"].update(use_safetensors=value, force_hf=True)
    err = error_at(_validate(published, settings, True), "model.use_safetensors")
    assert "true or false" in err.msg


def test_the_teacher_needs_the_same_grant_for_pickle_weights(kd_recipe, settings):
    kd_recipe["teacher_model"].update(use_safetensors=False, force_hf=True)
    err = error_at(_validate(kd_recipe, settings, False), "teacher_model.use_safetensors")
    assert "TUNEYARD_ALLOW_PICKLE_WEIGHTS" in err.fix
    assert _validate(kd_recipe, settings, True).valid


def test_the_operator_setting_is_read_from_the_environment(monkeypatch):
    from jobs.recipe.settings import RecipeSettings
    from jobs.store.settings import Settings

    assert RecipeSettings().allow_pickle_weights is False
    monkeypatch.setenv("TUNEYARD_ALLOW_PICKLE_WEIGHTS", "1")
    assert RecipeSettings().allow_pickle_weights is True
    assert Settings().allow_pickle_weights is True


@pytest.fixture
def kd_recipe(recipe: dict[str, Any], data_root) -> dict[str, Any]:
    teacher = write_model_dir(data_root / "teacher", {**TINY_LLAMA_CONFIG, "num_hidden_layers": 4})
    recipe["recipe"] = {"_target_": KD_CLASS}
    recipe["teacher_model"] = {"_target_": AM_LOADER, "pretrained_model_name_or_path": str(teacher)}
    recipe["kd_loss_fn"] = {"_target_": "nemo_automodel.components.loss.kd_loss.KDLoss"}
    recipe["kd_ratio"] = 0.5
    return recipe
