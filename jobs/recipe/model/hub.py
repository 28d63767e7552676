"""Hub names a server that may not download must already have in its Hugging Face cache.

A model, tokenizer or dataset field may name a hub repository (`org/name`); a worker that
may download fetches it at run time. A server configured offline
(`RecipeSettings.hub_offline`, which the API reads from `HF_HUB_OFFLINE=1`) promises its
workers cannot, so submit refuses a hub name whose snapshot is not in the cache, at the
field, with the command that fetches it. Online, an uncached name is accepted: the worker
downloads it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jobs.recipe.errors import QUOTE_MAX, FieldError, clip
from jobs.recipe.model.config import hub_cache_root

# Dataset keywords that name a model repository (a tokenizer), not a dataset repository.
MODEL_KEYS = {"tokenizer_name_or_path", "pretrained_model_name_or_path"}


def repo_type_of(loc: str) -> str:
    """`dataset` for a dataset section's data keywords; `model` for models and tokenizers."""
    section, _, rest = loc.partition(".")
    key = rest.split(".")[0]
    return (
        "dataset"
        if section in ("dataset", "validation_dataset") and key not in MODEL_KEYS
        else "model"
    )


def is_cached(name: str, repo_type: str, cache: Path | None = None) -> bool:
    snapshots = (
        (cache or hub_cache_root()) / f"{repo_type}s--{name.replace('/', '--')}" / "snapshots"
    )
    # isdir: False, not OSError, for a name too long to be a file name
    return os.path.isdir(snapshots) and any(snapshots.glob("*/*"))


def offline_errors(hub_fields: dict[str, Any], offline: bool) -> list[FieldError]:
    """Errors for the hub names (loc -> name) an offline server has not cached."""
    errors = []
    for loc, name in hub_fields.items() if offline else ():
        repo_type = repo_type_of(loc)
        if not isinstance(name, str) or is_cached(name, repo_type):
            continue
        msg = (
            f"hub {repo_type} {clip(name, QUOTE_MAX)} is not in this server's Hugging Face cache "
            f"({hub_cache_root()}) and the server is offline (HF_HUB_OFFLINE=1)"
        )
        fix = (
            f"fetch it there with `hf download {clip(name, QUOTE_MAX)} --repo-type {repo_type}`, "
            "or give a local path"
        )
        errors.append(FieldError(loc, msg, fix))
    return errors
