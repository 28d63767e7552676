"""Whether a recipe's datasets get the tokenizer their builders take.

A dataset whose builder is handed the trainer's tokenizer (`TargetSpec.injected`) needs one
from somewhere: the `tokenizer:` section, a dataset's or the model's
`tokenizer_name_or_path`, the model's own directory (`pretrained_model_name_or_path`), or,
for a model built from a config, where that config is read from (`config` as a directory
or hub name, or its nested `pretrained_model_name_or_path`), as AutoModel finds it
(`Recipe.tokenizer_source`). A config written inline has no tokenizer files, so such a
recipe with none of the others would stop in the trainer before its first step; it is
refused here, at `tokenizer`, with the ways to give one.
"""

from __future__ import annotations

from typing import Any

from jobs.recipe.errors import FieldError, shown
from jobs.recipe.targets.table import TARGETS

DATASET_SECTIONS = ("dataset", "validation_dataset")


def _text(section: dict[str, Any], key: str) -> str | None:
    value = section.get(key)
    return str(value) if value not in (None, "") and not isinstance(value, dict) else None


def config_source(config: Any) -> str | None:
    """The directory or hub name a `from_config` model's config is read from: `config`
    given as one, or a nested config target's `pretrained_model_name_or_path`."""
    if isinstance(config, str) and config:
        return config
    return _text(config, "pretrained_model_name_or_path") if isinstance(config, dict) else None


def tokenizer_source(model: dict[str, Any], datasets: list[dict[str, Any]]) -> str | None:
    """Where the tokenizer loads from without a `tokenizer:` section, given the model's and
    the datasets' keywords: a dataset's (or the model's) `tokenizer_name_or_path`, else the
    model's own files, else where its config is read from. The one rule the submit check
    and the trainer (`Recipe.tokenizer_source`) share."""
    for section in (*datasets, model):
        if source := _text(section, "tokenizer_name_or_path"):
            return source
    return _text(model, "pretrained_model_name_or_path") or config_source(model.get("config"))


def _section(out: dict[str, Any], name: str) -> dict[str, Any]:
    value = out.get(name)
    return value if isinstance(value, dict) else {}


def _has_source(out: dict[str, Any]) -> bool:
    datasets = [_section(out, name) for name in DATASET_SECTIONS]
    return bool(_section(out, "tokenizer")) or bool(
        tokenizer_source(_section(out, "model"), datasets)
    )


def tokenizer_errors(out: dict[str, Any]) -> list[FieldError]:
    """One error at `tokenizer` when a dataset needs a tokenizer and nothing gives one."""
    if _has_source(out):
        return []
    for name in DATASET_SECTIONS:
        target = _section(out, name).get("_target_")
        spec = TARGETS.get(target) if isinstance(target, str) else None
        if spec is not None and "tokenizer" in spec.injected:
            return [
                FieldError(
                    "tokenizer",
                    f"{name} ({shown(target)}) needs a tokenizer, and the model is built "
                    "from a config written in the recipe, which has no tokenizer files",
                    "add a tokenizer section (tokenizer: {_target_: "
                    "tuneyard.tokenizers.AutoTokenizer.from_pretrained, "
                    "pretrained_model_name_or_path: <a directory with tokenizer files>}) or "
                    f"{name}.tokenizer_name_or_path",
                )
            ]
    return []
