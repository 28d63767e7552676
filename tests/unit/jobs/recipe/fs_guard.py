"""Catch a filesystem read that validation makes outside `jobs.recipe.observe.watch`.

`validation_memo` may answer a recipe again only if every filesystem read its validation
made is kept and asked again: one made directly (`os.stat`, `Path.is_file`, `open`...)
would not be, and a changed file could go unnoticed. `guarded()` patches the `os`
functions every such read ends in (and `open`) to note each call made while a cacheable
recording is open and no `watch` is running.
"""

from __future__ import annotations

import builtins
import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from jobs.recipe import observe

PATCHED_OS = ("stat", "lstat", "open", "scandir", "listdir", "readlink", "access")


@contextmanager
def guarded() -> Iterator[list[str]]:
    """Yields the list of unwatched reads (each with where it came from)."""
    found: list[str] = []
    originals: dict[tuple[Any, str], Any] = {}
    reporting = [False]  # formatting the stack reads source files itself

    def wrap(owner: Any, name: str) -> None:
        original = getattr(owner, name)
        originals[(owner, name)] = original

        def checked(*args: Any, **kwargs: Any) -> Any:
            recording = observe.current()
            if (recording is not None and recording.cacheable and not observe.watching()
                    and not reporting[0]):  # fmt: skip
                reporting[0] = True
                try:
                    where = "".join(traceback.format_stack(limit=6)[:-1])
                finally:
                    reporting[0] = False
                found.append(f"{name}{args[:1]} outside watch:\n{where}")
            return original(*args, **kwargs)

        setattr(owner, name, checked)

    for name in PATCHED_OS:
        wrap(os, name)
    wrap(builtins, "open")
    try:
        yield found
    finally:
        for (owner, name), original in originals.items():
            setattr(owner, name, original)
