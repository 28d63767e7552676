"""A real webhook receiver for tests: a threaded `http.server` on loopback that checks each
request's signature as docs/webhooks.md tells receivers to, records what it got, and
answers the status codes a test scripts for it (then 200).

`verify` is the documented check, written here from the docs rather than imported from the
sender, so a sender that signs anything else fails these tests.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOLERANCE_SECONDS = 300


def verify(secret: str, header: str, body: bytes, now: float | None = None) -> bool:
    """Whether `Tuneyard-Signature: t=<ts>,v1=<hex>` signs `body` with `secret`, recently."""
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((now or time.time()) - timestamp) > TOLERANCE_SECONDS:
        return False
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return hmac.compare_digest(expected.hexdigest(), parts.get("v1", ""))


@dataclass
class Received:
    path: str
    delivery_id: str
    event: str
    attempt: str
    verified: bool
    body: dict[str, Any]
    answered: int


@dataclass
class Receiver:
    """What the server got, and what it answers: `script[path]` pops a status per request."""

    secrets: dict[str, str] = field(default_factory=dict)  # path -> secret
    script: dict[str, list[int]] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def got(self, path: str | None = None) -> list[Received]:
        with self.lock:
            return [r for r in self.received if path is None or r.path == path]

    def handle(self, path: str, headers: Any, body: bytes) -> int:
        secret = self.secrets.get(path, "")
        verified = verify(secret, headers.get("Tuneyard-Signature", ""), body)
        with self.lock:
            queue = self.script.get(path) or []
            status = queue.pop(0) if queue else 200
            self.received.append(
                Received(
                    path,
                    headers.get("Tuneyard-Delivery", ""),
                    headers.get("Tuneyard-Event", ""),
                    headers.get("Tuneyard-Attempt", ""),
                    verified,
                    json.loads(body),
                    status,
                )
            )
        return status


def start_receiver() -> Receiver:
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status = receiver.handle(self.path, self.headers, body)
            answer = b"ok" if status < 300 else b"receiver says no " + b"x" * 3000
            self.send_response(status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    receiver.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=receiver.server.serve_forever, daemon=True).start()
    return receiver


def stop_receiver(receiver: Receiver) -> None:
    assert receiver.server is not None
    receiver.server.shutdown()
    receiver.server.server_close()
