"""Hub datasets: a recipe's `org/name` turned into rows, from the Hugging Face hub or its cache.

A dataset field that names no local file or directory but reads as a hub name (the same rule
`jobs.recipe.paths.roots` validates with) is resolved here: `snapshot_download` finds the repo's
snapshot directory (downloading it when online; only the local cache when `HF_HUB_OFFLINE` or
`HF_DATASETS_OFFLINE` is set), and `datasets.load_dataset` reads one split of it (`train`,
`validation`, or a slice such as `train[:100]`). Loading the snapshot directory rather than the
bare name is what makes the offline cache work. Every failure is a
`TrainerError(DATA_ERROR)` naming the dataset and what to do. `datasets` is imported only here,
inside the functions, because importing it costs seconds that local-file runs need not pay.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jobs.recipe.paths.roots import is_hub_name
from trainer.errors import data_error

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_TRUE = {"1", "ON", "YES", "TRUE"}


def is_hub_dataset(value: str) -> bool:
    """`org/name` that is not an existing local path: local files always win, as in validation."""
    return is_hub_name(value) and not Path(value).expanduser().exists()


def offline_var() -> str | None:
    """The environment variable that forbids downloads, if one is set."""
    for var in OFFLINE_VARS:
        if os.environ.get(var, "").strip().upper() in _TRUE:
            return var
    return None


def _hf_home() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return Path(os.environ.get("HF_HOME") or default).expanduser()


def hub_cache_dir() -> Path:
    """Where hub snapshots live, read from the environment now.

    huggingface_hub reads these variables once at import; reading them per call lets a
    process (and a test) that sets `HF_HOME` after that import still find its cache.
    """
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    return Path(hub).expanduser() if hub else _hf_home() / "hub"


def datasets_cache_dir() -> Path:
    """Where `datasets` writes the Arrow files it builds from a snapshot."""
    cache = os.environ.get("HF_DATASETS_CACHE")
    return Path(cache).expanduser() if cache else _hf_home() / "datasets"


def snapshot_dir(name: str, revision: str | None = None) -> Path:
    """The local snapshot directory of dataset repo `name` (at `revision`, the default
    branch when None), downloaded first when online."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    offline = offline_var()
    cache = hub_cache_dir()
    try:
        path = snapshot_download(
            repo_id=name,
            repo_type="dataset",
            revision=revision,
            cache_dir=cache,
            local_files_only=offline is not None,
        )
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise data_error(
            f"dataset: {name} is not a dataset on the Hugging Face hub or needs access "
            f"({type(exc).__name__}); check the name, or log in with a token that may read it"
        ) from None
    except LocalEntryNotFoundError as exc:
        raise data_error(_not_cached(name, cache, offline, exc)) from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise data_error(f"dataset: cannot fetch {name} from the Hugging Face hub: {exc}") from None
    return Path(path)


def _not_cached(name: str, cache: Path, offline: str | None, exc: Exception) -> str:
    where = f"dataset: {name} is not in the local Hugging Face cache ({cache})"
    fetch = f"`hf download {name} --repo-type dataset` on a machine with network"
    if offline:
        return f"{where} and {offline}=1 forbids downloading it; fetch it with {fetch}"
    return f"{where} and the hub could not be reached ({exc}); fetch it with {fetch}"


def load_hub_rows(name: str, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The rows of one split of hub dataset `name` (at most `limit` of them), as plain dicts."""
    snapshot = snapshot_dir(name)
    try:
        import datasets
    except ImportError:
        raise data_error(
            f"dataset: reading hub dataset {name} needs the `datasets` package; "
            "install tuneyard[train]"
        ) from None
    # one line per split built is noise in the run log the worker keeps
    datasets.disable_progress_bars()
    try:
        table = datasets.load_dataset(
            str(snapshot), split=split, cache_dir=str(datasets_cache_dir())
        )
    except (ValueError, OSError, datasets.exceptions.DatasetsError) as exc:
        # unknown split, several configs and no default, no data files, unreadable files
        raise data_error(
            f"dataset: cannot read split {split!r} of {name} ({snapshot}): {exc}"
        ) from None
    if limit is not None:
        table = table.select(range(min(limit, len(table))))
    return table.to_list()
