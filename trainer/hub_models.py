"""Hub models at the commit validation read: each pinned name becomes that snapshot's directory.

Validation reads a hub model's config at submit and pins the job to the commit it read
(`Recipe.hub_revisions`, name -> commit). Before anything is built, `pin_hub_models` turns
each pinned name into the local directory of that commit's snapshot, wherever the recipe
names it (the model, a KD teacher, the tokenizer section, a dataset's tokenizer): the model,
its tokenizer and the exported base all come from the revision that was validated, whatever
the repository's `main` is by now. A repository named only as a tokenizer is fetched without
its weights. Online, each node's first rank downloads the snapshot's
model files (the others wait at a barrier, then read the cache); offline (`HF_HUB_OFFLINE`)
the snapshot must already be in the cache. A failure is a `data_error` naming the model, the
commit and the fix.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from jobs.recipe.typed import Recipe, TargetCall
from trainer.data.hub import hub_cache_dir, offline_var
from trainer.errors import data_error

# What loading a model and its tokenizer reads; no pickled weights unless the recipe asked.
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "*.py"]
# What a repository named only as a tokenizer is read for: no weights.
TOKENIZER_FILES = [p for p in MODEL_FILES if p != "*.safetensors"]
# Keywords that name a model or tokenizer repository, in the sections that can hold them.
NAME_KEYS = ("pretrained_model_name_or_path", "tokenizer_name_or_path", "config")
SECTIONS = ("model", "teacher_model", "tokenizer", "dataset", "validation_dataset")


def pin_hub_models(recipe: Recipe, local_rank: int = 0) -> Recipe:
    """`recipe` with every pinned hub name replaced by its snapshot directory."""
    calls = [call for name in SECTIONS if (call := getattr(recipe, name)) is not None]
    named = {v for call in calls for v in _names(call.kwargs)}
    # Only names the recipe still holds: a run rebuilt after a rollback is already pinned.
    pins = {n: c for n, c in recipe.hub_revisions.items() if n in named}
    if not pins:
        return recipe
    weights = [*MODEL_FILES, "*.bin"] if recipe.pickled_weights else MODEL_FILES
    models = {
        v
        for name in ("model", "teacher_model")
        if (call := getattr(recipe, name))
        for v in _names(call.kwargs)
    }
    patterns = {n: weights if n in models else TOKENIZER_FILES for n in pins}
    if local_rank == 0:
        local = {n: _snapshot(n, c, patterns[n]) for n, c in pins.items()}
    _barrier()
    if local_rank != 0:  # the node's first rank has fetched them: read the cache only
        local = {n: _snapshot(n, c, patterns[n], True) for n, c in pins.items()}
    changes = {
        name: _with_local(call, local)
        for name in SECTIONS
        if (call := getattr(recipe, name)) is not None
    }
    return dataclasses.replace(recipe, **changes)


def _names(kwargs: dict[str, Any]) -> list[str]:
    """The repository names a section's keywords hold (a nested AutoConfig's too)."""
    found = []
    for key in NAME_KEYS:
        value = kwargs.get(key)
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            found += [v for k, v in value.items() if k in NAME_KEYS and isinstance(v, str)]
    return found


def _with_local(call: TargetCall, local: dict[str, Path]) -> TargetCall:
    kwargs: dict[str, Any] = dict(call.kwargs)
    for key in NAME_KEYS:
        value = kwargs.get(key)
        if isinstance(value, str) and value in local:
            kwargs[key] = str(local[value])
        elif isinstance(value, dict):  # a nested AutoConfig section names the model too
            kwargs[key] = {
                k: str(local[v]) if k in NAME_KEYS and isinstance(v, str) and v in local else v
                for k, v in value.items()
            }
    return dataclasses.replace(call, kwargs=kwargs)


def _snapshot(name: str, commit: str, patterns: list[str], cache_only: bool = False) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = offline_var()
    try:
        path = snapshot_download(
            name,
            revision=commit,
            cache_dir=hub_cache_dir(),
            allow_patterns=patterns,
            local_files_only=cache_only or offline is not None,
            endpoint=os.environ.get("HF_ENDPOINT") or None,
        )
    except LocalEntryNotFoundError:
        why = f"{offline}=1 forbids downloading it" if offline else "it could not be fetched"
        raise data_error(
            f"model: {name} at commit {commit} (the revision validated at submit) is not in "
            f"this worker's Hugging Face cache ({hub_cache_dir()}) and {why}; fetch it with "
            f"`hf download {name} --revision {commit}`"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise data_error(
            f"model: cannot fetch {name} at commit {commit} from the Hugging Face hub ({exc}); "
            "check the worker's network and token, or put the snapshot in its cache"
        ) from None
    return Path(path)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
