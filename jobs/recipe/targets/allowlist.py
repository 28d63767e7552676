"""The `_target_` allowlist: which callables a recipe may name, and how they are built.

A recipe section with `_target_` names a callable; its sibling keys become keyword
arguments and nested `_target_` dicts are built first (`instantiate`, for a validated
recipe's `TargetCall`). Only names in `TARGETS` resolve:
tuneyard's own builders, `torch.optim` optimizers and LR schedulers, torch loss modules,
and the `nemo_automodel.*` names seed recipes use, as aliases of ours. Each `TargetSpec`
lists the keyword names a recipe may give (`params`, static so validation needs no torch)
and the ones the trainer supplies at run time (`injected`); a model or config loader's other
keywords are config overrides, never transformers' loader options
(`jobs.recipe.targets.loader_kwargs`). Anything else (`os.system`,
`pickle.loads`, `file.py:attr`, private attributes) is refused at `<section>._target_`
and never imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from jobs.recipe.errors import FieldError, RecipeInvalid, did_you_mean, shown
from jobs.recipe.load.plain import LEAVES
from jobs.recipe.load.schema_errors import field_errors
from jobs.recipe.targets.loader_kwargs import override_keyword_errors
from jobs.recipe.targets.refused import REFUSED_TARGETS
from jobs.recipe.targets.table import CANONICAL, KWARG_SYNONYMS, TARGETS, TargetSpec
from jobs.recipe.typed import TargetCall

__all__ = [
    "TARGETS",
    "TargetSpec",
    "instantiate",
    "check_target_section",
    "fold_kwarg_synonyms",
    "is_target_section",
    "load_callable",
    "resolve_target",
    "stray_target_errors",
    "target_warnings",
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
    if name in REFUSED_TARGETS:  # AutoModel's own, refused on purpose: why and what instead
        why, fix = REFUSED_TARGETS[name]
        raise RecipeInvalid([FieldError(loc, f"{shown(name)} is refused: {why}", fix)])
    hint = did_you_mean(name, TARGETS)
    fix = hint or "use one of: " + ", ".join(sorted(CANONICAL))
    raise RecipeInvalid(
        [FieldError(loc, f"{shown(name)} is refused: {_refusal_reason(name)}", fix)]
    )


def load_callable(spec: TargetSpec) -> Any:
    """Import an allowlisted callable (importlib + getattr chain). Refuses any other spec."""
    if spec not in _ALLOWED_SPECS:
        raise RecipeInvalid(
            [
                FieldError(
                    "_target_",
                    f"{spec.name!r} is not on the allowlist",
                    "use a name from jobs.recipe.targets.allowlist.TARGETS",
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
    errors += override_keyword_errors(spec, kwargs, loc)
    errors += _value_errors(spec, kwargs, loc)
    for key, value in kwargs.items():
        errors += _nested_errors(spec, key, value, f"{loc}.{key}")
    return spec, errors


def _nested_errors(spec: TargetSpec, key: str, value: Any, loc: str) -> list[FieldError]:
    """A built object only where the spec takes one, of an accepted kind, fully checked."""
    kinds = spec.nested.get(key)
    if kinds and is_target_section(value):
        nested, errors = check_target_section(value, loc)
        if nested is not None and nested.kind not in kinds:
            msg = f"{nested.name} is a {nested.kind}; {spec.name}'s {key} takes a {_or(kinds)}"
            errors.append(FieldError(f"{loc}._target_", msg, f"name a {_or(kinds)} here"))
        return errors
    return stray_target_errors(value, loc)


def _value_errors(spec: TargetSpec, kwargs: Mapping[str, Any], loc: str) -> list[FieldError]:
    """The spec's value model over the keywords it types (a bool, a column mapping, ...)."""
    if spec.values is None:
        return []
    model: Any = spec.values
    typed = {k: v for k, v in kwargs.items() if k in model.model_fields}
    try:
        model.model_validate(typed)
    except ValidationError as exc:
        return field_errors(exc, loc, model.model_fields)
    return []


