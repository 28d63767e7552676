"""ASGI middlewares that wrap every request: the request id, the access log, security
headers, refusing keys in URLs and the last-resort 500 (`api.limits` bounds the body).

`RequestIdMiddleware` takes the caller's `X-Request-ID` (a short printable token) or makes
one, puts it in the log context (`jobs.store.log_context`) so every log line of the request
carries it, and echoes it on the answer.

`AccessLogMiddleware` logs each answer as it starts (method, path, status, time) without
the query string, and `KeyInQueryMiddleware` refuses a request whose query string carries a
credential (`?api_key=`, `?token=`, or any value shaped like a tuneyard key) with a 400
naming the header to use: a URL ends up in access logs, proxies and browser history.

`SecurityHeadersMiddleware` adds to every answer a same-origin Content-Security-Policy, and
the headers that forbid framing, MIME sniffing and sending the page's URL as a referrer. An
answer that sets its own policy (the API docs pages) keeps it.

`UnexpectedErrorMiddleware` turns an exception no handler took into the API's 500 shape
and does not re-raise it. Starlette's outermost error middleware re-raises after answering,
and uvicorn then drops the keep-alive connection: the client's next pooled request would be
reset. Here the connection stays usable.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from urllib.parse import parse_qsl

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_body
from jobs.store.api_keys import KEY_PREFIX
from jobs.store.log_context import log_context

log = logging.getLogger("tuneyard.api")
access_log = logging.getLogger("tuneyard.access")
REQUEST_ID_HEADER = b"x-request-id"
_TOKEN = re.compile(rb"\A[A-Za-z0-9._:\-]{1,128}\Z")


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


class AccessLogMiddleware:
    """One log line per answer, as it starts: client, method, path (never the query string),
    status and milliseconds until then; inside `RequestIdMiddleware`, so the line carries
    the request id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def logged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                client = scope.get("client") or ("-", 0)
                access_log.info(
                    '%s - "%s %s" %d %.1fms',
                    client[0],
                    scope["method"],
                    scope["path"],
                    message["status"],
                    (time.perf_counter() - started) * 1000,
                )
            await send(message)

        await self.app(scope, receive, logged_send)


# Query parameter names (lower case, `-` read as `_`) that carry a credential.
CREDENTIAL_PARAMS = frozenset(
    {"api_key", "apikey", "x_api_key", "key", "token", "access_token", "auth", "authorization"}
    | {"bearer", "password", "secret"}
)
# A tuneyard key anywhere in a value (`jobs.store.api_keys.generate_key`: 43 characters).
_KEY_SHAPE = re.compile(r"(?<![\w-])" + re.escape(KEY_PREFIX) + r"[\w-]{40,}")
KEY_IN_QUERY = "credential_in_query"


def credential_in_query(query_string: bytes) -> str | None:
    """What in the query string carries a credential (for the refusal), or None."""
    pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
    for name, value in pairs:
        if name.strip().lower().replace("-", "_") in CREDENTIAL_PARAMS:
            return f"the query parameter `{name.strip().lower()}`"
        if _KEY_SHAPE.search(value):
            return "an API key in the query string"
    return None


class KeyInQueryMiddleware:
    """400 for a request whose query string carries a credential, before any route (or any
    log line but the access log's, which leaves the query string out) sees it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = None
        if scope["type"] == "http":
            found = credential_in_query(scope.get("query_string", b""))
        if found is None:
            await self.app(scope, receive, send)
            return
        message = (
            f"{found} is refused: a URL is kept in access logs, proxies and browser "
            "history; send the key as the header `Authorization: Bearer <api key>` instead "
            "(and revoke this one if it was real)"
        )
        await JSONResponse(error_body(KEY_IN_QUERY, message), status_code=400)(scope, receive, send)


# The dashboard loads only its own files: no inline script or style, no other origin, and
# no page may frame it. `data:` images: the page's empty favicon.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode("ascii")),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


class SecurityHeadersMiddleware:
    """The security headers on every answer, unless the answer set that header itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [pair for pair in SECURITY_HEADERS if pair[0] not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
