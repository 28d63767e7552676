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


def long_int(text: str) -> Refused | None:
    """A `Refused` for integer text of thousands of digits, whose conversion would be slow
    (and past 4300 digits raises instead of answering); None when it is worth converting."""
    if len(text) > MAX_INT_TEXT:
        return Refused(f"an integer of {len(text)} characters", INT_FIX)
    return None


def bounded_int(text: str) -> int | Refused:
    """`int(text)` for decimal text (JSON's integers) of sane length, else a `Refused`."""
    return long_int(text) or int(text)


def check_bounds(value: Any, loc: str = "") -> list[FieldError]:
    """A FieldError for every value in `value` that breaks a limit (at most `MAX_ERRORS`)."""
    walk = _Walk(loc.split(".") if loc else [])
    walk.visit(value)
    return walk.errors


# Values that are always within bounds: the walk skips them without a call.
_ALWAYS_FINE = (bool, type(None))


class _Walk:
    """One pass over a value; stops once the node budget is spent or enough is reported.

    `path` is one shared stack of keys, joined only when an error is reported: a walk over
    100k values stays in the tens of milliseconds."""

    def __init__(self, path: list[str]) -> None:
        self.path = path
        self.nodes = 0
        self.errors: list[FieldError] = []

    def report(self, msg: str, fix: str) -> None:
        self.errors.append(FieldError(join_loc(self.path), msg, fix))

    def visit(self, value: Any) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            self.report(
                f"makes the recipe larger than {MAX_NODES} values (an alias or a "
                "repeated object counts each time it is used)",
                "write the values out, or repeat smaller ones",
            )
        elif isinstance(value, dict | list | tuple):
            self.visit_collection(value)
        elif not isinstance(value, _ALWAYS_FINE):
            problem = scalar_problem(value)
            if problem:
                self.report(*problem)

    def visit_collection(self, value: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> None:
        is_dict = isinstance(value, dict)
        if len(value) > MAX_ITEMS:
            self.report(
                f"is a {'mapping' if is_dict else 'list'} of {len(value)} entries; at "
                f"most {MAX_ITEMS} are accepted",
                "shorten it, or point to a file holding the data",
            )
            return
        if len(self.path) >= MAX_DEPTH and value:
            self.report(
                f"nests deeper than {MAX_DEPTH} levels",
                "flatten this value; recipes need only a few levels",
            )
            return
        for key, item in value.items() if is_dict else enumerate(value):
            if self.nodes > MAX_NODES or len(self.errors) >= MAX_ERRORS:
                return
            if is_dict and not self.key_ok(key):
                continue
            self.path.append(key if is_dict else str(key))
            self.visit(item)
            self.path.pop()

    def key_ok(self, key: Any) -> bool:
        if isinstance(key, str) and len(key) <= MAX_STRING:
            return True
        if isinstance(key, Refused):
            self.report(f"has a key that is {key.what}", key.fix)
        elif isinstance(key, str):
            self.report(
                f"has a key of {len(key)} characters; at most {MAX_STRING}", "use a shorter key"
            )
        else:
            self.report(f"has the key {key!r}, which is not a string", f"quote the key: '{key}'")
        return False


def scalar_problem(value: Any) -> tuple[str, str] | None:
    """(msg, fix) when a non-collection value breaks a limit or is not a JSON value."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        if MIN_INT <= value <= MAX_INT:
            return None
        # bit_length, not str(): printing a 5000-digit integer raises past 4300 digits
        return f"is an integer of {value.bit_length()} bits, outside int64", INT_FIX
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return (
            f"is {value!r}, not a finite number (NaN, Infinity and overflowing values "
            "such as 1e400 are refused)",
            "give a finite number",
        )
    if isinstance(value, str):
        if len(value) <= MAX_STRING:
            return None
        return (
            f"is a string of {len(value)} characters; at most {MAX_STRING} are accepted",
            "shorten it, or point to a file holding the text",
        )
    if isinstance(value, Refused):
        return f"is {value.what}", value.fix
    return (
        f"is a {type(value).__name__}, which a recipe cannot hold",
        "give a string, number, boolean, null, list or mapping",
    )


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
    "long_int",
]
