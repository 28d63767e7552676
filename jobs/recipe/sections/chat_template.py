"""A dataset's `chat_template` given as a file: read once, at submit, from the data roots.

AutoModel's datasets take `chat_template` as the Jinja text or as a path to a template file
(a `.jinja` file, or a JSON file such as `tokenizer_config.json` whose `chat_template` key
holds the text). tuneyard reads such a file while it validates, under the data-path rules
every recipe path follows (inside the data roots, through symlinks too; with a scope, not
in another project's checkpoints or runs; a regular file of at most `TEMPLATE_FILE_MAX`
bytes, never more read) and puts the template text in the recipe in its place, so the
stored job carries the text and the trainer opens no file for it. A later edit of the file
therefore does not reach a job already submitted; a warning says which file was read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobs.recipe.errors import FieldError, shown
from jobs.recipe.paths.data import spec_of
from jobs.recipe.paths.roots import check_path, read_bounded
from jobs.recipe.paths.scope import JobScope, confinement_errors, foreign_project_errors
from jobs.recipe.settings import RecipeSettings

# A template file's size cap: a tokenizer_config.json with a large added-token table is a
# few hundred KB; the template itself is capped by the dataset's value model.
TEMPLATE_FILE_MAX = 1 << 20
JINJA_MARKS = ("{{", "{%")
FIX = "give the Jinja template text, or the path of a template file inside the data roots"
INLINE_OR = "give the Jinja template text ({{ or {%), or as a file path:"


def is_inline_template(value: str) -> bool:
    """Jinja text, as AutoModel tells it from a path: it has `{{` or `{%`."""
    return any(mark in value for mark in JINJA_MARKS)


def _takes_chat_template(section: dict[str, Any]) -> bool:
    """The dataset callable takes `chat_template` (else the allowlist answers for the key)."""
    spec = spec_of(section)
    return spec is not None and spec.params is not None and "chat_template" in spec.params


def _template_text(data: bytes, loc: str, name: str) -> tuple[str | None, list[FieldError]]:
    """The template in a file's bytes: the text, or a JSON file's `chat_template` string."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, [FieldError(loc, f"{name} is not UTF-8 text", FIX)]
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and "chat_template" in parsed:
        text = parsed["chat_template"]
        if not isinstance(text, str):
            msg = f"{name}'s chat_template is not one template text (a list of named ones?)"
            return None, [FieldError(loc, msg, FIX)]
    if not is_inline_template(text):
        return None, [FieldError(loc, f"{name} holds no Jinja template ({{{{ or {{%)", FIX)]
    return text, []


def _template_file(
    value: str, where: str, settings: RecipeSettings, scope: JobScope | None
) -> tuple[Path | None, list[FieldError]]:
    """The file a template path names, under every rule a recipe's data path follows."""
    roots, runs = settings.allowed_data_roots(), settings.resolved_runs_dir
    errors = foreign_project_errors(value, where, settings.allowed_checkpoint_roots(), runs, scope)
    if errors:
        return None, errors
    check = check_path(value, where, roots, allow_hub=False)
    # Not Jinja text, so maybe the text was meant: the fix says both ways.
    errors = [FieldError(e.loc, e.msg, f"{INLINE_OR} {e.fix}") for e in check.errors]
    if check.path is not None:
        errors += confinement_errors(check.path, where, runs, scope)
    return (None, errors) if errors else (check.path, [])


def read_chat_template(
    section: dict[str, Any],
    loc: str,
    settings: RecipeSettings,
    scope: JobScope | None = None,
) -> tuple[list[FieldError], list[FieldError]]:
    """Replace a dataset section's template path by the file's text, in place:
    (errors, warnings). Inline text, or a dataset that takes no template, is left as is."""
    value = section.get("chat_template")
    if not isinstance(value, str) or is_inline_template(value):
        return [], []
    if not _takes_chat_template(section):
        return [], []
    where = f"{loc}.chat_template"
    path, errors = _template_file(value, where, settings, scope)
    data = None
    if path is not None:
        data, errors = read_bounded(path, where, settings.allowed_data_roots(), TEMPLATE_FILE_MAX)
    text, errs = (None, []) if data is None else _template_text(data, where, shown(str(path)))
    if text is None:  # one answer at the field, not the value model's too
        section.pop("chat_template")
        return errors + errs, []
    section["chat_template"] = text
    msg = (
        f"read from {shown(str(path))} at submit ({len(text)} characters): the job carries "
        "the template text, so a later edit of the file does not reach it"
    )
    return [], [FieldError(where, msg)]
