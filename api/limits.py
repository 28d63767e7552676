"""What the API bounds before a route sees a request: the body's size and time, its JSON numbers.

`BodyMiddleware` refuses a body over `TUNEYARD_MAX_BODY_BYTES` with a 413 in the API's
error shape. It trusts no header: a declared Content-Length over the limit is answered at
once, without reading the body, and the bytes of every body (chunked ones too) are counted
as they arrive, so reading stops at the limit instead of after the whole upload. It answers
408 and closes the connection when a body is still not complete
`TUNEYARD_BODY_TIMEOUT_SECONDS` after its request's headers.

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

import anyio
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_body
from jobs.recipe.load.bounds import Refused, bounded_int

TOO_LARGE = "content_too_large"


class BodyRefused(HTTPException):
    """Raised from `receive` when a body passes the size limit (413) or its deadline (408).
    An HTTPException, so FastAPI's body parsing lets it through to `answer_body_refused`;
    `Connection: close` makes uvicorn drop the connection instead of reading on."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(status, detail, headers={"Connection": "close"})
        self.code = code


def body_too_large(limit: int) -> BodyRefused:
    return BodyRefused(
        413,
        TOO_LARGE,
        f"the request body is larger than {limit} bytes; send a smaller body (a recipe is "
        "a few KB)",
    )


def body_overdue(seconds: float) -> BodyRefused:
    return BodyRefused(
        408,
        "request_timeout",
        f"the request body did not arrive within {seconds:g}s of its headers; send it at once "
        "(TUNEYARD_BODY_TIMEOUT_SECONDS on the server)",
    )


async def answer_body_refused(_: Request, exc: Exception) -> JSONResponse:
    """The refusal in the API's error shape, closing the connection."""
    assert isinstance(exc, BodyRefused)
    return JSONResponse(error_body(exc.code, str(exc.detail)), exc.status_code, exc.headers)


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses it; count the bytes instead
    return None


class BodyMiddleware:
    """413 for a body over `max_bytes`, counted as it streams; 408 for a body not complete
    `seconds` after the request reached the app."""

    def __init__(self, app: ASGIApp, max_bytes: int, seconds: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self.refuse(body_too_large(self.max_bytes), scope, receive, send)
            return
        deadline = anyio.current_time() + self.seconds
        received, body_done, started = 0, False, False

        async def guarded_receive() -> Message:
            nonlocal received, body_done
            if body_done:  # after the body only a disconnect comes: no deadline on that
                return await receive()
            try:
                with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                    message = await receive()
            except TimeoutError:
                raise body_overdue(self.seconds) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise body_too_large(self.max_bytes)
            body_done = message["type"] != "http.request" or not message.get("more_body")
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, guarded_receive, watched_send)
        except BodyRefused as exc:
            if started:  # a streaming route read on after answering: nothing left to say
                raise
            await self.refuse(exc, scope, receive, send)

    @staticmethod
    async def refuse(exc: BodyRefused, scope: Scope, receive: Receive, send: Send) -> None:
        await (await answer_body_refused(Request(scope), exc))(scope, receive, send)


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
