"""`tuneyard api` drops slow clients and keeps keys out of its log (`api.server`, the serve
command).

A client that sends its request a byte at a time is answered 408 and disconnected once its
headers (TUNEYARD_HEADER_TIMEOUT_SECONDS) or body (TUNEYARD_BODY_TIMEOUT_SECONDS) are
overdue, while other clients are answered meanwhile; a key sent in the query string is
refused and appears in no log line.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from served_api import ServedApi, serve_api

HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 3.0
DRIP_EVERY_S = 0.3
# Far below the time the whole drip would take (a request of ~100 bytes: 30 s), far above
# the configured timeouts: a server that never gives up fails, a slow CI machine passes.
CLOSED_WITHIN_S = 10.0
SLOW_REQUEST = (
    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slowloris\r\n"
    b"Accept: */*\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedApi]:
    settings = {
        "TUNEYARD_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT_S),
        "TUNEYARD_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT_S),
        "TUNEYARD_AUTH": "on",
    }
    with serve_api(tmp_path_factory.mktemp("served") / "home", settings) as served:
        yield served


class Drip:
    """Sends `data` over a fresh connection one byte every DRIP_EVERY_S (after sending
    `head` at once) until the server closes it; `answer()` reads what came back."""

    def __init__(self, port: int, data: bytes, head: bytes = b"") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=CLOSED_WITHIN_S)
        self.data, self.sent = data, 0
        self.started = time.monotonic()
        if head:
            self.sock.sendall(head)
        self.thread = threading.Thread(target=self._drip, daemon=True)
        self.thread.start()

    def _drip(self) -> None:
        for byte in self.data:
            try:
                self.sock.send(bytes([byte]))
            except OSError:
                return
            self.sent += 1
            time.sleep(DRIP_EVERY_S)

    def answer(self) -> tuple[bytes, float]:
        """Everything the server sent until it closed, and when it closed (seconds)."""
        chunks = []
        while True:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                # The server closed while bytes were still dripping in: TCP answers those
                # bytes with a reset, which can reach us after the answer we already hold.
                break
            if not chunk:
                break
            chunks.append(chunk)
        closed_after = time.monotonic() - self.started
        self.sock.close()
        return b"".join(chunks), closed_after


def others_are_served(server: ServedApi, drip: Drip) -> None:
    """A normal client gets its answers while the slow one is still connected."""
    with httpx.Client(base_url=server.url, timeout=5) as client:
        for _ in range(3):
            assert client.get("/healthz").status_code == 200
    assert drip.thread.is_alive(), "the slow client was dropped before others were served"


def test_slow_headers_are_answered_408_and_closed_while_others_are_served(server) -> None:
    drip = Drip(server.port, SLOW_REQUEST)
    others_are_served(server, drip)
    answer, closed_after = drip.answer()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"connection: close" in answer.lower()
    assert closed_after < CLOSED_WITHIN_S
    assert drip.sent < len(SLOW_REQUEST), "the whole request went through"


def test_a_connection_that_sends_nothing_is_closed(server) -> None:
    drip = Drip(server.port, b"")
    answer, closed_after = drip.answer()
    assert answer.startswith(b"HTTP/1.1 408") and closed_after < CLOSED_WITHIN_S


def test_slow_body_is_answered_408_and_closed_while_others_are_served(server) -> None:
    body = json.dumps({"name": "slow", "recipe": {"padding": "x" * 200}}).encode()
    head = (
        b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    drip = Drip(server.port, body, head=head)
    others_are_served(server, drip)
    answer, closed_after = drip.answer()
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"connection: close" in rest.lower()
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    assert closed_after < CLOSED_WITHIN_S
    assert drip.sent < len(body)


@pytest.mark.parametrize("name", ["api_key", "token", "access_token", "key"])
def test_a_key_in_the_query_string_is_refused_and_never_logged(server, name) -> None:
    secret = f"ty_querystring-secret-{name}-0123456789abcdefghijklmnopqrstuvwxyz"
    answer = httpx.get(f"{server.url}/v1/jobs", params={name: secret}, timeout=5)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "credential_in_query"
    assert "Authorization: Bearer" in error["message"] and secret not in answer.text
    assert '"GET /v1/jobs" 400' in "\n".join(access_lines(server))  # the path alone
    assert "querystring-secret" not in server.log_text()


def access_lines(server: ServedApi) -> list[str]:
    lines = [json.loads(line) for line in server.log_text().splitlines() if line]
    return [line["msg"] for line in lines if line["logger"] == "tuneyard.access"]


def test_the_server_log_never_holds_a_query_string(server) -> None:
    answer = httpx.get(f"{server.url}/v1/jobs?limit=3&status=running", timeout=5)
    assert answer.status_code == 401
    assert any('"GET /v1/jobs" 401' in line for line in access_lines(server))
    assert "limit=3" not in server.log_text()
    assert '"logger": "uvicorn.access"' not in server.log_text()
