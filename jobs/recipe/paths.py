"""Which filesystem paths a recipe may name.

A recipe reads models, tokenizers and data from the allowed data roots and reads or writes
checkpoints in the allowed checkpoint roots (`jobs.recipe.settings.RecipeSettings`). `check_path`
decides whether one recipe value is a local path inside those roots, a Hugging Face hub
name (`org/name`, resolved later by the worker through the hub cache), or an error at its
field: a `../` escape, an absolute path elsewhere, a symlink that leads out, or a local
path that does not exist.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from jobs.recipe.errors import FieldError

HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class PathCheck:
    """The outcome of checking one path-valued field."""

    kind: str  # "local", "hub" or "invalid"
    path: Path | None = None
    errors: list[FieldError] = field(default_factory=list)


def is_hub_name(value: str) -> bool:
    """`org/name` with no `..`, no leading slash or dot: a hub repository id."""
    return bool(HUB_NAME.match(value)) and ".." not in value


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def _real(path: Path) -> Path:
    """Resolve symlinks of the longest existing prefix (the rest may not exist yet)."""
    return Path(os.path.realpath(path))


def _roots_text(roots: list[Path]) -> str:
    return os.pathsep.join(str(r) for r in roots)


def check_path(
    value: object,
    loc: str,
    roots: list[Path],
    *,
    must_exist: bool = True,
    allow_hub: bool = True,
    env_var: str = "TUNEYARD_DATA_ROOTS",
) -> PathCheck:
    """Check one path-valued recipe field against the allowed roots."""
    if not isinstance(value, str) or not value.strip():
        return PathCheck(
            "invalid",
            errors=[
                FieldError(
                    loc, "must be a non-empty path string", "give a path inside the allowed roots"
                )
            ],
        )
    raw = Path(value).expanduser()
    lexical = Path(os.path.normpath(raw if raw.is_absolute() else Path.cwd() / raw))
    if allow_hub and is_hub_name(value) and not lexical.exists():
        return PathCheck("hub")
    lexical_roots = [Path(os.path.normpath(r.expanduser().absolute())) for r in roots]
    real_roots = [_real(r) for r in lexical_roots]
    fix = f"use a path inside {_roots_text(lexical_roots)} or add its root to {env_var}"
    if not _inside(lexical, lexical_roots):
        why = (
            "escapes the allowed roots with '..'"
            if ".." in raw.parts
            else "is outside the allowed roots"
        )
        return PathCheck("invalid", errors=[FieldError(loc, f"{value!r} {why}", fix)])
    if not _inside(_real(lexical), real_roots):
        msg = f"{value!r} is a symlink that leads outside the allowed roots"
        return PathCheck("invalid", errors=[FieldError(loc, msg, fix)])
    if must_exist and not lexical.exists():
        hint = " (a hub name has the form org/name)" if allow_hub else ""
        return PathCheck(
            "invalid",
            errors=[
                FieldError(
                    loc, f"{value!r} does not exist", f"give an existing file or directory{hint}"
                )
            ],
        )
    return PathCheck("local", path=lexical)


def check_data_path(value: object, loc: str, roots: list[Path]) -> PathCheck:
    """Model, tokenizer and dataset paths: local inside the data roots, or a hub name."""
    return check_path(value, loc, roots, must_exist=True, allow_hub=True)


def check_checkpoint_path(
    value: object, loc: str, roots: list[Path], *, must_exist: bool
) -> PathCheck:
    """Checkpoint dirs: always local, inside the checkpoint roots."""
    return check_path(
        value,
        loc,
        roots,
        must_exist=must_exist,
        allow_hub=False,
        env_var="TUNEYARD_CHECKPOINT_ROOTS",
    )
