"""The limits every recipe value obeys, one budget per request, and the walk that enforces them.

A recipe arrives as YAML text, as a JSON object in an API body, or as override values; all
of them end as plain values (dict, list, str, int, float, bool, None) that are stored as
JSON and run as given. `check_bounds` walks such a value and reports a `FieldError` at the
dotted path of each value that breaks a limit: nesting deeper than `MAX_DEPTH`, more than
`MAX_ITEMS` entries in one list or mapping, strings longer than `MAX_STRING`, integers
outside int64, NaN and ±Inf, keys that are not strings, control characters (`unsafe_char`:
none in a key; in a string value only tab, line breaks and the Unicode separators), and anything
that is not a JSON value. One `NodeBudget` per request spans the recipe and every override:
`MAX_NODES` values in all (an alias or a shared object counts once per use, so an alias bomb
is refused before anything expands it, whether in the recipe or spread over 200 overrides)
and `MAX_ERRORS` errors. `Refused` is what the YAML loader builds in place of a value JSON
cannot hold (a date, `!!binary`, `!!set`, a 5000-digit integer): it carries its own message
and fix, so the error names the field it sits at.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from jobs.recipe.errors import FieldError, shown

ROOT_LOC = "<recipe>"
MAX_DEPTH = 32  # nested lists/mappings; real recipes use four or five
MAX_NODES = 100_000  # values in one request, recipe and overrides, counted after aliases expand
MAX_ITEMS = 10_000  # entries in one list or mapping
MAX_STRING = 65_536  # characters in one string or key
MAX_INT = 2**63 - 1  # int64: what the trainer and torch can hold
MIN_INT = -(2**63)
MAX_INT_TEXT = 40  # digits (and signs, underscores) worth converting at all
MAX_ERRORS = 20  # a report, not a transcript of every bad value

INT_FIX = f"give an integer between {MIN_INT} and {MAX_INT}"

# What a terminal or a page would act on instead of showing: C0 and C1 controls and DEL
# (Unicode category Cc), the line and paragraph separators, and the bidirectional
# embeddings, overrides and isolates that reorder the text around them.
_BIDI = r"\u202a-\u202e\u2066-\u2069"
_UNSAFE_IN_NAME = re.compile(rf"[\x00-\x1f\x7f-\x9f\u2028\u2029{_BIDI}]")
# Free text (a prompt, a template) may hold tabs, line breaks and the Unicode separators.
_UNSAFE_IN_TEXT = re.compile(rf"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f{_BIDI}]")
CONTROL_FIX = "remove it; write only printable characters"
UNCHECKED = "was not checked: the request is over its limits already"


def unsafe_char(text: str, *, free_text: bool = False) -> str | None:
    """The first character of `text` that a name may not hold (see `_UNSAFE_IN_NAME`), or
    None; with `free_text`, tab, line feed, carriage return and the separators are allowed."""
    found = (_UNSAFE_IN_TEXT if free_text else _UNSAFE_IN_NAME).search(text)
    return found.group() if found else None


_SHORT_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(found: re.Match[str]) -> str:
    char = found.group()
    code = ord(char)
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escaped(text: str, keep: str = "") -> str:
    """`text` with each character a name may not hold written as its escape (`\\x1b`,
    `\\u202e`), so it shows instead of acting; the characters in `keep` stay as they are."""
    if _UNSAFE_IN_NAME.search(text) is None:
        return text
    return _UNSAFE_IN_NAME.sub(lambda m: m.group() if m.group() in keep else _escape(m), text)


def control_msg(char: str) -> str:
    """How an error names an unsafe character: its code point, never the character."""
    return f"contains the control character U+{ord(char):04X}"


@dataclass(frozen=True)
class Refused:
    """A value the loader would not build: what it was (`is <what>`) and how to write it."""

    what: str
    fix: str


@dataclass
class NodeBudget:
    """What one request may hold in all, shared by the recipe and every override value.

    `visits` counts the values walked so far (an alias or a shared object once per use);
    past `limit` every walk stops and the request is refused. `left` is what a YAML loader
    may still compose before the walk would refuse it anyway; a loader that finds more
    `overdraw`s it, so nothing after it in the request is parsed. The recipe (a mapping walked
    whole, at the root) is remembered once clean, so the API's early check and
    `validate_job` count it once."""

    limit: int = MAX_NODES
    visits: int = 0
    errors: int = 0
    clean_recipe: Any = field(default=None, repr=False)

    @property
    def left(self) -> int:
        return max(0, self.limit - self.visits)

    def overdraw(self) -> None:
        """Mark the budget spent: a loader found a value larger than what is left."""
        self.visits = max(self.visits, self.limit + 1)

    @property
    def exhausted(self) -> bool:
        """Over the node limit or at the error limit: nothing more is worth walking."""
        return self.visits > self.limit or self.errors >= MAX_ERRORS


def join_loc(parts: list[str] | tuple[str, ...]) -> str:
    """A dotted field path; a key's control characters are escaped (`escaped`)."""
    return escaped(".".join(parts)) or ROOT_LOC


