"""Process settings, read from `TUNEYARD_*` environment variables.

One `Settings` object says where tuneyard keeps its data (`TUNEYARD_HOME`), which database
and broker it talks to, and which filesystem roots a recipe may read data and checkpoints
from. The embedded default (no PostgreSQL, no Redis) keeps everything in a SQLite file
under the home directory.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "tuneyard"


def _split_roots(value: str | None) -> list[Path]:
    if not value:
        return []
    return [Path(p).expanduser() for p in value.split(os.pathsep) if p.strip()]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNEYARD_", extra="ignore")

    home: Path = Field(default_factory=_default_home)
    database_url: str | None = None
    broker_url: str | None = None
    data_roots: str | None = None
    checkpoint_roots: str | None = None
    runs_dir: Path | None = None
    auth: str = "on"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'tuneyard.db'}"

    @property
    def resolved_runs_dir(self) -> Path:
        return self.runs_dir or self.home / "runs"

    @property
    def auth_enabled(self) -> bool:
        return self.auth.strip().lower() not in {"off", "0", "false", "no"}

    def allowed_data_roots(self) -> list[Path]:
        """Roots a recipe may read models, tokenizers and data from."""
        return _split_roots(self.data_roots) or [Path.cwd(), self.home]

    def allowed_checkpoint_roots(self) -> list[Path]:
        """Roots a recipe may read or write checkpoints in (the runs dir is always one)."""
        roots = _split_roots(self.checkpoint_roots) or [Path.cwd(), self.home]
        return [*roots, self.resolved_runs_dir]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
