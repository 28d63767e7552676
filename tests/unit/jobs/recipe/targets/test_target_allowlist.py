"""`_target_` resolution through the allowlist (issue 2, section 3)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
from recipe_asserts import error_at, locs

from jobs.recipe.errors import RecipeInvalid
from jobs.recipe.load.schema import PeftSection
from jobs.recipe.targets import allowlist as targets
from jobs.recipe.targets.allowlist import (
    TARGETS,
    TargetSpec,
    instantiate,
    load_callable,
    resolve_target,
)
from jobs.recipe.typed import TargetCall

REFUSED = [
    "os.system",
    "subprocess.run",
    "subprocess.Popen",
    "builtins.eval",
    "builtins.exec",
    "builtins.__import__",
    "eval",
    "torch.load",
    "pickle.loads",
    "evil.py:run",
    "/tmp/evil.py:run",
    "torch.optim:AdamW",
    "torch.optim.AdamW.__init__",
    "torch.optim.AdamW.__class__",
    "torch.optim._functional.adamw",
    "tuneyard_canary_module.build",
    "torch.optim.AdamWW",
]


@pytest.mark.parametrize("name", REFUSED)
def test_refused_targets_are_errors_at_section_target(validate, recipe, name, monkeypatch):
    imported = []
    monkeypatch.setattr(importlib, "import_module", lambda n, *a: imported.append(n))
    recipe["optimizer"]["_target_"] = name
    result = validate(recipe)
    assert "optimizer._target_" in locs(result)
    assert imported == []  # never imported
    assert "tuneyard_canary_module" not in sys.modules


def test_refusal_says_why(validate, recipe):
    recipe["optimizer"]["_target_"] = "os.system"
    assert "arbitrary" in error_at(validate(recipe), "optimizer._target_").msg
    recipe["optimizer"]["_target_"] = "evil.py:run"
    assert "file" in error_at(validate(recipe), "optimizer._target_").msg
    recipe["optimizer"]["_target_"] = "torch.optim.AdamW.__init__"
    assert "private" in error_at(validate(recipe), "optimizer._target_").msg


def test_typo_in_target_suggests_the_allowed_name(validate, recipe):
    recipe["optimizer"]["_target_"] = "torch.optim.AdamWW"
    assert "torch.optim.AdamW" in error_at(validate(recipe), "optimizer._target_").fix


def test_missing_target_is_an_error(validate, recipe):
    del recipe["optimizer"]["_target_"]
    error_at(validate(recipe), "optimizer._target_")


def test_unknown_kwarg_is_an_error_at_its_path_with_did_you_mean(validate, recipe):
    recipe["optimizer"]["lrr"] = 1e-4
    assert "'lr'" in error_at(validate(recipe), "optimizer.lrr").fix


def test_injected_kwarg_in_recipe_is_an_error(validate, recipe):
    recipe["optimizer"]["params"] = []
    recipe["lr_scheduler"]["optimizer"] = "x"
    result = validate(recipe)
    error_at(result, "optimizer.params")
    error_at(result, "lr_scheduler.optimizer")


def test_required_kwarg_missing_is_an_error(validate, recipe):
    del recipe["dataset"]["path_or_dataset"]
    error_at(validate(recipe), "dataset.path_or_dataset")


def test_target_of_the_wrong_kind_is_an_error(validate, recipe):
    recipe["optimizer"] = {
        "_target_": "tuneyard.datasets.MockDataset",
        "vocab_size": 8,
        "seq_length": 8,
    }
    assert "not a optimizer" in error_at(validate(recipe), "optimizer._target_").msg


def test_nested_target_is_checked(validate, recipe):
    recipe["loss_fn"] = {
        "_target_": "torch.nn.CrossEntropyLoss",
        "reduction": {"_target_": "os.getenv"},
    }
    error_at(validate(recipe), "loss_fn.reduction._target_")


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        (
            "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
            "tuneyard.models.AutoModelForCausalLM.from_pretrained",
        ),
        (
            "nemo_automodel.components._transformers.auto_model.NeMoAutoModelForCausalLM.from_config",
            "tuneyard.models.AutoModelForCausalLM.from_config",
        ),
        ("nemo_automodel.datasets.squad.SquadDataset", "tuneyard.datasets.SquadDataset"),
        (
            "nemo_automodel.components.datasets.llm.squad.make_squad_dataset",
            "tuneyard.datasets.SquadDataset",
        ),
        (
            "nemo_automodel.schedulers.CosineAnnealingWarmup",
            "tuneyard.schedulers.CosineAnnealingWarmup",
        ),
        (
            "nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy",
            "tuneyard.loss.MaskedCrossEntropy",
        ),
        ("torch.nn.modules.loss.CrossEntropyLoss", "torch.nn.modules.loss.CrossEntropyLoss"),
    ],
)
def test_nemo_automodel_names_are_aliases_of_ours(alias, canonical):
    assert resolve_target(alias, "x._target_") is TARGETS[canonical]


def test_resolve_target_raises_recipe_invalid_with_the_loc():
    with pytest.raises(RecipeInvalid) as info:
        resolve_target("os.system", "model._target_")
    assert [e.loc for e in info.value.errors] == ["model._target_"]


def test_load_callable_refuses_specs_not_in_the_table():
    forged = TargetSpec("os.system", "os:system", "optimizer", frozenset())
    with pytest.raises(RecipeInvalid):
        load_callable(forged)


def test_instantiate_builds_an_allowlisted_target():
    lora = instantiate(TargetCall("tuneyard.peft.LoraConfig", {"dim": 4}), "peft")
    assert isinstance(lora, PeftSection) and lora.dim == 4


@pytest.mark.parametrize("name", ["os.system", "builtins.eval", "torch.optim.AdamW.__init__"])
def test_instantiate_resolves_only_allowlisted_names_and_imports_nothing_else(name, monkeypatch):
    """A stored recipe is not checked again, but every name still goes through the table."""
    monkeypatch.setattr(importlib, "import_module", lambda *a: pytest.fail("imported"))
    with pytest.raises(RecipeInvalid) as info:
        instantiate(TargetCall(name, {}), "optimizer")
    assert [e.loc for e in info.value.errors] == ["optimizer._target_"]


def test_instantiate_refuses_a_nested_name_off_the_allowlist(monkeypatch):
    spec = TargetSpec(
        "test.Record", "builtins:dict", "loss", frozenset({"inner"}), nested={"inner": {"loss"}}
    )
    monkeypatch.setitem(targets.TARGETS, "test.Record", spec)
    monkeypatch.setattr(targets, "_ALLOWED_SPECS", targets._ALLOWED_SPECS | {spec})
    with pytest.raises(RecipeInvalid) as info:
        instantiate(TargetCall("test.Record", {"inner": {"_target_": "os.system"}}), "loss_fn")
    assert [e.loc for e in info.value.errors] == ["loss_fn.inner._target_"]


def test_instantiate_is_recursive_and_passes_only_declared_injections(monkeypatch):
    spec = TargetSpec(
        "test.Record",
        "builtins:dict",
        "loss",
        frozenset({"inner", "n"}),
        injected=frozenset({"tokenizer"}),
        nested={"inner": frozenset({"loss"})},
    )
    monkeypatch.setitem(targets.TARGETS, "test.Record", spec)
    monkeypatch.setattr(targets, "_ALLOWED_SPECS", targets._ALLOWED_SPECS | {spec})
    section = {"_target_": "test.Record", "inner": {"_target_": "test.Record", "n": 1}}
    call = TargetCall.from_json(section)
    built = instantiate(call, "loss_fn", tokenizer="tok", optimizer="not declared", n=5)
    assert built == {"inner": {"n": 1}, "tokenizer": "tok", "n": 5}


def test_torch_specs_match_the_real_signatures():
    """The static params lists are what torch's callables accept (torch imported here only)."""
    import inspect

    for spec in {s for s in TARGETS.values() if s.import_path.startswith("torch.")}:
        accepted = set(inspect.signature(load_callable(spec)).parameters)
        assert spec.params is not None and spec.params <= accepted, spec.name
        assert spec.injected <= accepted, spec.name
        if spec.kind in ("optimizer", "lr_scheduler"):  # every keyword, nothing left out
            assert spec.params | spec.injected == accepted, spec.name


