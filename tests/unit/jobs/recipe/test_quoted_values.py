"""An error quotes a user's value cut to `QUOTE_MAX` characters (`jobs.recipe.errors.shown`):
a recipe with a 5,000-character value in a field gets an answer of a few hundred characters
that does not repeat the value, whichever check refuses it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from jobs.recipe.errors import QUOTE_MAX
from jobs.recipe.validation import validate_job

LONG = "Long" + "v" * 4_996
TEXT_MAX = 400  # characters of a msg or fix that quotes the long value
TEACHER = {
    "_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
    "pretrained_model_name_or_path": "org/teacher",
}
Edit = Callable[[dict[str, Any], Path], None]


def _set(path: str, value: Any) -> Edit:
    """Sets the dotted `path` of the recipe (sections made as needed) to `value`, or to
    `value(data_root)` when it is callable."""

    def edit(recipe: dict[str, Any], data_root: Path) -> None:
        *parents, last = path.split(".")
        section = recipe
        for key in parents:
            section = section.setdefault(key, {})
        section[last] = value(data_root) if callable(value) else value

    return edit


def _kd(key: str, value: Any) -> Edit:
    def edit(recipe: dict[str, Any], data_root: Path) -> None:
        recipe.update(recipe="llm_kd", teacher_model=dict(TEACHER), **{key: value})

    return edit


def _in_data_root(data_root: Path) -> str:
    return f"{data_root}/{LONG}"


class Case(NamedTuple):
    loc: str  # where the error that quotes the value is
    edit: Edit
    fix_max: int = TEXT_MAX
    offline: bool = False  # a server without hub access (hub names must be cached)


CASES = {
    # The fix of an unknown `_target_` lists the whole allowlist: ours, not the user's.
    "unknown _target_": Case("model._target_", _set("model._target_", LONG), fix_max=2_000),
    "strategy": Case("distributed.strategy", _set("distributed.strategy", LONG)),
    "strategy manager": Case("distributed._target_", _set("distributed._target_", LONG)),
    "activation checkpointing": Case(
        "distributed.activation_checkpointing", _set("distributed.activation_checkpointing", LONG)
    ),
    "optimizer lr": Case("optimizer.lr", _set("optimizer.lr", LONG)),
    "optimizer keyword": Case(f"optimizer.{LONG}", _set(f"optimizer.{LONG}", 1)),
    "scheduler warmup": Case("lr_scheduler.warmup_steps", _set("lr_scheduler.warmup_steps", LONG)),
    "model dtype": Case("model.dtype", _set("model.dtype", LONG)),
    "attention": Case("model.attn_implementation", _set("model.attn_implementation", LONG)),
    "model path": Case(
        "model.pretrained_model_name_or_path",
        _set("model.pretrained_model_name_or_path", _in_data_root),
    ),
    "uncached hub model": Case(
        "model.pretrained_model_name_or_path",
        _set("model.pretrained_model_name_or_path", f"org/{LONG}"),
        offline=True,
    ),
    "dataset path": Case("dataset.path_or_dataset", _set("dataset.path_or_dataset", _in_data_root)),
    "checkpoint dir": Case("checkpoint.checkpoint_dir", _set("checkpoint.checkpoint_dir", LONG)),
    "checkpoint format": Case(
        "checkpoint.model_save_format", _set("checkpoint.model_save_format", LONG)
    ),
    "kd ratio": Case("kd_ratio", _kd("kd_ratio", LONG)),
    "kd temperature": Case(
        "kd_loss_fn.temperature",
        _kd("kd_loss_fn", {"_target_": "tuneyard.loss.KDLoss", "temperature": LONG}),
    ),
    "wandb id": Case("wandb.id", _set("wandb.id", LONG)),
    "wandb save_dir": Case("wandb.save_dir", _set("wandb.save_dir", f"../{LONG}")),
    "mlflow tracking_uri": Case(
        "mlflow.tracking_uri", _set("mlflow.tracking_uri", f"http:///{LONG}")
    ),
    "recipe name": Case("recipe", _set("recipe", LONG)),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_long_value_is_quoted_short(recipe, settings, data_root, case):
    case.edit(recipe, data_root)
    result = validate_job(
        recipe, (), None, settings.model_copy(update={"hub_offline": case.offline})
    )
    assert not result.valid
    assert any(error.loc.startswith(case.loc[:100]) for error in result.errors), [
        str(error)[:200] for error in result.errors
    ]
    too_long = [
        f"{error.loc[:100]}: {text[:150]} ({len(text)} characters)"
        for error in result.errors
        for text, most in ((error.msg, TEXT_MAX), (error.fix, case.fix_max))
        if len(text) > most or "v" * QUOTE_MAX in text
    ]
    assert not too_long, too_long
