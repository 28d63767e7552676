"""Which filesystem paths a recipe may name, and how validation reads a file under them.

A recipe reads models, tokenizers and data from the allowed data roots and reads or writes
checkpoints in the allowed checkpoint roots (`jobs.recipe.settings.RecipeSettings`). `check_path`
decides whether one recipe value is a local path inside those roots, a Hugging Face hub
name (`org/name` that names nothing local, resolved later by the worker through the hub
cache), or an error at its field: a `../` escape, an absolute path elsewhere, a symlink that
leads out, or a local path that does not exist. `name_errors` keeps name fields (splits,
column names) from being paths at all, and `read_bounded` is the one way validation opens a
file a recipe points at: real path inside the roots, a regular file, at most `cap` bytes.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from jobs.recipe.errors import FieldError, shown

HUB_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*\Z")
NAME_MAX_CHARS = 200


@dataclass(frozen=True)
class PathCheck:
    """The outcome of checking one path-valued field."""

    kind: str  # "local", "hub" or "invalid"
    path: Path | None = None
    errors: list[FieldError] = field(default_factory=list)
    real: str | None = None  # `path` with its links resolved (local only)


@dataclass(frozen=True)
class Roots:
    """Allowed roots as absolute, normalized text: as written (`~` expanded, links kept) and
    with their links resolved. A caller resolves them once (`Roots.of`) and checks every path
    it meets against that (a validation: the data roots once for all its reads); the next
    validation resolves them again, so a root an operator re-points is followed from the
    next submit on."""

    lexical: tuple[str, ...]
    real: tuple[str, ...]

    @classmethod
    def of(cls, roots: Roots | Iterable[Path | str]) -> Roots:
        if isinstance(roots, Roots):
            return roots
        lexical = tuple(lexical_path(root) for root in roots)
        return cls(lexical, tuple(os.path.realpath(root) for root in lexical))


def is_hub_name(value: str) -> bool:
    """`org/name` with no `..`, no leading slash or dot: a hub repository id."""
    return bool(HUB_NAME.match(value)) and ".." not in value


def names_hub_repo(value: str, base: Path | None = None) -> bool:
    """A hub id only if it reads as `org/name` and nothing by that name exists under `base`
    (the working directory): an existing relative path is a path, checked against the roots.
    A dangling symlink counts as existing, so it is refused as a path rather than looked up."""
    return is_hub_name(value) and not os.path.lexists(os.path.join(base or os.getcwd(), value))


def _inside(path: str, roots: Iterable[str]) -> bool:
    """`path` is one of `roots` or lies under one (absolute, normalized paths as text)."""
    return any(path == root or root == "/" or path.startswith(root + "/") for root in roots)


def lexical_path(path: Path | str) -> str:
    """Absolute and normalized, `~` expanded, symlinks not followed (as text)."""
    return os.path.normpath(os.path.abspath(os.path.expanduser(os.fspath(path))))


def _roots_text(roots: Iterable[str]) -> str:
    return os.pathsep.join(roots)


def _invalid(loc: str, msg: str, fix: str) -> PathCheck:
    return PathCheck("invalid", errors=[FieldError(loc, msg, fix)])


def check_path(
    value: object,
    loc: str,
    roots: Roots | list[Path],
    *,
    must_exist: bool = True,
    allow_hub: bool = True,
    env_var: str = "TUNEYARD_DATA_ROOTS",
) -> PathCheck:
    """Check one path-valued recipe field against the allowed roots; a local answer carries
    the path resolved (`PathCheck.real`) for the checks that follow."""
    if not isinstance(value, str) or not value.strip():
        return _invalid(
            loc, "must be a non-empty path string", "give a path inside the allowed roots"
        )
    if "\x00" in value:
        return _invalid(loc, "contains a NUL character", "give a path inside the allowed roots")
    if allow_hub and names_hub_repo(value):
        return PathCheck("hub")
    lexical, allowed = lexical_path(value), Roots.of(roots)
    fix = f"use a path inside {_roots_text(allowed.lexical)} or add its root to {env_var}"
    if not _inside(lexical, allowed.lexical):
        why = (
            "escapes the allowed roots with '..'"
            if ".." in os.path.expanduser(value).split("/")
            else "is outside the allowed roots"
        )
        return _invalid(loc, f"{shown(value)} {why}", fix)
    real = os.path.realpath(lexical)
    if not _inside(real, allowed.real):
        return _invalid(
            loc, f"{shown(value)} is a symlink that leads outside the allowed roots", fix
        )
    if must_exist and not os.path.exists(lexical):
        hint = " (a hub name has the form org/name)" if allow_hub else ""
        return _invalid(
            loc, f"{shown(value)} does not exist", f"give an existing file or directory{hint}"
        )
    return PathCheck("local", path=Path(lexical), real=real)


def check_data_path(value: object, loc: str, roots: Roots | list[Path]) -> PathCheck:
    """Model, tokenizer and dataset paths: local inside the data roots, or a hub name."""
    return check_path(value, loc, roots, must_exist=True, allow_hub=True)


def check_checkpoint_path(
    value: object, loc: str, roots: Roots | list[Path], *, must_exist: bool
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


def name_errors(value: object, loc: str, example: str) -> list[FieldError]:
    """A split, config or column name: never a path. The trainer joins a split onto the
    dataset directory (`<dir>/<split>.json`), so a separator or `..` would read elsewhere."""
    fix = f"set {loc} to a plain name such as {example}"
    if not isinstance(value, str) or not value:
        return [FieldError(loc, "must be a non-empty name", fix)]
    if len(value) > NAME_MAX_CHARS:
        return [FieldError(loc, f"is longer than {NAME_MAX_CHARS} characters", fix)]
    if "/" in value or "\\" in value or "\x00" in value or ".." in value:
        return [FieldError(loc, f"{shown(value)} is a name, not a path: no '/', '\\' or '..'", fix)]
    return []


def _read_regular(real: str, named: Path, cap: int) -> tuple[bytes | None, str]:
    """At most cap + 1 bytes of `real`, or why not. O_NOFOLLOW: a link swapped in after
    `realpath` is refused, not followed; O_NONBLOCK: a FIFO must not hang us."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        return None, f"cannot read {shown(str(named))}: {exc.strerror}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, f"{shown(str(named))} is not a regular file"
        if info.st_size > cap:
            size = f"{info.st_size} bytes, over the {cap} bytes validation reads"
            return None, f"{shown(str(named))} is {size}"
        chunks, left = [], cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        return None, f"cannot read {shown(str(named))}: {exc.strerror}"
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > cap:
        return None, f"{shown(str(named))} is over the {cap} bytes validation reads"
    return data, ""


def read_bounded(
    file: Path, loc: str, roots: Roots | list[Path], cap: int
) -> tuple[bytes | None, list[FieldError]]:
    """A file a recipe points at: its real path must stay inside `roots` (a symlink within
    them is fine, e.g. hub-cache snapshots into `blobs/`), and it must be a regular file of
    at most `cap` bytes; no more than cap + 1 bytes are ever read."""
    real, allowed = os.path.realpath(lexical_path(file)), Roots.of(roots)
    if not _inside(real, allowed.real):
        msg = f"{shown(str(file))} is a symlink that leads outside the allowed roots"
        return None, [FieldError(loc, msg, f"keep the file inside {_roots_text(allowed.real)}")]
    data, why = _read_regular(real, file, cap)
    if data is None:
        return None, [FieldError(loc, why, f"give a regular file of at most {cap} bytes")]
    return data, []
