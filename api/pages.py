"""Pages: the shared cursor parameter, and JSON answers written straight from plain rows
(orjson, an ETag, and 304 on a match).

Every list answers `data`, `has_more` and `next_cursor`, and takes `cursor` back. Numbered
lists (events, log lines, metric steps) use the number as the cursor's text.

Large pages (a thousand metric records) skip pydantic's per-row validation: the rows come
from the store as dicts of plain values, the route's `response_model` still documents
the shape, and orjson writes them in a fraction of the time. The ETag is a digest of the
body, so `If-None-Match` spares the client the transfer of a page it already has.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from fastapi import Request, Response

from api.errors import InvalidRequest
from api.sse import parse_event_id
from jobs.recipe.errors import FieldError

CURSOR_DOC = (
    "The `next_cursor` of the previous page; wins over the older per-route parameter it replaces."
)


def numeric_cursor(cursor: str | None, fallback: int | None) -> int | None:
    """A page cursor of a numbered list (event, line, step): ASCII digits up to BIGINT."""
    if cursor is None:
        return fallback
    value = parse_event_id(cursor)
    if value is None:
        raise InvalidRequest(
            [
                FieldError(
                    "cursor",
                    "not a cursor returned by this server",
                    "pass the `next_cursor` of the previous page",
                )
            ]
        )
    return value


def etag_of(body: bytes) -> str:
    return 'W/"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'


def json_page(request: Request, payload: dict[str, Any]) -> Response:
    """`payload` as JSON with its ETag; 304 when the request's If-None-Match names it."""
    body = orjson.dumps(payload)
    etag = etag_of(body)
    sent = request.headers.get("if-none-match", "")
    if etag in (tag.strip() for tag in sent.split(",")) or sent.strip() == "*":
        return Response(status_code=304, headers={"ETag": etag})
    return Response(body, media_type="application/json", headers={"ETag": etag})
