"""What the API bounds before a route sees a request: the body's size and its JSON numbers.

`BodyLimitMiddleware` refuses a body over `TUNEYARD_MAX_BODY_BYTES` with a 413 in the API's
error shape. It trusts no header: a declared Content-Length over the limit is answered at
once, without reading the body, and the bytes of every body (chunked ones too) are counted
as they arrive, so reading stops at the limit instead of after the whole upload.

`BoundedJsonRoute` parses JSON bodies so that every number stays a value the recipe bounds
can judge: an integer of thousands of digits becomes a `Refused` marker (Python's parser
would raise, and FastAPI answer a bare 400), and `NaN`/`Infinity`, which Python accepts but
JSON does not, become markers too. `jobs.recipe.load.bounds.check_bounds` then reports them at
their field, as it does for the same values written in YAML.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_body
from jobs.recipe.load.bounds import Refused, bounded_int

TOO_LARGE = "content_too_large"


class BodyTooLarge(HTTPException):
    """Raised from `receive` once a body passes the limit. An HTTPException, so FastAPI's
    body parsing lets it through and the app's handler answers it in the error shape."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body is larger than {limit} bytes; send a "
            "smaller body (a recipe is a few KB)",
        )


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses it; count the bytes instead
    return None


class BodyLimitMiddleware:
    """413 for a request body over `max_bytes`, counted as it streams."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = str(BodyTooLarge(self.max_bytes).detail)
        response = JSONResponse(
            error_body(TOO_LARGE, message), status_code=413, headers={"Connection": "close"}
        )
        await response(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self.refuse(scope, receive, send)
            return
        received, started = 0, False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except BodyTooLarge:
            if started:  # a streaming route read on after answering: nothing left to say
                raise
            await self.refuse(scope, receive, send)


def _refuse_constant(name: str) -> Refused:
    return Refused(f"{name}, not a finite number", "give a finite number")


class BoundedJsonRequest(Request):
    """A request whose JSON body keeps out-of-range numbers as `Refused` markers."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json.loads(
                    body, parse_int=bounded_int, parse_constant=_refuse_constant
                )
            except RecursionError as exc:  # past ~1000 levels: Python's parser gives up
                raise HTTPException(
                    400, "the JSON body nests too deeply to read; a recipe may nest 32 levels"
                ) from exc
        return self._json


class BoundedJsonRoute(APIRoute):
    """An APIRoute whose handlers read JSON bodies through `BoundedJsonRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            return await handler(BoundedJsonRequest(request.scope, request.receive))

        return bounded
