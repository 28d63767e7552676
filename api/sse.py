"""Server-sent events: a polling loop over the database, resumable by event id.

Each event carries the row id as its SSE `id`, so a client that reconnects with
`Last-Event-ID` (browsers do this by themselves) continues exactly after the last record it
saw. The stream ends with an `end` event once the job is in a terminal state and nothing is
left to send; a comment line every few seconds keeps proxies from closing an idle stream.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from api.errors import InvalidRequest
from jobs.recipe.errors import FieldError
from jobs.store.status import is_terminal

POLL_SECONDS = 0.5
KEEPALIVE_SECONDS = 10.0
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

# fetch(after_id) -> (rows with an "id", job status or None when the job vanished)
Fetch = Callable[[int], tuple[list[dict[str, Any]], str | None]]


def format_event(event: str, data: Any, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


MAX_EVENT_ID = 2**63 - 1  # row ids are BIGINT


def parse_event_id(raw: str) -> int | None:
    """A row id from text: ASCII digits only (`str.isdigit` also accepts `²`), at most
    BIGINT; None for anything else."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
        return None
    value = int(raw)
    return value if value <= MAX_EVENT_ID else None


def last_event_id(request: Request, fallback: int = 0) -> int:
    """`Last-Event-ID` when sent (it wins over the query cursor), else `fallback`.

    Raises InvalidRequest for a header that is not a row id this server could have sent.
    """
    raw = request.headers.get("last-event-id")
    if raw is None or raw == "":
        return fallback
    value = parse_event_id(raw.strip())
    if value is None:
        raise InvalidRequest(
            [
                FieldError(
                    "Last-Event-ID",
                    f"'{raw[:40]}' is not an event id (ASCII digits, at most {MAX_EVENT_ID})",
                    "send the `id` of the last event received, or no header to start from the cursor",
                )
            ]
        )
    return value


async def stream_rows(request: Request, fetch: Fetch, event: str, after: int) -> AsyncIterator[str]:
    """Yield every row after `after` as it appears; finish when the job has ended."""
    cursor, quiet_since = after, time.monotonic()
    yield ": stream open\n\n"
    while True:
        rows, status = await run_in_threadpool(fetch, cursor)
        for row in rows:
            cursor = int(row["id"])
            yield format_event(event, row, cursor)
        if rows:
            quiet_since = time.monotonic()
            continue
        if status is None or is_terminal(status):
            yield format_event("end", {"status": status, "last_event_id": cursor})
            return
        if await request.is_disconnected():
            return
        if time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
            quiet_since = time.monotonic()
            yield ": keep-alive\n\n"
        await asyncio.sleep(POLL_SECONDS)