def target_warnings(section: Mapping[str, Any], loc: str) -> list[FieldError]:
    """What a target section gives that is accepted but not used, nested targets included."""
    target = section.get("_target_") if is_target_section(section) else None
    spec = TARGETS.get(target) if isinstance(target, str) else None
    if spec is None:
        return []
    warnings = [FieldError(loc, f"accepted: {spec.always_warn}")] if spec.always_warn else []
    for key, value in section.items():
        if key in spec.ignored:
            warnings.append(
                FieldError(f"{loc}.{key}", f"accepted and ignored: {spec.ignored[key]}")
            )
        elif spec.nested.get(key) and is_target_section(value):
            warnings += target_warnings(value, f"{loc}.{key}")
    return warnings


def _or(kinds: frozenset[str]) -> str:
    return " or ".join(sorted(kinds))


def target_mappings(value: Any, loc: str) -> list[tuple[str, Mapping[str, Any]]]:
    """(location, mapping) of every mapping with a `_target_` key in `value`, nested ones
    and lists included, in document order."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    _collect_targets(value, loc, found)
    return found


def target_locations(value: Any, loc: str) -> list[str]:
    """The location of every mapping with a `_target_` key in `value` (lists included)."""
    return [where for where, _ in target_mappings(value, loc)]


def _collect_targets(value: Any, loc: str, found: list[tuple[str, Mapping[str, Any]]]) -> None:
    # Only containers are visited and their locations spelled: most values are leaves.
    if isinstance(value, Mapping):
        if "_target_" in value:
            found.append((loc, value))
        for key, item in value.items():
            if type(item) not in LEAVES:
                _collect_targets(item, f"{loc}.{key}" if loc else str(key), found)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            if type(item) not in LEAVES:
                _collect_targets(item, f"{loc}.{index}", found)


def stray_target_errors(value: Any, loc: str) -> list[FieldError]:
    """A `_target_` where the schema takes a plain value is refused at its path, unbuilt."""
    return [
        FieldError(
            f"{where}._target_" if where else "_target_",
            "a built object is not allowed here: this field takes a plain value",
            f"write the value of {where or 'this field'} itself, without _target_",
        )
        for where in target_locations(value, loc)
    ]


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
        elif key not in spec.params and not spec.overrides:
            hint = did_you_mean(str(key), spec.params)
            errors.append(
                FieldError(
                    f"{loc}.{key}",
                    f"{spec.name} takes no argument {shown(key)}",
                    hint or "accepted: " + ", ".join(sorted(spec.params)),
                )
            )
    for key in sorted(spec.required - set(kwargs)):
        errors.append(FieldError(f"{loc}.{key}", f"is required by {spec.name}", f"set {loc}.{key}"))
    return errors


def instantiate(call: TargetCall, loc: str, **injected: Any) -> Any:
    """Build a validated recipe's `_target_`: nested targets first, then the callable.

    The recipe passed every check when it was submitted, so its keywords are not checked
    again; every name still resolves through the allowlist, and a nested `_target_` is built
    only at a keyword its spec says takes one (anywhere else it stays a plain value). Of the
    `injected` keywords, a spec gets those it declares as injected, plus defaults for its
    own params the recipe leaves out (`max_steps` for a scheduler), so the trainer may offer
    the same `tokenizer=` to every dataset.
    """
    spec = resolve_target(call.target, f"{loc}._target_")
    kwargs = {}
    for key, value in call.kwargs.items():
        nested = bool(spec.nested.get(key)) and is_target_section(value)
        at = f"{loc}.{key}"
        kwargs[key] = instantiate(TargetCall.from_json(value), at) if nested else value
    params = spec.params or frozenset()
    for key, value in injected.items():
        if key in spec.injected or (key in params and key not in kwargs):
            kwargs[key] = value
    return load_callable(spec)(**kwargs)
