"""The middlewares every request passes (`api.middleware`): security headers on every answer
(and a dashboard that needs nothing the policy refuses), keys in the query string refused,
and an access log line without the query string. Slow bodies, which need a real socket,
are in `test_api_server.py`."""

from __future__ import annotations

import logging
import re

import pytest
from fastapi.testclient import TestClient

from api.dashboard import STATIC_DIR
from api.main import create_app
from jobs.store.api_keys import generate_key
from jobs.store.settings import Settings

SECURITY_HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    home = tmp_path_factory.mktemp("home")
    return TestClient(create_app(Settings(home=home, auth="on")))


@pytest.mark.parametrize(
    "path", ["/", "/jobs/any-id", "/static/js/app.js", "/static/app.css", "/healthz", "/nowhere"]
)
def test_every_answer_carries_the_security_headers(client, path) -> None:
    headers = client.get(path).headers
    for name, value in SECURITY_HEADERS.items():
        assert headers[name] == value, (path, name)
    policy = dict(d.split(" ", 1) for d in headers["content-security-policy"].split("; "))
    assert policy["default-src"] == policy["script-src"] == policy["style-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'" and policy["object-src"] == "'none'"


def test_the_dashboard_needs_no_inline_script_or_style() -> None:
    """What the policy refuses, the shipped pages never use: inline scripts, event-handler
    attributes, style attributes (also inside the HTML the scripts write)."""
    files = [STATIC_DIR / "index.html", *sorted((STATIC_DIR / "js").glob("*.js"))]
    for path in files:
        text = path.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), path.name
        assert not re.search(r"\sstyle=", text), path.name
        assert not re.search(r"""\son[a-z]+=["'{$]""", text), path.name
        assert not re.search(r"setAttribute\(\s*[\"']style", text), path.name


@pytest.mark.parametrize(
    "query",
    [
        {"api_key": "x"},
        {"API-Key": "x"},
        {"token": "x"},
        {"access_token": "x"},
        {"key": "x"},
        {"auth": "x"},
        {"label": f"team={generate_key()}"},
    ],
)
def test_a_key_in_the_query_string_is_refused_with_the_header_to_use(client, query) -> None:
    answer = client.get("/v1/jobs", params=query)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "credential_in_query"
    assert "`Authorization: Bearer <api key>`" in error["message"]
    assert not [value for value in query.values() if len(value) > 5 and value in answer.text]
    assert client.get("/healthz", params={"label": "pretty_" + "x" * 60}).status_code == 200


def test_the_access_log_has_the_path_and_never_the_query_string(client, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="tuneyard.access"):
        client.get("/healthz", params={"note": "private-value"})
    lines = [r.getMessage() for r in caplog.records if r.name == "tuneyard.access"]
    assert len(lines) == 1 and '"GET /healthz" 200' in lines[0]
    assert "private-value" not in caplog.text
