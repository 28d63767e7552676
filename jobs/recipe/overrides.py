"""Command-line overrides of recipe values, in the seed's form.

`parse_overrides` reads `--optimizer.lr 1e-4`, `--step_scheduler.max_steps=500`,
`optimizer.lr=1e-4` and a bare `--flag` (true) into `(dotted key, typed value)` pairs.
`apply_overrides` writes them into a copy of the recipe. It never decides whether a key
exists: the schema does that after the overrides are applied, so an override of an unknown
key fails exactly like the same typo in the YAML, at its path, with a suggestion.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Sequence
from typing import Any

from jobs.recipe.errors import FieldError, RecipeInvalid
from jobs.recipe.yaml_loader import parse_scalar

LOC = "overrides"
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)*$")


def _check_key(key: str, token: str) -> FieldError | None:
    if _KEY.match(key):
        return None
    return FieldError(
        LOC,
        f"{token!r} is not a dotted recipe key",
        "write overrides as --section.key value, --section.key=value or section.key=value",
    )


def parse_overrides(tokens: Sequence[str] | str) -> list[tuple[str, Any]]:
    """Typed (key, value) pairs; raises RecipeInvalid naming every malformed token."""
    if isinstance(tokens, str):
        tokens = [tokens]
    pairs: list[tuple[str, Any]] = []
    errors: list[FieldError] = []
    i = 0
    while i < len(tokens):
        token = str(tokens[i])
        i += 1
        body = token[2:] if token.startswith("--") else token
        if "=" in body:
            key, _, raw = body.partition("=")
            value = parse_scalar(raw)
        elif token.startswith("--"):
            key = body
            if i < len(tokens) and not str(tokens[i]).startswith("--"):
                value, i = parse_scalar(str(tokens[i])), i + 1
            else:
                value = True
        else:
            errors.append(
                FieldError(
                    LOC,
                    f"{token!r} is not an override",
                    "write --section.key value or section.key=value",
                )
            )
            continue
        problem = _check_key(key, token)
        if problem:
            errors.append(problem)
        else:
            pairs.append((key, value))
    if errors:
        raise RecipeInvalid(errors)
    return pairs


def apply_overrides(
    recipe: dict[str, Any],
    overrides: Iterable[tuple[str, Any]],
) -> tuple[dict[str, Any], list[FieldError]]:
    """A deep copy of `recipe` with each override set; errors where a path is not a section."""
    result = copy.deepcopy(recipe)
    errors: list[FieldError] = []
    for key, value in overrides:
        node = result
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                errors.append(
                    FieldError(
                        key, f"{where} is a value, not a section", f"override {where} itself"
                    )
                )
                break
            node = child
        else:
            node[parts[-1]] = value
    return result, errors


def override_keys(overrides: Iterable[tuple[str, Any]]) -> set[str]:
    return {key for key, _ in overrides}
