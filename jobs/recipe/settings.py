"""The settings recipe validation reads: where a recipe may read data and keep checkpoints.

`RecipeSettings` comes from `TUNEYARD_*` environment variables: the tuneyard home, the runs
directory and the filesystem roots a recipe may name. The services' own settings (database,
broker, auth) extend it in `jobs.store.settings`, so one object serves both, and the
contract never needs to know about a database.

The home holds the embedded database (with API key hashes) and broker, so it is never
inside a default root: without `TUNEYARD_DATA_ROOTS` / `TUNEYARD_CHECKPOINT_ROOTS` a recipe
may name the working directory (unless the home lies in it) and the demo's directory in the
home, nothing else of the home but the runs directory.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "tuneyard"


# The home's one directory of recipe inputs: `tuneyard demo` builds its model and data there.
HOME_DATA_DIRS = ("demo",)


def _holds(outer: Path, inner: Path) -> bool:
    """`inner` is `outer` or lies under it, symlinks resolved."""
    outer_real, inner_real = Path(os.path.realpath(outer)), Path(os.path.realpath(inner))
    return outer_real == inner_real or outer_real in inner_real.parents


def _split_roots(value: str | None) -> list[Path]:
    return list(_roots_of(value)) if value else []


@lru_cache(maxsize=64)
def _roots_of(value: str) -> tuple[Path, ...]:
    # Asked several times per validation, of the same few settings values.
    return tuple(Path(p).expanduser() for p in value.split(os.pathsep) if p.strip())


def _hub_offline_env() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_offline_from_env() -> Any:
    """A `hub_offline` field whose default is the process's HF_HUB_OFFLINE (for servers)."""
    return Field(default_factory=_hub_offline_env)


class RecipeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNEYARD_", extra="ignore")

    home: Path = Field(default_factory=_default_home)
    data_roots: str | None = None
    checkpoint_roots: str | None = None
    runs_dir: Path | None = None
    # The operator's decision (CLI, single-tenant servers): a recipe may load a model
    # directory's own Python (`model.trust_remote_code: true`). Off by default.
    allow_remote_code: bool = False
    # The operator's decision: a recipe may load pickled `.bin` weights
    # (`model.use_safetensors: false`), which can run code when unpickled. Off by default.
    allow_pickle_weights: bool = False
    # The workers cannot download from the Hugging Face hub: a hub name must already be in
    # the cache. The API sets it from HF_HUB_OFFLINE (`jobs.store.settings`); `tuneyard
    # validate` leaves it off (a local check, not the workers' promise).
    hub_offline: bool = False
    # Validation may fetch a hub model's config.json it has not cached
    # (`jobs.recipe.model.hub`). The API turns it on unless it is offline; `tuneyard validate`
    # leaves it off (a local check that reads the local cache only).
    hub_fetch: bool = False
    # `s3://bucket/prefix`: where workers store checkpoints and exports
    # (`jobs.recipe.paths.stored`); None keeps them on the filesystem only.
    artifact_store: str | None = None

    @property
    def resolved_runs_dir(self) -> Path:
        return self.runs_dir or self.home / "runs"

    def default_roots(self) -> list[Path]:
        """The roots when none are configured: the working directory unless it holds the
        home, and the home's data directories, never the home itself."""
        home = self.home.expanduser()
        cwd = [] if _holds(Path.cwd(), home) else [Path.cwd()]
        return [*cwd, *(home / name for name in HOME_DATA_DIRS)]

    def allowed_data_roots(self) -> list[Path]:
        """Roots a recipe may read models, tokenizers and data from."""
        return _split_roots(self.data_roots) or self.default_roots()

    def allowed_checkpoint_roots(self) -> list[Path]:
        """Roots a recipe may read or write checkpoints in (the runs dir is always one)."""
        roots = _split_roots(self.checkpoint_roots) or self.default_roots()
        return [*roots, self.resolved_runs_dir]
