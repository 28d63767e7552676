"""An online server fetches a hub model's config at submit and pins its commit
(jobs.recipe.model.hub), against a local server that speaks the hub's file protocol."""

from __future__ import annotations

from pathlib import Path

import pytest
from hub_server import repo_commit, serve_hub, write_repo
from recipe_asserts import TINY_LLAMA_CONFIG, TINY_LLAMA_PARAMS, error_at

from jobs.recipe.model.config import CONFIG_FILE_CAP
from jobs.recipe.validation import validate_job

NAME = "org/tiny-llama"
LOC = "model.pretrained_model_name_or_path"


@pytest.fixture
def hub_root(tmp_path: Path) -> Path:
    root = tmp_path / "hub"
    write_repo(root, NAME, {"config.json": TINY_LLAMA_CONFIG, "README.md": "tiny"})
    return root


@pytest.fixture
def endpoint(hub_root: Path, monkeypatch: pytest.MonkeyPatch):
    import huggingface_hub.constants

    # The suite runs with HF_HUB_OFFLINE=1 (tests/conftest.py), which huggingface_hub reads
    # once at import: these tests are the online server's, talking to the local hub only.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with serve_hub(hub_root, gated=("org/gated",)) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        yield url


@pytest.fixture
def hub_recipe(recipe):
    recipe["model"]["pretrained_model_name_or_path"] = NAME
    recipe["distributed"] = {"tp_size": 2}  # needs the architecture: the config must be read
    return recipe


def _validate(recipe, settings, fetch=True, offline=False):
    online = settings.model_copy(update={"hub_fetch": fetch, "hub_offline": offline})
    return validate_job(recipe, [], {"nproc_per_node": 2}, online)


def test_the_config_is_fetched_and_its_commit_pinned(hub_recipe, settings, endpoint, hub_root):
    result = _validate(hub_recipe, settings)
    assert result.valid, [str(e) for e in result.errors]
    commit = repo_commit(hub_root / NAME)
    assert result.plan["architecture"] == "LlamaForCausalLM"
    assert result.plan["param_count"] == TINY_LLAMA_PARAMS
    assert result.plan["hub_revisions"] == {NAME: commit}
    assert result.typed.hub_revisions == {NAME: commit}
    assert result.recipe["hub_revisions"] == {NAME: commit}  # what the worker runs


def test_a_tokenizer_named_apart_from_the_model_is_pinned_too(
    hub_recipe, settings, endpoint, hub_root
):
    write_repo(hub_root, "org/tokenizer", {"tokenizer_config.json": {"model_max_length": 64}})
    hub_recipe["tokenizer"] = {
        "_target_": "transformers.AutoTokenizer.from_pretrained",
        "pretrained_model_name_or_path": "org/tokenizer",
    }
    result = _validate(hub_recipe, settings)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["hub_revisions"] == {
        NAME: repo_commit(hub_root / NAME),
        "org/tokenizer": repo_commit(hub_root / "org/tokenizer"),
    }
    assert "org/tokenizer" not in _validate(hub_recipe, settings, fetch=False).plan["hub_revisions"]


def test_without_fetching_the_same_recipe_is_refused_as_before(hub_recipe, settings, endpoint):
    err = error_at(_validate(hub_recipe, settings, fetch=False), "distributed.tp_size")
    assert "config.json is not readable here" in err.msg


def test_an_offline_server_never_fetches(hub_recipe, settings, endpoint):
    err = error_at(_validate(hub_recipe, settings, offline=True), LOC)
    assert "not in this server's Hugging Face cache" in err.msg


def test_a_new_commit_on_the_hub_is_what_the_next_submit_pins(
    hub_recipe, settings, endpoint, hub_root
):
    first = _validate(hub_recipe, settings).plan["hub_revisions"][NAME]
    write_repo(hub_root, NAME, {"config.json": {**TINY_LLAMA_CONFIG, "num_hidden_layers": 4}})
    second = _validate(hub_recipe, settings)
    assert second.plan["hub_revisions"][NAME] == repo_commit(hub_root / NAME) != first
    assert second.plan["param_count"] > TINY_LLAMA_PARAMS  # the new config was read


def test_the_cache_answers_when_the_hub_goes_away(hub_recipe, settings, endpoint, monkeypatch):
    commit = _validate(hub_recipe, settings).plan["hub_revisions"][NAME]
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    result = _validate(hub_recipe, settings)
    assert result.valid and result.plan["hub_revisions"] == {NAME: commit}


def test_an_unreachable_hub_leaves_the_config_unknown(recipe, settings, endpoint, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    recipe["model"]["pretrained_model_name_or_path"] = NAME
    result = _validate(recipe, settings)
    assert result.valid and result.plan["architecture"] is None
    assert result.plan["hub_revisions"] == {}


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("org/absent", "does not exist or this server's token may not read it"),
        ("org/gated", "is gated or this server's token may not read it"),
        ("org/no-config", "has no config.json"),
        ("org/huge-config", f"(at most {CONFIG_FILE_CAP})"),
    ],
)
def test_a_name_the_hub_cannot_answer_for_is_refused_at_the_field(
    hub_recipe, settings, endpoint, hub_root, name, words
):
    write_repo(hub_root, "org/no-config", {"README.md": "weights only"})
    write_repo(hub_root, "org/huge-config", {"config.json": " " * (CONFIG_FILE_CAP + 1)})
    hub_recipe["model"]["pretrained_model_name_or_path"] = name
    err = error_at(_validate(hub_recipe, settings), LOC)
    assert words in err.msg and err.fix


def test_the_api_fetches_unless_offline(monkeypatch):
    from jobs.store.settings import Settings

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert Settings().hub_fetch is True
    monkeypatch.setenv("TUNEYARD_HUB_FETCH", "0")
    assert Settings().hub_fetch is False
