"""Hub names on an offline server must be cached (jobs.recipe.model.hub)."""

from __future__ import annotations

from pathlib import Path

import pytest
from recipe_asserts import error_at

from jobs.recipe.model.hub import is_cached, repo_type_of
from jobs.recipe.validation import validate_job

HELLASWAG = "nemo_automodel.components.datasets.llm.hellaswag.HellaSwag"


def _cache(root: Path, repo_type: str, name: str) -> None:
    snapshot = root / f"{repo_type}s--{name.replace('/', '--')}" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "data.parquet").write_bytes(b"x")


@pytest.fixture
def hub_recipe(recipe):
    recipe["dataset"] = {"_target_": HELLASWAG, "path_or_dataset": "rowan/hellaswag"}
    return recipe


def _validate(recipe, settings, offline: bool):
    return validate_job(recipe, [], None, settings.model_copy(update={"hub_offline": offline}))


def test_an_offline_server_refuses_an_uncached_hub_dataset(hub_recipe, settings):
    err = error_at(_validate(hub_recipe, settings, True), "dataset.path_or_dataset")
    assert "hub dataset rowan/hellaswag is not in this server's Hugging Face cache" in err.msg
    assert "hf download rowan/hellaswag --repo-type dataset" in err.fix


def test_an_online_server_accepts_it_for_the_worker_to_download(hub_recipe, settings):
    result = _validate(hub_recipe, settings, False)
    assert result.valid, [str(e) for e in result.errors]


def test_a_cached_hub_dataset_is_accepted_offline(hub_recipe, settings, empty_hf_cache):
    _cache(empty_hf_cache, "dataset", "rowan/hellaswag")
    assert _validate(hub_recipe, settings, True).valid


def test_an_uncached_hub_model_is_refused_offline(recipe, settings, empty_hf_cache):
    recipe["model"]["pretrained_model_name_or_path"] = "meta-llama/Llama-3.2-1B"
    err = error_at(_validate(recipe, settings, True), "model.pretrained_model_name_or_path")
    assert "--repo-type model" in err.fix
    _cache(empty_hf_cache, "model", "meta-llama/Llama-3.2-1B")
    assert _validate(recipe, settings, True).valid


def test_the_api_settings_read_hf_hub_offline(monkeypatch):
    from jobs.store.settings import Settings

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert Settings().hub_offline is True
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert Settings().hub_offline is False
    monkeypatch.setenv("TUNEYARD_HUB_OFFLINE", "true")
    assert Settings().hub_offline is True


def test_repo_types_and_cache_lookup(tmp_path):
    assert repo_type_of("dataset.path_or_dataset") == "dataset"
    assert repo_type_of("dataset.tokenizer_name_or_path") == "model"
    assert repo_type_of("tokenizer.pretrained_model_name_or_path") == "model"
    assert repo_type_of("model.config.pretrained_model_name_or_path") == "model"
    assert not is_cached("a/b", "dataset", tmp_path)
    (tmp_path / "datasets--a--b" / "snapshots" / "r").mkdir(parents=True)
    assert not is_cached("a/b", "dataset", tmp_path)  # an empty snapshot is not a dataset
