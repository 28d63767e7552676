"""What validation saw of the filesystem, so a repeated submit can be answered without it.

A recipe's validation is a function of its inputs (the recipe, overrides, resources,
settings, the environment, the working directory, the registries) and of what it read
from the filesystem: which paths exist, where links lead, what `config.json` holds, which
snapshots a hub cache has. Every such read goes through `watch(fn, *args)`, which calls
`fn(*args)` and, while a `recording()` is open, keeps the call and its answer. `replay`
asks each kept call again: when every answer is the same, the validation it recorded
would decide the same way now. A read that cannot be asked again cheaply (the project's
jobs in the database, for `restore_from` and run-dir confinement) calls `uncacheable()`.

The recipe tests validate every dict recipe through `api.validation_memo` with the
filesystem calls of `os` and `open` patched (`tests/unit/jobs/recipe/fs_guard.py`) to
fail outside `watch` while a cacheable recording is open: a new read that skips `watch`
is caught there.
"""

from __future__ import annotations

import glob
import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")


class Recording:
    """The calls one validation made to the outside world, and whether replaying them is
    enough to know the answer again."""

    __slots__ = ("calls", "cacheable")

    def __init__(self) -> None:
        self.calls: dict[tuple[Any, ...], Any] = {}
        self.cacheable = True


_CURRENT: ContextVar[Recording | None] = ContextVar("tuneyard_observe", default=None)
_inside = threading.local()  # depth of `watch` calls on this thread (for the guard test)


def watching() -> bool:
    """True inside a `watch` call on this thread."""
    return getattr(_inside, "depth", 0) > 0


def current() -> Recording | None:
    return _CURRENT.get()


def watch(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, kept in the open recording (if any) with its answer."""
    _inside.depth = getattr(_inside, "depth", 0) + 1
    try:
        value = fn(*args)
    finally:
        _inside.depth -= 1
    recording = _CURRENT.get()
    if recording is not None and recording.cacheable:
        recording.calls.setdefault((fn, *args), value)
    return value


def uncacheable() -> None:
    """This validation read something `replay` cannot ask again."""
    recording = _CURRENT.get()
    if recording is not None:
        recording.cacheable = False


@contextmanager
def recording() -> Iterator[Recording]:
    """Keep every `watch` call made inside (this context only, not other threads')."""
    kept = Recording()
    token = _CURRENT.set(kept)
    try:
        yield kept
    finally:
        _CURRENT.reset(token)


def replay(calls: dict[tuple[Any, ...], Any]) -> bool:
    """True when every kept call answers as it did (errors included: a call that raised
    then was recorded as what its wrapper returned, never as an exception)."""
    for (fn, *args), value in calls.items():
        try:
            if watch(fn, *args) != value:
                return False
        except Exception:  # noqa: BLE001 - anything new about the world is a change
            return False
    return True


def glob_sorted(root: Any, pattern: str, limit: int = 10_000) -> tuple[str, ...]:
    """The first `limit` matches of `pattern` under `root` (a Path), in Path order, as text:
    a listing `replay` can compare."""
    return tuple(str(p) for p in sorted(itertools.islice(root.glob(pattern), limit)))


def iglob_list(pattern: str, limit: int) -> tuple[str, ...]:
    """`glob.iglob(pattern)`'s first `limit` matches, in its order."""
    return tuple(itertools.islice(glob.iglob(pattern), limit))
