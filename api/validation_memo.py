"""`validate_job` for the API, which sees the same recipe again and again.

CI pipelines resubmit one recipe many times (nightly runs, retries under a new
Idempotency-Key, the same job on another queue), and validating it is most of a submit's
CPU in the API's one GIL. `validate_cached` answers a recipe it validated before when
nothing validation depends on has changed:

- the inputs are the same, byte for byte as JSON (the recipe in its key order, overrides,
  resources, the grant, the queue's device memory and throughput, the project) and so are
  the settings, the working directory, the environment (HF_HUB_OFFLINE, HF_HOME, HOME...:
  all of it, by hash) and the model and `_target_` registries;
- every filesystem read validation made (`jobs.recipe.observe.watch`: where each path leads,
  what exists, each `config.json` and `refs/main`, each glob) answers the same again.

Only valid results are kept, and not those that asked the database about the project's
jobs (`restore_from: {job}`, paths in the runs directory). A kept answer is handed out
with its own copy of the stored recipe and plan; `typed` and `setup` are shared (read
them, do not change them). 256 recipes are kept, least recently used first out.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import OrderedDict
from pathlib import PurePath
from typing import Any

import orjson

from jobs.recipe import observe
from jobs.recipe.paths import one_view
from jobs.recipe.scope import JobScope
from jobs.recipe.settings import RecipeSettings
from jobs.recipe.target_table import TARGETS
from jobs.recipe.validation import ValidationResult, validate_job
from models.registry import registry_version

KEPT = 256
# key -> (the filesystem calls it made, the result, its plan and recipe as JSON)
_kept: OrderedDict[bytes, tuple[dict[tuple[Any, ...], Any], ValidationResult, bytes, bytes]] = (
    OrderedDict()
)
_lock = threading.Lock()


def _plain(value: Any) -> Any:
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(map(str, value))
    raise TypeError(type(value).__name__)  # anything else: not kept


def _environment() -> int:
    data = getattr(os.environ, "_data", None)  # CPython's bytes mapping: no decoding
    return hash(frozenset((data if data is not None else os.environ).items()))


def memo_key(
    recipe: Any,
    overrides: Any,
    resources: Any,
    settings: RecipeSettings,
    grant: bool,
    scope: JobScope | None,
    device_memory: int | None,
    flops_per_rank: float | None,
) -> bytes | None:
    """The inputs as one byte string, or None when one of them is not plain JSON."""
    if not isinstance(recipe, dict):
        return None  # a path or YAML text: read and parsed each time
    try:
        return orjson.dumps(
            [
                recipe,
                overrides,
                resources,
                grant,
                scope.project if scope else None,
                device_memory,
                flops_per_rank,
                type(settings).__name__,
                settings.__dict__,
                os.getcwd(),
                _environment(),
                registry_version(),
                id(TARGETS),
                [id(spec) for spec in TARGETS.values()],
            ],
            default=_plain,
        )
    except TypeError:  # a marker a bounds check refuses, an object: validate it afresh
        return None


def _handed_out(result: ValidationResult, plan: bytes, recipe: bytes) -> ValidationResult:
    """The kept result with its own stored recipe and plan (both JSON: copied through
    orjson, a few microseconds, where a Python walk of them costs ~0.1 ms)."""
    return dataclasses.replace(
        result,
        plan=orjson.loads(plan),
        recipe=orjson.loads(recipe),
        errors=list(result.errors),
        warnings=list(result.warnings),
    )


def validate_cached(
    recipe: Any,
    overrides: Any = (),
    resources: Any = None,
    settings: RecipeSettings | None = None,
    allow_remote_code: bool = False,
    *,
    scope: JobScope | None = None,
    device_memory: int | None = None,
    flops_per_rank: float | None = None,
    handed_over: bool = False,
) -> ValidationResult:
    """`validate_job`, answered from a kept validation when nothing it saw has changed."""
    settings = settings or RecipeSettings()
    key = memo_key(
        recipe,
        overrides,
        resources,
        settings,
        allow_remote_code,
        scope,
        device_memory,
        flops_per_rank,
    )
    if key is not None:
        with _lock:
            found = _kept.get(key)
            if found is not None:
                _kept.move_to_end(key)
        if found is not None:
            with one_view():  # the paths asked again share their parents' lookups
                unchanged = observe.replay(found[0])
            if unchanged:
                return _handed_out(*found[1:])
    with observe.recording() as seen:
        result = validate_job(
            recipe,
            overrides,
            resources,
            settings,
            allow_remote_code,
            scope=scope,
            device_memory=device_memory,
            flops_per_rank=flops_per_rank,
            handed_over=handed_over,
        )
    if key is not None and result.valid and seen.cacheable:
        try:
            kept = (seen.calls, result, orjson.dumps(result.plan), orjson.dumps(result.recipe))
        except TypeError:  # not plain JSON after all: answer it, keep nothing
            return result
        with _lock:
            _kept[key] = kept
            while len(_kept) > KEPT:
                _kept.popitem(last=False)
        return _handed_out(*kept[1:])
    return result


def forget() -> None:
    """Drop every kept validation (tests; an operator's settings reload)."""
    with _lock:
        _kept.clear()
