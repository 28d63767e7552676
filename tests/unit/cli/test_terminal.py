"""The CLI shows what a server sent instead of letting a terminal act on it: a job name,
label, state, error text or log line holding ESC, BEL, CR or a bidirectional override is
printed as visible escapes, by every client command (`printable` in `cli.terminal`).

The commands talk to a real HTTP server on localhost that answers as a hostile or
corrupted tuneyard would."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import typer
from typer.testing import CliRunner

from cli import client_cmds
from cli.terminal import markup_safe, printable

EVIL = "\x1b[31mred\x07"
SHOWN = "\\x1b[31mred\\x07"
JOB = {
    "id": "job-1",
    "name": EVIL,
    "project": "p",
    "status": "failed",
    "attempt": 1,
    "max_attempts": 3,
    "labels": {"team": EVIL},
    "max_steps": 10,
    "latest_metrics": {"step": 3, "loss": 1.5},
    "error_code": "trainer_error",
    "error_message": f"boom {EVIL}\r\u202eevil",
    "created_at": "2024-01-01T00:00:00",
}
ANSWERS = {
    ("GET", "/v1/jobs"): (200, {"data": [JOB], "has_more": False, "next_cursor": None}),
    ("GET", "/v1/jobs/job-1"): (200, JOB),
    ("GET", "/v1/jobs/job-1/logs"): (
        200,
        {"data": [{"id": 1, "attempt": 1, "stream": "stdout", "text": f"step\t1 {EVIL}"}]},
    ),
    ("POST", "/v1/jobs/job-1/cancel"): (
        409,
        {"error": {"code": "conflict", "message": f"no {EVIL}", "current_status": EVIL}},
    ),
    ("POST", "/v1/jobs"): (
        422,
        {"errors": [{"loc": f"name{EVIL}", "msg": f"bad {EVIL}", "fix": f"fix {EVIL}"}]},
    ),
}


class _Server(BaseHTTPRequestHandler):
    def _answer(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        status, body = ANSWERS.get((method, self.path.split("?")[0]), (404, {}))
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer("GET")

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self._answer("POST")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def tuneyard(server: str, *args: str):
    app = typer.Typer()
    client_cmds.register(app)
    return CliRunner().invoke(app, [*args, "--server", server])


def assert_shown(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert SHOWN in text


def test_printable_writes_escapes() -> None:
    assert printable(EVIL) == SHOWN
    assert printable("a\r\u202eb\x9b") == "a\\r\\u202eb\\x9b"
    assert printable("tab\there", keep="\t") == "tab\there"
    assert markup_safe("[red]x[/red]\x1b") == "\\[red]x\\[/red]\\x1b"


def test_jobs_lists_names_as_escapes_and_json_stays_exact(server) -> None:
    done = tuneyard(server, "jobs")
    assert done.exit_code == 0, done.stderr
    assert_shown(done.stdout)
    as_json = tuneyard(server, "jobs", "--json")
    assert "\x1b" not in as_json.stdout and json.loads(as_json.stdout)[0]["name"] == EVIL


def test_status_shows_name_and_error_as_escapes(server) -> None:
    done = tuneyard(server, "status", "job-1")
    assert_shown(done.stdout)
    assert "\r" not in done.stdout and "\\r\\u202eevil" in done.stdout


def test_wait_reports_the_failure_as_escapes(server) -> None:
    done = tuneyard(server, "wait", "job-1")
    assert done.exit_code == 1
    assert_shown(done.stderr)


def test_logs_keep_tabs_and_escape_the_rest(server) -> None:
    done = tuneyard(server, "logs", "job-1")
    assert_shown(done.stdout)
    assert "step\t1" in done.stdout


def test_a_refusal_and_its_field_errors_are_escaped(server, tmp_path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("step_scheduler: {max_steps: 1}\n")
    refused = tuneyard(server, "submit", str(recipe))
    assert refused.exit_code == 2
    assert_shown(refused.stderr)
    assert f"name{SHOWN}" in refused.stderr and f"fix {SHOWN}" in refused.stderr
    conflict = tuneyard(server, "cancel", "job-1")
    assert conflict.exit_code == 2
    assert_shown(conflict.stderr)
