"""Hub names at submit: the cache an offline server must have, the config an online one fetches.

A model, tokenizer or dataset field may name a hub repository (`org/name`). A server
configured offline (`RecipeSettings.hub_offline`, which the API reads from `HF_HUB_OFFLINE=1`)
promises its workers cannot download, so submit refuses a hub name whose snapshot is not in
the cache, at the field, with the command that fetches it.

A server that may reach the hub (`RecipeSettings.hub_fetch`, on for the API unless it is
offline) fetches a hub model's `config.json` into its own cache with `huggingface_hub`
(`HF_ENDPOINT`, the operator's token, `HUB_TIMEOUT_S` per request, at most the config cap),
so validation reads the architecture and sizes instead of refusing what it cannot check.
`hub_model_config` returns that file and the commit it came from: validation pins the model
to that commit (`Recipe.hub_revisions`, the plan's `hub_revisions`) and the worker trains that
revision, not whatever `main` is by then. A hub that cannot be reached leaves the config
unknown, as before; a repository that does not exist, is gated, or has no config.json is an
error at the field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jobs.recipe.errors import QUOTE_MAX, FieldError, clip
from jobs.recipe.model.config import CONFIG_FILE_CAP, hub_cache_config, hub_cache_root

# Seconds per hub request at submit: a client waits on it, and an unreachable hub only
# leaves the config unknown.
HUB_TIMEOUT_S = 10.0

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


def hub_model_config(
    name: str, loc: str, fetch: bool
) -> tuple[Path | None, str | None, list[FieldError]]:
    """A hub model's config.json in this server's cache, the commit it came from, and the
    errors at `loc`. With `fetch`, the hub's current commit is asked first (and its config
    downloaded unless cached); the cache answers when the hub cannot."""
    errors: list[FieldError] = []
    if fetch:
        path, commit, errors = _fetch_config(name, loc)
        if path is not None:
            return path, commit, []
    cached = hub_cache_config(name)
    if cached is not None:
        return cached, cached.parent.name, []
    return None, None, errors


def _fetch_config(name: str, loc: str) -> tuple[Path | None, str | None, list[FieldError]]:
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    endpoint = os.environ.get("HF_ENDPOINT") or None  # read now, not at huggingface_hub's import
    shown_name = clip(name, QUOTE_MAX)
    try:
        url = hf_hub_url(name, "config.json", endpoint=endpoint)
        meta = get_hf_file_metadata(url, timeout=HUB_TIMEOUT_S)
        if meta.size is not None and meta.size > CONFIG_FILE_CAP:
            msg = f"hub model {shown_name}'s config.json is {meta.size} bytes (at most {CONFIG_FILE_CAP})"
            return None, None, [FieldError(loc, msg, "name a model repository")]
        path = hf_hub_download(
            name,
            "config.json",
            revision=meta.commit_hash,
            cache_dir=hub_cache_root(),
            endpoint=endpoint,
            etag_timeout=HUB_TIMEOUT_S,
        )
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        what = "is gated" if isinstance(exc, GatedRepoError) else "does not exist"
        msg = f"hub model {shown_name} {what} or this server's token may not read it"
        fix = (
            "check the name, or have the operator give the API a token that may read it (HF_TOKEN)"
        )
        return None, None, [FieldError(loc, msg, fix)]
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status != 404:
            return None, None, []  # the hub failed, not the name: the config stays unknown
        msg = f"hub model {shown_name} has no config.json"
        return None, None, [FieldError(loc, msg, "name a Transformers model repository")]
    except Exception:  # noqa: BLE001 - unreachable hub (DNS, refused, timeout): as offline
        return None, None, []
    return Path(path), meta.commit_hash, []


# Where a recipe names a tokenizer repository apart from its model's (after the AutoModel
# folds, a dataset's tokenizer block is the `tokenizer` section).
TOKENIZER_FIELDS = (
    ("tokenizer", "pretrained_model_name_or_path"),
    ("dataset", "tokenizer_name_or_path"),
    ("validation_dataset", "tokenizer_name_or_path"),
)


def tokenizer_revisions(out: dict[str, Any], pinned: dict[str, str], fetch: bool) -> dict[str, str]:
    """The commit the hub serves now for each tokenizer repository the recipe names that no
    model pin covers: the worker loads the tokenizer at the revision validated, as it does
    the model. Unreachable (or offline): none, and the worker reads its cache."""
    from jobs.recipe.paths.roots import is_hub_name

    names = {
        value
        for section, key in TOKENIZER_FIELDS
        if isinstance(block := out.get(section), dict)
        and isinstance(value := block.get(key), str)
        and is_hub_name(value)
        and value not in pinned
    }
    found = (
        {name: _commit(name, "tokenizer_config.json") for name in sorted(names)} if fetch else {}
    )
    return {name: commit for name, commit in found.items() if commit}


def _commit(name: str, filename: str) -> str | None:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    endpoint = os.environ.get("HF_ENDPOINT") or None
    try:
        url = hf_hub_url(name, filename, endpoint=endpoint)
        return get_hf_file_metadata(url, timeout=HUB_TIMEOUT_S).commit_hash
    except Exception:  # noqa: BLE001 - a hub that fails leaves the tokenizer unpinned
        return None
