"""ASGI middlewares that wrap every request: the request id and the last-resort 500.

`RequestIdMiddleware` takes the caller's `X-Request-ID` (a short printable token) or makes
one, puts it in the log context (`jobs.store.log_context`) so every log line of the request
carries it, and echoes it on the answer.

`UnexpectedErrorMiddleware` turns an exception no handler took into the API's 500 shape
and does not re-raise it. Starlette's outermost error middleware re-raises after answering,
and uvicorn then drops the keep-alive connection: the client's next pooled request would be
reset. Here the connection stays usable.
"""

from __future__ import annotations

import logging
import re
import uuid

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_body
from jobs.store.log_context import log_context

log = logging.getLogger("tuneyard.api")
REQUEST_ID_HEADER = b"x-request-id"
_TOKEN = re.compile(rb"^[A-Za-z0-9._:\-]{1,128}$")


def request_id_of(scope: Scope) -> str:
    """The caller's X-Request-ID when it is a plain token, else a fresh one."""
    for name, value in scope.get("headers", ()):
        if name == REQUEST_ID_HEADER and _TOKEN.match(value):
            return value.decode("ascii")
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Gives each request an id, in its log lines and in the `X-Request-ID` answer header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((REQUEST_ID_HEADER, request_id.encode("ascii")))
                message = {**message, "headers": headers}
            await send(message)

        with log_context(request_id=request_id):
            await self.app(scope, receive, send_with_id)


class UnexpectedErrorMiddleware:
    """A 500 in the error shape for any unhandled exception, keeping the connection open."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if started:  # a stream broke half-way: nothing valid can be said any more
                raise
            body = error_body("internal", "internal server error; see the server log")
            await JSONResponse(body, status_code=500)(scope, receive, send)
