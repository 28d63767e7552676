"""AutoModel's losses, optional-package optimizers and AutoConfig (jobs.recipe.targets.specs_automodel)."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at

AM = "nemo_automodel.components.loss"


def _warnings(result) -> dict[str, str]:
    return {w.loc: w.msg for w in result.warnings}


@pytest.mark.parametrize(
    "loss",
    [
        {"_target_": f"{AM}.chunked_ce.ChunkedCrossEntropy", "chunk_len": 64},
        {"_target_": f"{AM}.linear_ce.FusedLinearCrossEntropy", "logit_softcapping": 30.0},
        {"_target_": f"{AM}.te_parallel_ce.TEParallelCrossEntropy", "reduction": "sum"},
    ],
)
def test_automodel_losses_validate_and_store_under_their_names(validate, recipe, loss):
    recipe["loss_fn"] = loss
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.recipe["loss_fn"]["_target_"] == loss["_target_"]


def test_replaced_kernels_and_ignored_keywords_are_warned(validate, recipe):
    recipe["loss_fn"] = {"_target_": f"{AM}.linear_ce.FusedLinearCrossEntropy", "impl": "cce"}
    warnings = _warnings(validate(recipe))
    assert "logits" in warnings["loss_fn"]
    assert warnings["loss_fn.impl"].startswith("accepted and ignored")
    recipe["loss_fn"] = {"_target_": f"{AM}.chunked_ce.ChunkedCrossEntropy", "compile": True}
    assert "torch.compile" in _warnings(validate(recipe))["loss_fn.compile"]


def test_a_loss_keyword_it_does_not_take_is_refused(validate, recipe):
    recipe["loss_fn"] = {"_target_": f"{AM}.te_parallel_ce.TEParallelCrossEntropy", "tp_group": 1}
    assert "takes no argument 'tp_group'" in error_at(validate(recipe), "loss_fn.tp_group").msg


def test_te_fused_adam_keywords_are_checked(validate, recipe):
    recipe["optimizer"] = {
        "_target_": "transformer_engine.pytorch.optimizers.FusedAdam", "lr": 1e-4,
        "master_weigths": True,
    }  # fmt: skip
    assert "master_weights" in error_at(validate(recipe), "optimizer.master_weigths").fix


def test_an_optimizer_is_not_a_loss(validate, recipe):
    recipe["loss_fn"] = {"_target_": "dion.Muon"}
    assert "is a optimizer, not a loss" in error_at(validate(recipe), "loss_fn._target_").msg


@pytest.mark.parametrize(
    ("target", "canonical"),
    [
        ("nemo_automodel._transformers.auto_config.NeMoAutoConfig.from_pretrained",
         "transformers.AutoConfig.from_pretrained"),
        ("transformer_engine.pytorch.optimizers.fused_adam.FusedAdam",
         "transformer_engine.pytorch.optimizers.FusedAdam"),
    ],
)  # fmt: skip
def test_automodel_spellings_resolve(target, canonical):
    from jobs.recipe.targets.allowlist import resolve_target

    assert resolve_target(target, "x").name == canonical


def test_squad_takes_automodels_make_squad_dataset_keywords(validate, recipe):
    recipe["dataset"].update(padding="max_length", truncation=True, fp8=False)
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert {"dataset.padding", "dataset.truncation", "dataset.fp8"} <= set(_warnings(result))
    recipe["dataset"]["fp8"] = "yes"
    error_at(validate(recipe), "dataset.fp8")
