"""Plain values: the leaf types of JSON-like recipe data, a dataclass's field names, and a
copy of a JSON-like value's containers. Shared by the walks that run on every submit
(stray `_target_`s, the typed dump, defaults handed out), so each checks a leaf the same
cheap way: its exact type, one set lookup."""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

LEAVES = frozenset((str, int, float, bool, type(None)))


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (which Python counts as an int)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


@cache
def field_names(cls: type) -> tuple[str, ...] | None:
    """A dataclass's field names (None for any other type), worked out once per class."""
    return tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None


def fresh(value: Any) -> Any:
    """A copy of a JSON-like value's containers (its leaves are immutable)."""
    if isinstance(value, dict):
        return {k: fresh(v) for k, v in value.items()}
    if isinstance(value, list):
        return [fresh(v) for v in value]
    return value
