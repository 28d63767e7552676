"""The size limits every recipe value obeys, and the one check that enforces them.

A recipe arrives as YAML text, as a JSON object in an API body, or as override values; all
of them end as plain values (dict, list, str, int, float, bool, None) that are stored as
JSON and run as given. `check_bounds` walks such a value and reports a `FieldError` at the
dotted path of each value that breaks a limit: nesting deeper than `MAX_DEPTH`, more than
`MAX_NODES` values in all (an alias or a shared object counts once per use, so an alias
bomb is refused before anything expands it), more than `MAX_ITEMS` entries in one list or
mapping, strings longer than `MAX_STRING`, integers outside int64, NaN and ±Inf, keys that
are not strings, and anything that is not a JSON value. `Refused` is what the YAML loader
builds in place of a value JSON cannot hold (a date, `!!binary`, `!!set`, a 5000-digit
integer): it carries its own message and fix, so the error names the field it sits at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from jobs.recipe.errors import FieldError

ROOT_LOC = "<recipe>"
MAX_DEPTH = 32  # nested lists/mappings; real recipes use four or five
MAX_NODES = 100_000  # values in all, counted after aliases expand
MAX_ITEMS = 10_000  # entries in one list or mapping
MAX_STRING = 65_536  # characters in one string or key
MAX_INT = 2**63 - 1  # int64: what the trainer and torch can hold
MIN_INT = -(2**63)
MAX_INT_TEXT = 40  # digits (and signs, underscores) worth converting at all
MAX_ERRORS = 20  # a report, not a transcript of every bad value

INT_FIX = f"give an integer between {MIN_INT} and {MAX_INT}"


@dataclass(frozen=True)
class Refused:
    """A value the loader would not build: what it was (`is <what>`) and how to write it."""

    what: str
    fix: str


def join_loc(parts: list[str] | tuple[str, ...]) -> str:
    return ".".join(parts) or ROOT_LOC


def bounded_int(text: str) -> int | Refused:
    """`int(text)` for integer text of sane length; a `Refused` for thousands of digits,
    whose conversion would be slow (and past 4300 digits raises instead of answering)."""
    if len(text) > MAX_INT_TEXT:
        return Refused(f"an integer of {len(text)} characters", INT_FIX)
    return int(text)


def check_bounds(value: Any, loc: str = "") -> list[FieldError]:
    """A FieldError for every value in `value` that breaks a limit (at most `MAX_ERRORS`)."""
    walk = _Walk()
    walk.visit(value, tuple(loc.split(".")) if loc else ())
    return walk.errors


class _Walk:
    """One pass over a value; stops counting (and reporting) once the node budget is spent."""

    def __init__(self) -> None:
        self.nodes = 0
        self.errors: list[FieldError] = []

    def report(self, path: tuple[str, ...], msg: str, fix: str) -> None:
        self.errors.append(FieldError(join_loc(path), msg, fix))

    @property
    def done(self) -> bool:
        return self.nodes > MAX_NODES or len(self.errors) >= MAX_ERRORS

    def visit(self, value: Any, path: tuple[str, ...]) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            self.report(path, f"makes the recipe larger than {MAX_NODES} values (an alias or "
                        "a repeated object counts each time it is used)",
                        "write the values out, or repeat smaller ones")  # fmt: skip
            return
        if isinstance(value, dict | list | tuple):
            self.visit_collection(value, path)
            return
        problem = scalar_problem(value)
        if problem:
            self.report(path, *problem)

    def visit_collection(self, value: dict[Any, Any] | list[Any] | tuple[Any, ...],
                         path: tuple[str, ...]) -> None:  # fmt: skip
        kind = "mapping" if isinstance(value, dict) else "list"
        if len(value) > MAX_ITEMS:
            self.report(path, f"is a {kind} of {len(value)} entries; at most {MAX_ITEMS} are "
                        "accepted", "shorten it, or point to a file holding the data")  # fmt: skip
            return
        if len(path) >= MAX_DEPTH and value:
            self.report(path, f"nests deeper than {MAX_DEPTH} levels",
                        "flatten this value; recipes need only a few levels")  # fmt: skip
            return
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if self.done:
                return
            if isinstance(value, dict) and not self.key_ok(key, path):
                continue
            self.visit(item, (*path, str(key)))

    def key_ok(self, key: Any, path: tuple[str, ...]) -> bool:
        if isinstance(key, Refused):
            self.report(path, f"has a key that is {key.what}", key.fix)
        elif not isinstance(key, str):
            self.report(path, f"has the key {key!r}, which is not a string",
                        f"quote the key: '{key}'")  # fmt: skip
        elif len(key) > MAX_STRING:
            self.report(path, f"has a key of {len(key)} characters; at most {MAX_STRING}",
                        "use a shorter key")  # fmt: skip
        else:
            return True
        return False


def scalar_problem(value: Any) -> tuple[str, str] | None:
    """(msg, fix) when a non-collection value breaks a limit or is not a JSON value."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        if MIN_INT <= value <= MAX_INT:
            return None
        return f"is an integer outside int64 ({len(str(abs(value)))} digits)", INT_FIX
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return (f"is {value!r}, not a finite number (NaN, Infinity and overflowing values "
                "such as 1e400 are refused)", "give a finite number")  # fmt: skip
    if isinstance(value, str):
        if len(value) <= MAX_STRING:
            return None
        return (f"is a string of {len(value)} characters; at most {MAX_STRING} are accepted",
                "shorten it, or point to a file holding the text")  # fmt: skip
    if isinstance(value, Refused):
        return f"is {value.what}", value.fix
    return (f"is a {type(value).__name__}, which a recipe cannot hold",
            "give a string, number, boolean, null, list or mapping")  # fmt: skip


__all__ = [
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_NODES",
    "MAX_STRING",
    "ROOT_LOC",
    "Refused",
    "bounded_int",
    "check_bounds",
    "join_loc",
]
