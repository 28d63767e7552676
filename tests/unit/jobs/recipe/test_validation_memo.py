"""`validate_cached` answers a repeated recipe without validating it again, and validates it
again whenever anything it depends on changed: the files it read, where links lead, the
environment, the settings, the registries. Results that asked the database, and invalid
ones, are never kept."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from recipe_asserts import TINY_LLAMA_CONFIG, write_model_dir

from api import validation_memo
from jobs.recipe.scope import JobScope


@pytest.fixture
def counted(monkeypatch):
    """validate_cached, and how many times it really validated."""
    validation_memo.forget()
    calls = []
    real = validation_memo.validate_job

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(validation_memo, "validate_job", counting)
    yield calls
    validation_memo.forget()


def run(recipe, settings, **kwargs):
    return validation_memo.validate_cached(copy.deepcopy(recipe), (), None, settings, **kwargs)


def test_a_repeated_recipe_is_answered_without_validating(counted, recipe, settings):
    first = run(recipe, settings)
    assert first.valid, first.errors
    first.plan["max_steps"] = -1  # the caller's copy: the kept answer is not touched
    first.recipe["model"]["dtype"] = "changed"
    again = run(recipe, settings)
    assert len(counted) == 1
    assert again.plan["max_steps"] == 20 and again.recipe["model"]["dtype"] == "float32"
    assert again.plan is not first.plan


def test_another_key_order_or_value_is_another_recipe(counted, recipe, settings):
    run(recipe, settings)
    run(dict(reversed(list(recipe.items()))), settings)
    changed = copy.deepcopy(recipe)
    changed["step_scheduler"]["max_steps"] = 21
    assert run(changed, settings).plan["max_steps"] == 21
    assert len(counted) == 3


def test_a_changed_config_json_is_read_again(counted, recipe, settings, model_dir):
    before = run(recipe, settings).plan["param_count"]
    layers = TINY_LLAMA_CONFIG["num_hidden_layers"]
    write_model_dir(model_dir, {**TINY_LLAMA_CONFIG, "num_hidden_layers": layers + 1})
    assert run(recipe, settings).plan["param_count"] > before
    assert len(counted) == 2


def test_a_removed_dataset_is_refused(counted, recipe, settings, squad_dir):
    assert run(recipe, settings).valid
    shutil.rmtree(squad_dir)
    result = run(recipe, settings)
    assert not result.valid and "dataset.path_or_dataset" in [e.loc for e in result.errors]


def test_a_link_pointed_outside_the_roots_is_refused(counted, recipe, settings, model_dir,
                                                     tmp_path):  # fmt: skip
    outside = write_model_dir(tmp_path / "elsewhere" / "model")
    link = model_dir.parent / "linked"
    link.symlink_to(model_dir)
    recipe = {**recipe, "model": {**recipe["model"], "pretrained_model_name_or_path": str(link)}}
    assert run(recipe, settings).valid
    link.unlink()
    link.symlink_to(outside)
    result = run(recipe, settings)
    assert not result.valid and "symlink" in str(result.errors)


def test_the_environment_and_the_settings_are_part_of_the_key(counted, recipe, settings,
                                                              monkeypatch):  # fmt: skip
    run(recipe, settings)
    monkeypatch.setenv("TUNEYARD_TEST_MEMO", "1")
    run(recipe, settings)
    run(recipe, settings.model_copy(update={"hub_offline": True}))
    run(recipe, settings, allow_remote_code=True)
    run(recipe, settings, device_memory=80 << 30)
    assert len(counted) == 5
    run(recipe, settings, device_memory=80 << 30)
    assert len(counted) == 5


def test_a_registry_change_is_part_of_the_key(counted, recipe, settings, monkeypatch):
    from models import registry

    run(recipe, settings)
    entry = registry._REGISTRY["LlamaForCausalLM"]
    monkeypatch.setitem(registry._REGISTRY, "LlamaForCausalLM", copy.copy(entry))
    run(recipe, settings)
    assert len(counted) == 2


def test_a_working_directory_change_is_part_of_the_key(counted, recipe, settings, tmp_path,
                                                       monkeypatch):  # fmt: skip
    run(recipe, settings)
    monkeypatch.chdir(tmp_path)
    run(recipe, settings)
    assert len(counted) == 2


def test_invalid_results_and_database_answers_are_not_kept(counted, recipe, settings):
    broken = {**recipe, "optimizer": {"_target_": "os.system"}}
    assert not run(broken, settings).valid
    assert not run(broken, settings).valid
    assert len(counted) == 2
    scope = JobScope(project="p", owns_job=lambda job: job == "job-1")
    runs = Path(settings.runs_dir)
    (runs / "job-1" / "checkpoints" / "step_5").mkdir(parents=True)
    resumed = {**recipe, "restore_from": {"path": str(runs / "job-1" / "checkpoints" / "step_5")}}
    first = run(resumed, settings, scope=scope)
    assert first.valid, first.errors
    run(resumed, settings, scope=scope)
    assert len(counted) == 4  # confinement asked the project's jobs: validated each time


def test_a_recipe_that_is_not_plain_json_is_validated_each_time(counted, recipe, settings):
    marked = {**recipe, "seed": float("nan")}  # what no JSON body can hold
    run(marked, settings)
    run(marked, settings)
    text = json.dumps(recipe)
    validation_memo.validate_cached(text + "\n", (), None, settings)
    validation_memo.validate_cached(text + "\n", (), None, settings)
    assert len(counted) == 4


def test_at_most_kept_recipes_are_kept(counted, recipe, settings, monkeypatch):
    monkeypatch.setattr(validation_memo, "KEPT", 2)
    for steps in (20, 21, 22):
        changed = copy.deepcopy(recipe)
        changed["step_scheduler"]["max_steps"] = steps
        run(changed, settings)
    assert len(validation_memo._kept) == 2
    run(recipe, settings)  # the oldest went first
    assert len(counted) == 4


def test_kept_answers_are_shared_between_threads(counted, recipe, settings):
    from concurrent.futures import ThreadPoolExecutor

    run(recipe, settings)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: run(recipe, settings), range(32)))
    assert all(r.valid for r in results) and len(counted) == 1
    assert len({id(r.plan) for r in results}) == 32


def test_a_result_that_is_not_plain_json_is_answered_and_not_kept(counted, recipe, settings,
                                                                  monkeypatch):  # fmt: skip
    real = validation_memo.validate_job

    def with_a_set(*args, **kwargs):
        result = real(*args, **kwargs)
        result.plan["odd"] = {1, 2}  # orjson cannot write it (nothing kept if it could)
        return result

    monkeypatch.setattr(validation_memo, "validate_job", with_a_set)
    assert run(recipe, settings).plan["odd"] == {1, 2}
    assert not validation_memo._kept