def test_automodel_squad_kwargs_fold_onto_ours(validate, recipe, squad_dir):
    recipe["dataset"] = {
        "_target_": "nemo_automodel.components.datasets.llm.squad.make_squad_dataset",
        "dataset_name": str(squad_dir),
        "seq_length": 64,
        "split": "train",
    }
    dataset = validate(recipe).recipe["dataset"]
    assert dataset["path_or_dataset"] == str(squad_dir) and dataset["max_seq_length"] == 64
    assert "dataset_name" not in dataset


def test_conflicting_kwarg_synonyms(validate, recipe, squad_dir):
    recipe["dataset"]["dataset_name"] = "org/other"
    error_at(validate(recipe), "dataset.dataset_name")


def _custom_code_dir(root: Path) -> Path:
    """A model directory whose config asks for its own Python; running it leaves a marker."""
    model = root / "evil"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["EvilForCausalLM"], "model_type": "evil",
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.Evil"},
    }))  # fmt: skip
    marker = root / "RAN"
    (model / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    return model


def test_a_loader_nested_in_a_plain_field_is_refused_and_never_built(validate, recipe, data_root):
    model = _custom_code_dir(data_root)
    loader = {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
              "pretrained_model_name_or_path": str(model), "trust_remote_code": True}  # fmt: skip
    recipe["optimizer"]["weight_decay"] = loader
    result = validate(recipe)
    assert not result.valid and "optimizer.weight_decay._target_" in locs(result)
    import torch

    # A tampered stored recipe: a `_target_` where none is built stays a plain value, which
    # the optimizer refuses; the loader is never imported nor its code run.
    tampered = TargetCall.from_json(recipe["optimizer"])
    with pytest.raises((TypeError, ValueError)):
        instantiate(tampered, "optimizer", params=[torch.nn.Parameter(torch.zeros(1))])
    assert not (data_root / "RAN").exists()


ADAMW = {"_target_": "torch.optim.AdamW", "lr": 1.0}


@pytest.mark.parametrize(
    ("section", "key", "value", "where"),
    [("qat", "quantizer", ADAMW, "qat.quantizer._target_"),
     ("dataset", "split", [ADAMW], "dataset.split.0._target_"),
     ("lr_scheduler", "min_lr", {"a": {"b": ADAMW}}, "lr_scheduler.min_lr.a.b._target_"),
     ("model", "config", ADAMW, "model.config._target_")],
)  # fmt: skip
def test_a_target_anywhere_the_schema_takes_a_value_is_refused_at_its_path(
    validate, recipe, section, key, value, where
):
    recipe.setdefault(section, {})[key] = value
    assert where in locs(validate(recipe))


def test_a_nested_target_of_the_wrong_kind_is_refused(monkeypatch):
    spec = TargetSpec("test.Holder", "builtins:dict", "loss", frozenset({"inner"}),
                      nested={"inner": frozenset({"loss"})})  # fmt: skip
    monkeypatch.setitem(targets.TARGETS, "test.Holder", spec)
    section = {"_target_": "test.Holder", "inner": {"_target_": "torch.optim.AdamW", "lr": 1.0}}
    _, errors = targets.check_target_section(section, "loss_fn")
    assert [e.loc for e in errors] == ["loss_fn.inner._target_"]
    assert "takes a loss" in errors[0].msg
