"""Turning pydantic validation errors into tuneyard `FieldError`s.

Every schema in `jobs` (recipe sections, strategy configs, resources) is a pydantic model
that forbids unknown keys. `field_errors` maps each pydantic error to a `FieldError` with a
dotted `loc` under the section's prefix, a plain message, and a fix: a "did you mean" for
an unknown key, the accepted values for a literal, the bound for a number. A key is
quoted through `shown`, cut to a hundred characters; a validator's own message is cut by
`FieldError` itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from jobs.recipe.errors import FieldError, did_you_mean, shown
from jobs.recipe.load.bounds import escaped


def _loc(prefix: str, parts: Iterable[Any]) -> str:
    tail = escaped(".".join(str(p) for p in parts))  # keys are the user's: show, never act
    if not tail:
        return prefix
    return f"{prefix}.{tail}" if prefix else tail


def _fix_for(kind: str, err: dict[str, Any], loc: str) -> str:
    ctx = err.get("ctx") or {}
    if kind == "literal_error":
        return f"set {loc} to one of {ctx.get('expected', '')}"
    if kind in {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}:
        bound = next(iter(ctx.values()), "")
        op = {
            "greater_than": ">",
            "greater_than_equal": ">=",
            "less_than": "<",
            "less_than_equal": "<=",
        }[kind]
        return f"set {loc} to a value {op} {bound}"
    if kind.startswith(("int_", "float_", "bool_", "string_", "list_", "dict_")):
        expected = kind.split("_")[0].replace("dict", "mapping")
        return f"set {loc} to a {expected}"
    if kind == "missing":
        return f"set {loc}"
    return f"fix {loc}"


def field_errors(exc: ValidationError, prefix: str, known: Iterable[str] = ()) -> list[FieldError]:
    """FieldErrors for every error in `exc`, located under `prefix` (e.g. 'step_scheduler')."""
    return errors_from_pydantic(exc.errors(include_url=False), prefix, known)


# Where FastAPI found a request value; a field error names the field, not the transport.
REQUEST_PARTS = frozenset({"body", "query", "path", "header", "cookie"})


def request_field_errors(errors: Iterable[dict[str, Any]]) -> list[FieldError]:
    """FieldErrors for a request FastAPI refused, located without the `body`/`query` part."""
    stripped = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        if loc and loc[0] in REQUEST_PARTS:
            loc = loc[1:] or (loc[0],)
        stripped.append({**err, "loc": loc})
    return errors_from_pydantic(stripped, "")


def errors_from_pydantic(
    errors: Iterable[dict[str, Any]], prefix: str, known: Iterable[str] = ()
) -> list[FieldError]:
    """One FieldError per pydantic error dict: the dotted `loc`, a plain message, a fix."""
    known = list(known)
    out: list[FieldError] = []
    for err in errors:
        parts = [p for p in err.get("loc", ()) if not _is_union_tag(p)]
        loc = _loc(prefix, parts) or "body"
        kind = err.get("type", "")
        if kind in {"extra_forbidden", "unexpected_keyword_argument"}:
            key = str(parts[-1]) if parts else ""
            hint = did_you_mean(key, known) if len(parts) == 1 else ""
            out.append(FieldError(loc, f"unknown key {shown(key)}", hint or f"remove {loc}"))
            continue
        msg, fix = err.get("msg", "invalid"), _fix_for(kind, err, loc)
        if kind == "value_error":
            msg, _, given_fix = msg.removeprefix("Value error, ").partition(" | fix: ")
            fix = given_fix or fix
        out.append(FieldError(loc, msg, fix))
    return out


def _is_union_tag(part: Any) -> bool:
    """pydantic puts the union member's type name in `loc` (e.g. 'int', 'literal[...]')."""
    return isinstance(part, str) and (
        part in {"int", "float", "bool", "str", "none"}
        or part.startswith(("literal[", "function-", "list[", "tuple[", "dict[", "constrained-"))
    )
