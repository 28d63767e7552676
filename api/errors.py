"""The API's error shapes, one per kind of failure, and the handlers that produce them.

- 422: `{"errors": [{"loc": "optimizer.lr", "msg": "...", "fix": "..."}]}` for anything the
  caller sent wrong (recipe fields, body fields, query parameters); `loc` is a dotted path
  without the `body.` / `query.` prefix.
- every other error: `{"error": {"code": "not_found", "message": "...", ...}}`; a 409 for a
  state conflict adds `current_status` (and `job_id`), an idempotency conflict adds `job_id`,
  an ambiguous job id prefix adds `candidates`.

A body that is not JSON is a 422 at `body` saying where it broke (line, column, character),
and an unknown body field gets a "did you mean" among the fields of the model it sits in
(`recipe_yml` -> `recipe_yaml`, `resources.nproc_per_nod` -> `nproc_per_node`).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from jobs.recipe.errors import FieldError, did_you_mean
from jobs.recipe.load.schema_errors import request_field_errors

log = logging.getLogger("tuneyard.api")

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "content_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
    503: "unavailable",
}


class ApiError(Exception):
    """Raise from a route to answer `{"error": {"code", "message", **extra}}`."""

    def __init__(self, status: int, code: str, message: str, **extra: Any):
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra
        super().__init__(message)


class InvalidRequest(Exception):
    """Raise from a route to answer 422 with FieldErrors."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def _error_doc(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ERROR_SCHEMA}}}


# The error shapes as OpenAPI schemas (kept here beside the code that writes them).
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "additionalProperties": True,
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "current_status": {"type": "string"},
                "job_id": {"type": "string"},
            },
        }
    },
}
FIELD_ERRORS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["errors"],
    "additionalProperties": False,
    "properties": {
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["loc", "msg"],
                "properties": {
                    "loc": {"type": "string"},
                    "msg": {"type": "string"},
                    "fix": {"type": "string"},
                },
            },
        }
    },
}
# Answers any operation can give, documented once for all of them.
COMMON_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error_doc("The request could not be read (malformed JSON, nesting too deep)."),
    413: _error_doc("The body is larger than TUNEYARD_MAX_BODY_BYTES."),
    422: {
        "description": "Field errors: loc, msg, fix.",
        "content": {"application/json": {"schema": FIELD_ERRORS_SCHEMA}},
    },
    500: _error_doc("A server fault; the server log has it under the answer's X-Request-ID."),
}


def not_found(what: str, ident: str) -> ApiError:
    return ApiError(404, "not_found", f"{what} {ident} not found")


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def field_errors_response(errors: list[FieldError]) -> JSONResponse:
    return JSONResponse({"errors": [e.to_dict() for e in errors]}, status_code=422)


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse(error_body(exc.code, exc.message, **exc.extra), exc.status, headers)


async def _invalid_request(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidRequest)
    return field_errors_response(exc.errors)


def json_break(doc: object, pos: int, reason: str) -> FieldError:
    """The error for a body that is not JSON, saying where the parser stopped."""
    where = f"character {pos}"
    if isinstance(doc, str) and 0 <= pos <= len(doc):
        line, column = doc.count("\n", 0, pos) + 1, pos - doc.rfind("\n", 0, pos)
        where = f"line {line}, column {column} ({where})"
    return FieldError(
        "body",
        f"the body is not valid JSON: {reason} at {where}",
        f"fix the JSON at {where.split(' (')[0]} (a missing comma or quote, a trailing "
        "comma), or send the recipe as `recipe_yaml` text",
    )


def _body_model(request: Request) -> type[BaseModel] | None:
    """The pydantic model the matched route reads its body into, if any."""
    field = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(getattr(field, "field_info", None), "annotation", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _sibling_fields(model: type[BaseModel] | None, path: tuple[Any, ...]) -> list[str]:
    """The field names of the model at `path` inside `model` (empty when it is no model)."""
    for part in path:
        field = model.model_fields.get(str(part)) if model else None
        inner = field.annotation if field else None
        model = inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None
    return list(model.model_fields) if model else []


def request_errors(
    request: Request, errors: list[dict[str, Any]], body: object
) -> list[FieldError]:
    """FieldErrors for a refused request: JSON breaks located, unknown body fields with a
    did-you-mean among their model's fields."""
    out = []
    for err, field_error in zip(errors, request_field_errors(errors), strict=True):
        loc = tuple(err.get("loc", ()))
        if err.get("type") == "json_invalid" and len(loc) == 2 and isinstance(loc[1], int):
            reason = str((err.get("ctx") or {}).get("error", "unreadable"))
            field_error = json_break(body, loc[1], reason)
        elif err.get("type") == "extra_forbidden" and loc[:1] == ("body",) and len(loc) > 1:
            hint = did_you_mean(str(loc[-1]), _sibling_fields(_body_model(request), loc[1:-1]))
            if hint:
                field_error = FieldError(field_error.loc, field_error.msg, hint)
        out.append(field_error)
    return out


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return field_errors_response(request_errors(request, list(exc.errors()), exc.body))


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _CODES.get(exc.status_code, "error")
    message = exc.detail if isinstance(exc.detail, str) else code
    return JSONResponse(error_body(code, message), exc.status_code, getattr(exc, "headers", None))


def install_error_handlers(app: FastAPI) -> None:
    """Handlers for the API's own errors; an unexpected exception is answered by
    `api.middleware.UnexpectedErrorMiddleware`, which keeps the connection open."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(InvalidRequest, _invalid_request)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
