"""Path keywords that name a set of files rather than one: Megatron prefixes and globs.

A Megatron indexed dataset is named by its prefix (`data/web_text_document` for
`web_text_document.bin` and `.idx`); nanoGPT shards and Megatron corpora may be named by a
glob (`data/fineweb_train_*.bin`). `check_file_set` checks such a value as strictly as a
plain path: no `..`, the literal part inside the data roots, every file it names (both
halves of a prefix, each glob match, through symlinks) inside them too, and at least one
file named. A value naming an existing file or directory is checked as a plain path.
"""

from __future__ import annotations

import glob
import itertools
import os
from pathlib import Path

from jobs.recipe.errors import QUOTE_MAX, FieldError, clip, shown
from jobs.recipe.paths.roots import PathCheck, Roots, check_data_path, check_path

PREFIX, GLOB = "megatron_prefix", "glob"
MEGATRON_SUFFIXES = (".bin", ".idx")
MAX_MATCHES = 100_000  # a pattern naming more files than this is refused, not listed
GLOB_CHARS = frozenset("*?[")


def _invalid(loc: str, msg: str, fix: str) -> PathCheck:
    return PathCheck("invalid", errors=[FieldError(loc, msg, fix)])


def _each_inside(files: list[str], loc: str, roots: Roots | list[Path]) -> list[FieldError]:
    errors = []
    for file in files:
        errors += check_data_path(file, loc, roots).errors
    return errors[:1]


def _check_prefix(value: str, loc: str, roots: Roots | list[Path]) -> PathCheck:
    inside = check_path(value, loc, roots, must_exist=False, allow_hub=False)
    if inside.errors:
        return inside
    halves = [value + suffix for suffix in MEGATRON_SUFFIXES]
    missing = [h for h in halves if not os.path.lexists(h)]
    if missing:
        half = clip(Path(missing[0]).name, QUOTE_MAX)
        msg = f"{shown(value)} is not a Megatron dataset prefix: {half} does not exist"
        return _invalid(loc, msg, "give the prefix of a .bin/.idx pair (without the suffix)")
    errors = _each_inside(halves, loc, roots)
    if errors:
        return PathCheck("invalid", errors=errors)
    return PathCheck("local", path=Path(os.path.normpath(os.path.abspath(value))))


def _check_glob(value: str, loc: str, roots: Roots | list[Path], prefixes: bool) -> PathCheck:
    if ".." in Path(value).parts:
        return _invalid(
            loc,
            f"{shown(value)} escapes the allowed roots with '..'",
            "give a pattern inside the allowed roots",
        )
    literal = Path(value.split("*")[0].split("?")[0].split("[")[0]).parent
    base = check_data_path(str(literal), loc, roots)
    if base.errors:
        return base
    matches = list(itertools.islice(glob.iglob(value), MAX_MATCHES + 1))
    if len(matches) > MAX_MATCHES:
        return _invalid(
            loc, f"{shown(value)} names more than {MAX_MATCHES} files", "narrow the pattern"
        )
    if prefixes:  # a Megatron pattern matches .bin/.idx files: each prefix needs both
        stems = {m.removesuffix(s) for m in matches for s in MEGATRON_SUFFIXES if m.endswith(s)}
        matches = [f"{m}{s}" for m in sorted(stems) for s in MEGATRON_SUFFIXES]
    if not matches:
        return _invalid(loc, f"{shown(value)} matches no file", "check the pattern and the data")
    errors = _each_inside(matches, loc, roots)
    if errors:
        return PathCheck("invalid", errors=errors)
    return PathCheck("local", path=Path(os.path.normpath(os.path.abspath(value))))


def check_file_set(value: object, loc: str, roots: Roots | list[Path], form: str) -> PathCheck:
    """A prefix or glob keyword's value: a PathCheck like `check_data_path`'s. The roots are
    resolved once for every file a pattern names."""
    roots = Roots.of(roots)
    if not isinstance(value, str) or not value or os.path.lexists(value):
        return check_data_path(value, loc, roots)
    if GLOB_CHARS & set(value):
        return _check_glob(value, loc, roots, prefixes=form == PREFIX)
    if form == PREFIX:
        return _check_prefix(value, loc, roots)
    return check_data_path(value, loc, roots)