def long_int(text: str) -> Refused | None:
    """A `Refused` for integer text of thousands of digits, whose conversion would be slow
    (and past 4300 digits raises instead of answering); None when it is worth converting."""
    if len(text) > MAX_INT_TEXT:
        return Refused(f"an integer of {len(text)} characters", INT_FIX)
    return None


def bounded_int(text: str) -> int | Refused:
    """`int(text)` for decimal text (JSON's integers) of sane length, else a `Refused`."""
    return long_int(text) or int(text)


def check_bounds(value: Any, loc: str = "", budget: NodeBudget | None = None) -> list[FieldError]:
    """A FieldError for every value in `value` that breaks a limit; `budget` is the request's
    (a fresh one when None), so the recipe and each override draw on the same count."""
    budget = budget if budget is not None else NodeBudget()
    if budget.exhausted and not isinstance(value, Refused):  # a marker reports itself
        return [FieldError(loc or ROOT_LOC, UNCHECKED, "fix the errors reported before it")]
    if isinstance(value, dict) and value is budget.clean_recipe:
        return []  # this very recipe was walked, clean, for this request
    walk = _Walk(loc.split(".") if loc else [], budget)
    walk.visit(value)
    if not loc and isinstance(value, dict) and not walk.errors:
        budget.clean_recipe = value
    return walk.errors


# Values that are always within bounds: the walk skips them without a call.
_ALWAYS_FINE = (bool, type(None))


class _Walk:
    """One pass over a value; stops once the request's budget is spent.

    `path` is one shared stack of keys, joined only when an error is reported: a walk over
    100k values stays in the tens of milliseconds."""

    def __init__(self, path: list[str], budget: NodeBudget) -> None:
        self.path = path
        self.budget = budget
        self.errors: list[FieldError] = []

    def report(self, msg: str, fix: str) -> None:
        self.errors.append(FieldError(join_loc(self.path), msg, fix))
        self.budget.errors += 1

    def visit(self, value: Any) -> None:
        budget = self.budget
        budget.visits += 1
        if budget.visits > budget.limit:
            self.report(
                f"makes the request larger than {budget.limit} values, recipe and overrides "
                "together (an alias or a repeated object counts each time it is used)",
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
        budget = self.budget
        for key, item in value.items() if is_dict else enumerate(value):
            if budget.exhausted:
                return
            if is_dict and not self.key_ok(key):
                continue
            self.path.append(key if is_dict else str(key))
            self.visit(item)
            self.path.pop()

    def key_ok(self, key: Any) -> bool:
        if isinstance(key, str) and len(key) <= MAX_STRING:
            char = unsafe_char(key)
            if char is None:
                return True
            self.report(f"has a key that {control_msg(char)}", "rename the key: " + CONTROL_FIX)
        elif isinstance(key, Refused):
            self.report(f"has a key that is {key.what}", key.fix)
        elif isinstance(key, str):
            self.report(
                f"has a key of {len(key)} characters; at most {MAX_STRING}", "use a shorter key"
            )
        else:
            self.report(
                f"has the key {shown(key)}, which is not a string", f"quote the key: '{key!s:.100}'"
            )
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
            f"is {shown(value)}, not a finite number (NaN, Infinity and overflowing values "
            "such as 1e400 are refused)",
            "give a finite number",
        )
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            return (
                f"is a string of {len(value)} characters; at most {MAX_STRING} are accepted",
                "shorten it, or point to a file holding the text",
            )
        char = unsafe_char(value, free_text=True)
        return None if char is None else (control_msg(char), CONTROL_FIX)
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
    "NodeBudget",
    "Refused",
    "bounded_int",
    "check_bounds",
    "control_msg",
    "escaped",
    "join_loc",
    "long_int",
    "unsafe_char",
]
