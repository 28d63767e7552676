"""Optional packages a job requires, and the answers for live workers (jobs.recipe.plan.requirements)."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at

from jobs.recipe.plan.requirements import (
    INSTALL,
    importable,
    local_requirement_warnings,
    missing_packages,
    required_packages,
    requirement_errors,
    requirement_sources,
    worker_packages,
)

TE_ADAM = "transformer_engine.pytorch.optimizers.FusedAdam"


def test_a_te_optimizer_requires_transformer_engine_at_its_field(validate, recipe):
    recipe["optimizer"] = {"_target_": TE_ADAM, "lr": 1e-4, "master_weights": True}
    result = validate(recipe, accelerator="cuda")
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["requires"] == {"transformer_engine": "optimizer._target_"}


def test_a_te_optimizer_is_refused_for_a_cpu_job(validate, recipe):
    recipe["optimizer"] = {"_target_": f"{TE_ADAM[:-10]}.fused_adam.FusedAdam", "lr": 1e-4}
    error = error_at(validate(recipe, accelerator="cpu"), "optimizer._target_")
    assert "runs only on CUDA" in error.msg and "the job's accelerator is cpu" in error.msg
    assert "torch.optim.AdamW" in error.fix and "accelerator: cuda" in error.fix


@pytest.mark.parametrize("target", ["flashoptim.FlashAdamW", "dion.Muon", "dion.Dion2"])
def test_optional_optimizers_require_their_package(validate, recipe, target):
    recipe["optimizer"] = {"_target_": target, "lr": 1e-4}
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert list(result.plan["requires"]) == [target.split(".")[0]]


def test_trackers_require_their_packages(validate, recipe):
    recipe["wandb"] = {"project": "p"}
    recipe["mlflow"] = {"experiment_name": "e"}
    assert validate(recipe).plan["requires"] == {"wandb": "wandb", "mlflow": "mlflow"}


def test_a_plain_recipe_requires_nothing(validate, recipe):
    assert validate(recipe).plan["requires"] == {}


def test_nested_targets_are_searched():
    found = requirement_sources({"model": {"config": {"_target_": TE_ADAM}}, "peft": None})
    assert found == {"transformer_engine": "model.config._target_"}
    assert required_packages({"x": [{"_target_": "dion.Muon"}]}) == ["dion"]


def test_live_workers_without_the_package_refuse_it_with_the_install_command():
    errors, warnings = requirement_errors(
        {"transformer_engine": "optimizer._target_"}, "gpu-8", [["wandb"], []]
    )
    assert warnings == []
    [err] = errors
    assert err.loc == "optimizer._target_"
    assert err.msg == "needs transformer_engine: no worker of queue gpu-8 has transformer_engine"
    assert INSTALL["transformer_engine"] in err.fix


def test_one_live_worker_with_it_is_enough():
    assert requirement_errors({"wandb": "wandb"}, "cpu", [[], ["wandb"]]) == ([], [])


def test_no_live_worker_accepts_with_a_warning():
    errors, [warning] = requirement_errors({"dion": "optimizer._target_"}, "gpu-2", [])
    assert errors == [] and warning.loc == "optimizer._target_"
    assert "no worker of queue gpu-2 is live" in warning.msg


def test_what_this_interpreter_has():
    assert importable("json") and not importable("no_such_package_xyz")
    assert not importable("..")  # a bad name is not importable, never an exception
    assert set(worker_packages(["json", "no_such_package_xyz"])) == {"json"}
    assert missing_packages({"a": "x", "b": "y"}, ["b"]) == ["a"]
    [warning] = local_requirement_warnings({"no_such_package_xyz": "optimizer._target_"})
    assert "this interpreter cannot import" in warning.msg
    assert local_requirement_warnings({"json": "x"}) == []


def test_targets_are_found_under_lists_tuples_and_deep_mappings_in_document_order():
    from jobs.recipe.targets.allowlist import target_locations, target_mappings

    section = {
        "a": 1, "b": None, "c": "x", "d": 2.5, "e": True,
        "list": [0, {"_target_": "dion.Muon"}, ["s", {"inner": {"_target_": TE_ADAM}}]],
        "tup": ({"_target_": "flashoptim.FlashAdamW"},),
        "odd": {"_target_": ["not", "a", "name"]},  # not a name: found, requires nothing
    }  # fmt: skip
    assert target_locations(section, "opt") == [
        "opt.list.1", "opt.list.2.1.inner", "opt.tup.0", "opt.odd",
    ]  # fmt: skip
    assert target_locations({"x": {"_target_": "t"}}, "") == ["x"]
    assert [m["_target_"] for _, m in target_mappings(section, "opt")][:2] == ["dion.Muon", TE_ADAM]
    assert requirement_sources({"optimizer": section}) == {
        "dion": "optimizer.list.1._target_",
        "transformer_engine": "optimizer.list.2.1.inner._target_",
        "flashoptim": "optimizer.tup.0._target_",
    }


def test_flash_attention_2_requires_flash_attn(validate, recipe):
    recipe["model"]["attn_implementation"] = "flash_attention_2"
    requires = validate(recipe, accelerator="cuda").plan["requires"]
    assert requires == {"flash_attn": "model.attn_implementation"}
