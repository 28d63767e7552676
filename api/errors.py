"""The API's error shapes, one per kind of failure, and the handlers that produce them.

- 422: `{"errors": [{"loc": "optimizer.lr", "msg": "...", "fix": "..."}]}` for anything the
  caller sent wrong (recipe fields, body fields, query parameters); `loc` is a dotted path
  without the `body.` / `query.` prefix.
- every other error: `{"error": {"code": "not_found", "message": "...", ...}}`; a 409 for a
  state conflict adds `current_status` (and `job_id`), an idempotency conflict adds `job_id`.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from jobs.recipe.errors import FieldError
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


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return field_errors_response(request_field_errors(exc.errors()))


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
