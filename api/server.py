"""How `tuneyard api` serves the app: uvicorn's options, and the HTTP protocol it parses
requests with.

uvicorn bounds the idle time between requests (`timeout_keep_alive`) but not the time a
request's headers take to arrive: a client sending them a byte at a time keeps its
connection, and a slot of the server, for as long as it likes. `HeaderTimeoutProtocol` is
uvicorn's own httptools protocol, selected through uvicorn's `http=` option, with one timer
per request: started when the connection opens or a request's first byte arrives, stopped
when its headers are complete. When it fires the client gets a 408 and the connection is
closed. The body has its own deadline once the app reads it
(`api.limits.BodyMiddleware`).

uvicorn's access log prints each request's query string; `tuneyard api` turns it off and
`api.middleware.AccessLogMiddleware` writes the same line with the path alone.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from jobs.store.settings import get_settings

log = logging.getLogger("tuneyard.api")
TIMED_OUT = b"request headers not received in time"


def uvicorn_options() -> dict[str, Any]:
    """What `uvicorn.run` takes beyond address and workers: by class path, so each worker
    process imports the protocol itself."""
    return {"http": f"{__name__}:HeaderTimeoutProtocol", "access_log": False}


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on every request's headers
    (`TUNEYARD_HEADER_TIMEOUT_SECONDS`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = get_settings().header_timeout_seconds
        self.header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # The first request's clock started with the connection; a later one's starts here.
        if self.header_timer is None:
            self._start_header_timer()

    def on_headers_complete(self) -> None:
        self._stop_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    def _start_header_timer(self) -> None:
        self.header_timer = self.loop.call_later(self.header_timeout, self._headers_timed_out)

    def _stop_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _headers_timed_out(self) -> None:
        self.header_timer = None
        if self.transport.is_closing():
            return
        log.info(
            "closed a connection from %s: request headers not complete within %.1fs",
            self.client[0] if self.client else "?",
            self.header_timeout,
        )
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request trickles in behind one still being answered: that answer
            # is finished, and then the connection closes.
            self.cycle.keep_alive = False
            return
        head = [b"HTTP/1.1 408 Request Timeout\r\n"]
        head += [
            name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers
        ]
        head.append(b"content-type: text/plain; charset=utf-8\r\nconnection: close\r\n")
        head.append(b"content-length: %d\r\n\r\n" % len(TIMED_OUT))
        self.transport.write(b"".join(head) + TIMED_OUT)
        self.transport.close()
