"""AutoModel's `wandb.enable` toggle (jobs.recipe.sections.trackers): false turns W&B off
with a warning, true keeps the section; applied after overrides, as AutoModel does."""

from __future__ import annotations

from recipe_asserts import error_at

from jobs.recipe.sections.trackers import tracker_packages

WANDB = {"project": "automodel_convergence_runs", "name": "moonlight", "dir": "wandb-files"}


def test_enable_false_turns_wandb_off(validate, recipe):
    result = validate({**recipe, "wandb": {"enable": False, **WANDB}})
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.wandb is None and tracker_packages(result.recipe) == set()
    [warning] = [w for w in result.warnings if w.loc == "wandb.enable"]
    assert "W&B logging is off" in warning.msg


def test_enable_true_keeps_the_section(validate, recipe):
    result = validate({**recipe, "wandb": {"enable": True, **WANDB}})
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.wandb.project == WANDB["project"]
    assert "wandb.enable" not in [w.loc for w in result.warnings]


def test_an_override_turns_it_back_on(validate, recipe):
    result = validate({**recipe, "wandb": {"enable": False, **WANDB}}, ["wandb.enable=true"])
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.wandb is not None and tracker_packages(result.recipe) == {"wandb"}


def test_enable_must_be_a_bool(validate, recipe):
    error = error_at(validate({**recipe, "wandb": {"enable": "no", **WANDB}}), "wandb.enable")
    assert "true or false" in error.msg
