"""Input that used to answer 500 now answers a 4xx in the API's error shape; an unexpected
server error keeps the keep-alive connection usable; every answer carries X-Request-ID."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn

BIGINT_PAST = str(2**63)


def new_job(client, stack, body) -> str:
    return client.post("/v1/jobs", json=body, headers=stack.headers()).json()["id"]


@pytest.mark.parametrize(("suffix", "params"), [
    ("/events", {"after": BIGINT_PAST}),
    ("/logs", {"after": BIGINT_PAST}),
    ("/logs", {"after": BIGINT_PAST, "follow": "true"}),
    ("/metrics/stream", {"after_id": BIGINT_PAST}),
    ("/metrics", {"after_step": BIGINT_PAST}),
])  # fmt: skip
def test_cursors_past_bigint_are_422(client, stack, body, suffix, params) -> None:
    job_id = new_job(client, stack, body)
    answer = client.get(f"/v1/jobs/{job_id}{suffix}", params=params, headers=stack.headers("read"))
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["loc"] in {"after", "after_id", "after_step"}


@pytest.mark.parametrize("header", ["²", "\u0661\u0662", BIGINT_PAST, "-1", "12abc", "9" * 30])
@pytest.mark.parametrize("suffix", ["/metrics/stream", "/logs?follow=true"])
def test_bad_last_event_id_is_422(client, stack, body, header, suffix) -> None:
    job_id = new_job(client, stack, body)
    headers = {**stack.headers("read"), "Last-Event-ID": header.encode("utf-8")}
    answer = client.get(f"/v1/jobs/{job_id}{suffix}", headers=headers)
    assert answer.status_code == 422, answer.text
    error = answer.json()["errors"][0]
    assert error["loc"] == "Last-Event-ID" and error["fix"]


def test_largest_bigint_cursor_is_an_empty_page(client, stack, body) -> None:
    job_id = new_job(client, stack, body)
    headers = stack.headers("read")
    events = client.get(f"/v1/jobs/{job_id}/events", params={"after": 2**63 - 1}, headers=headers)
    assert events.status_code == 200 and events.json()["data"] == []


def test_label_filter_with_nul_is_422(client, stack) -> None:
    answer = client.get("/v1/jobs", params={"label": "team=a\x00b"}, headers=stack.headers("read"))
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["loc"] == "label"


def test_request_id_is_echoed_or_made(client, stack) -> None:
    sent = client.get("/healthz", headers={"X-Request-ID": "ci-run-42.7"})
    assert sent.headers["x-request-id"] == "ci-run-42.7"
    made = client.get("/healthz", headers={"X-Request-ID": "bad id with spaces"})
    assert made.headers["x-request-id"] not in {"", "bad id with spaces"}
    assert len(made.headers["x-request-id"]) == 32


def _serve(app) -> tuple[uvicorn.Server, int, threading.Thread]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    return server, port, thread


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))  # fmt: skip
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


def test_a_500_keeps_the_connection_open(pg_stack) -> None:
    from api.main import create_app

    app = create_app(pg_stack.settings)

    def explode() -> None:
        raise RuntimeError("a fault the handlers do not know")

    app.add_api_route("/test-only/explode", explode)
    server, port, thread = _serve(app)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            request = b"GET /test-only/explode HTTP/1.1\r\nHost: x\r\n\r\n"
            sock.sendall(request)
            first = _read_response(sock)
            assert first.startswith(b"HTTP/1.1 500"), first
            assert b'"code":"internal"' in first and b"x-request-id" in first.lower()
            assert b"connection: close" not in first.lower()
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            second = _read_response(sock)
            assert second.startswith(b"HTTP/1.1 200"), second
    finally:
        server.should_exit = True
        thread.join(10)
