"""The `_target_` allowlist: which callables a recipe may name, and how they are built.

A recipe section with `_target_` names a callable; its sibling keys become keyword
arguments and nested `_target_` dicts are built first. Only names in `TARGETS` resolve:
tuneyard's own builders, `torch.optim` optimizers and LR schedulers, torch loss modules,
and the `nemo_automodel.*` names seed recipes use, as aliases of ours. Each `TargetSpec`
lists the keyword names a recipe may give (`params`, static so validation needs no torch)
and the ones the trainer supplies at run time (`injected`). Anything else (`os.system`,
`pickle.loads`, `file.py:attr`, private attributes) is refused at `<section>._target_`
and never imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from jobs.recipe.errors import FieldError, RecipeInvalid, did_you_mean
from jobs.recipe.target_table import CANONICAL, KWARG_SYNONYMS, TARGETS, TargetSpec

__all__ = [
    "TARGETS",
    "TargetSpec",
    "build",
    "check_target_section",
    "fold_kwarg_synonyms",
    "is_target_section",
    "load_callable",
    "resolve_target",
]


_ALLOWED_SPECS = frozenset(CANONICAL.values())

_DANGEROUS_PREFIXES = (
    "os.",
    "subprocess.",
    "builtins.",
    "pickle.",
    "shutil.",
    "sys.",
    "importlib.",
    "socket.",
    "ctypes.",
    "marshal.",
    "torch.load",
    "torch.hub.",
    "runpy.",
    "code.",
    "pty.",
)


def _refusal_reason(name: str) -> str:
    if ":" in name or "/" in name or name.endswith(".py") or ".py." in name:
        return "file paths and 'module:attr' forms are not allowed"
    if any(part.startswith("_") for part in name.split(".")):
        return "private and dunder attributes are not allowed"
    if any(name == p.rstrip(".") or name.startswith(p) for p in _DANGEROUS_PREFIXES) or name in {
        "eval",
        "exec",
        "open",
        "compile",
        "__import__",
    }:
        return "it can run arbitrary code or read arbitrary files"
    return "it is not on tuneyard's allowlist"


def resolve_target(name: object, loc: str) -> TargetSpec:
    """The allowlisted spec for a `_target_` value; RecipeInvalid at `loc` otherwise."""
    if not isinstance(name, str) or not name:
        raise RecipeInvalid(
            [
                FieldError(
                    loc,
                    "must be the dotted name of an allowed callable",
                    "e.g. _target_: torch.optim.AdamW",
                )
            ]
        )
    spec = TARGETS.get(name)
    if spec is not None:
        return spec
    hint = did_you_mean(name, TARGETS)
    fix = hint or "use one of: " + ", ".join(sorted(CANONICAL))
    raise RecipeInvalid([FieldError(loc, f"{name!r} is refused: {_refusal_reason(name)}", fix)])


def load_callable(spec: TargetSpec) -> Any:
    """Import an allowlisted callable (importlib + getattr chain). Refuses any other spec."""
    if spec not in _ALLOWED_SPECS:
        raise RecipeInvalid(
            [
                FieldError(
                    "_target_",
                    f"{spec.name!r} is not on the allowlist",
                    "use a name from jobs.recipe.targets.TARGETS",
                )
            ]
        )
    module_name, _, attr_path = spec.import_path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        obj = getattr(obj, attr)
    return obj


def fold_kwarg_synonyms(section: dict[str, Any], loc: str) -> list[FieldError]:
    """Rename synonym kwargs in place (`dataset_name` -> `path_or_dataset`); conflicts are errors."""
    spec = (
        TARGETS.get(section.get("_target_")) if isinstance(section.get("_target_"), str) else None
    )
    errors: list[FieldError] = []
    for synonym, canonical in KWARG_SYNONYMS.get(spec.name if spec else "", {}).items():
        if synonym not in section:
            continue
        value = section.pop(synonym)
        if canonical in section and section[canonical] != value:
            errors.append(
                FieldError(
                    f"{loc}.{synonym}",
                    f"conflicts with {loc}.{canonical}",
                    f"keep only {loc}.{canonical}",
                )
            )
        else:
            section[canonical] = value
    return errors


def is_target_section(value: object) -> bool:
    return isinstance(value, Mapping) and "_target_" in value


def check_target_section(section: object, loc: str) -> tuple[TargetSpec | None, list[FieldError]]:
    """Check a `_target_` section's name and keyword names (and nested targets) statically."""
    if not isinstance(section, Mapping) or "_target_" not in section:
        return None, [
            FieldError(
                f"{loc}._target_",
                "is missing",
                f"give {loc}._target_: the dotted name of an allowed callable",
            )
        ]
    try:
        spec = resolve_target(section["_target_"], f"{loc}._target_")
    except RecipeInvalid as exc:
        return None, exc.errors
    errors: list[FieldError] = []
    kwargs = {k: v for k, v in section.items() if k != "_target_"}
    if spec.params is not None:
        errors += _check_kwargs(spec, kwargs, loc)
    for key, value in kwargs.items():
        if is_target_section(value):
            errors += check_target_section(value, f"{loc}.{key}")[1]
    return spec, errors


def _check_kwargs(spec: TargetSpec, kwargs: Mapping[str, Any], loc: str) -> list[FieldError]:
    errors = []
    assert spec.params is not None
    for key in kwargs:
        if key in spec.injected:
            errors.append(
                FieldError(
                    f"{loc}.{key}",
                    f"is supplied by the trainer to {spec.name}",
                    f"remove {loc}.{key}",
                )
            )
        elif key not in spec.params:
            hint = did_you_mean(str(key), spec.params)
            errors.append(
                FieldError(
                    f"{loc}.{key}",
                    f"{spec.name} takes no argument {key!r}",
                    hint or "accepted: " + ", ".join(sorted(spec.params)),
                )
            )
    for key in sorted(spec.required - set(kwargs)):
        errors.append(FieldError(f"{loc}.{key}", f"is required by {spec.name}", f"set {loc}.{key}"))
    return errors


def build(section: Mapping[str, Any], loc: str, **injected: Any) -> Any:
    """Instantiate a `_target_` section: nested targets first, then the callable.

    Of the `injected` keywords, a spec gets those it declares as injected, plus defaults for
    its own params the section leaves out (`max_steps` for a scheduler), so the trainer may
    offer the same `tokenizer=` to every dataset.
    """
    spec, errors = check_target_section(section, loc)
    if errors or spec is None:
        raise RecipeInvalid(errors)
    kwargs = {}
    for key, value in section.items():
        if key == "_target_":
            continue
        kwargs[key] = build(value, f"{loc}.{key}") if is_target_section(value) else value
    params = spec.params or frozenset()
    for key, value in injected.items():
        if key in spec.injected or (key in params and key not in kwargs):
            kwargs[key] = value
    return load_callable(spec)(**kwargs)
