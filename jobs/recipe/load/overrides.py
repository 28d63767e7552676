"""Command-line overrides of recipe values, in the seed's form.

`parse_overrides` reads `--optimizer.lr 1e-4`, `--step_scheduler.max_steps=500`,
`optimizer.lr=1e-4` and a bare `--flag` (true) into `(dotted key, typed value)` pairs.
`apply_overrides` writes them into a copy of the recipe. It never decides whether a key
exists: the schema does that after the overrides are applied, so an override of an unknown
key fails exactly like the same typo in the YAML, at its path, with a suggestion. A request
holds at most `MAX_OVERRIDES` of them, each key at most `MAX_DEPTH` parts deep; their values
draw on the request's one `NodeBudget`, parsed one at a time (`typed_overrides`) so each
sees what the recipe and the values before it have spent.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from jobs.recipe.errors import FieldError, RecipeInvalid, shown
from jobs.recipe.load.bounds import MAX_DEPTH, MAX_ERRORS, MAX_STRING, NodeBudget
from jobs.recipe.load.yaml_loader import parse_scalar

LOC = "overrides"
MAX_OVERRIDES = 200  # a job's overrides tune a few values; the rest belongs in the recipe
_KEY = re.compile(r"\A[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)*\Z")
FORMS = "write overrides as --section.key value, --section.key=value or section.key=value"


TOO_MANY = FieldError(
    LOC,
    f"has more than {MAX_OVERRIDES} overrides",
    f"set the values in the recipe itself; keep at most {MAX_OVERRIDES} overrides",
)


def too_many(count: int) -> FieldError | None:
    """`TOO_MANY` for a request of more than `MAX_OVERRIDES` overrides, else None."""
    return TOO_MANY if count > MAX_OVERRIDES else None


def _check_key(key: str, token: str) -> FieldError | None:
    if len(key) > MAX_STRING or not _KEY.match(key):
        return FieldError(LOC, f"{shown(token)} is not a dotted recipe key", FORMS)
    if key.count(".") >= MAX_DEPTH:
        return FieldError(
            LOC,
            f"{shown(token)} names a key {key.count('.') + 1} levels deep; at most {MAX_DEPTH}",
            "override a key of the recipe's own sections",
        )
    return None


def override_texts(tokens: Sequence[str] | str) -> tuple[list[str], list[FieldError]]:
    """Tokens as `key=text` strings (the API's form), the value's text kept as typed.

    `--a.b v`, `--a.b=v` and `a.b=v` keep the value's text; a bare `--flag` (last, or before
    another `--` token) is `flag=true`. The CLI sends these strings to the server, which
    reads them with `parse_overrides`, so both sides share this one grammar.
    """
    if isinstance(tokens, str):
        tokens = [tokens]
    texts: list[str] = []
    errors: list[FieldError] = []
    i = 0
    while i < len(tokens):
        if len(texts) + len(errors) == MAX_OVERRIDES:  # one more is one too many: stop here
            return [], [TOO_MANY]
        if len(errors) == MAX_ERRORS:  # a report, not one error per token
            break
        token = str(tokens[i])
        i += 1
        body = token[2:] if token.startswith("--") else token
        if "=" in body:
            key, _, raw = body.partition("=")
        elif token.startswith("--"):
            key, raw = body, "true"
            if i < len(tokens) and not str(tokens[i]).startswith("--"):
                raw, i = str(tokens[i]), i + 1
        else:
            fix = "write --section.key value or section.key=value"
            errors.append(FieldError(LOC, f"{shown(token)} is not an override", fix))
            continue
        problem = _check_key(key, token)
        if problem:
            errors.append(problem)
        else:
            texts.append(f"{key}={raw}")
    return texts, errors


def parse_overrides(
    tokens: Sequence[str] | str, budget: NodeBudget | None = None
) -> list[tuple[str, Any]]:
    """Typed (key, value) pairs; raises RecipeInvalid naming every malformed token."""
    return list(typed_overrides(tokens, budget))


def typed_overrides(
    tokens: Sequence[str] | str, budget: NodeBudget | None = None
) -> Iterator[tuple[str, Any]]:
    """Typed (key, value) pairs, each value parsed only when asked for, against what `budget`
    has left then (a caller that checks each value before the next makes later ones see what
    earlier ones spent); raises RecipeInvalid, at the first pair, naming every bad token."""
    texts, errors = override_texts(tokens)
    if errors:
        raise RecipeInvalid(errors)
    for key, _, raw in (t.partition("=") for t in texts):
        yield key, parse_scalar(raw, budget)


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
