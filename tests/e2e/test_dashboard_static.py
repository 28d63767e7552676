"""The dashboard's files and routes, checked without a browser (runs where Chromium is absent).

Every page route returns the single-page shell, every asset it names is served, every ES
module import resolves to a shipped file, the scripts parse (when `node` exists), and nothing
is fetched from another origin (the dashboard works offline).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.dashboard import PAGE_ROUTES, STATIC_DIR

MODULES = sorted((STATIC_DIR / "js").glob("*.js"))


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> TestClient:
    from api.main import create_app
    from jobs.store.settings import Settings

    home = tmp_path_factory.mktemp("home")
    return TestClient(create_app(Settings(home=home, auth="on")))


@pytest.mark.parametrize("path", [r.replace("{job_id}", "3f2c-any") for r in PAGE_ROUTES])
def test_every_page_route_serves_the_app_shell(client, path):
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/static/js/app.js">' in response.text


def test_assets_named_by_the_shell_are_served(client):
    shell = client.get("/").text
    for asset in re.findall(r'(?:src|href)="(/static/[^"]+)"', shell):
        response = client.get(asset)
        assert response.status_code == 200, asset
    assert (
        client.get("/static/js/app.js")
        .headers["content-type"]
        .startswith(("application/javascript", "text/javascript"))
    )


def test_dashboard_routes_stay_out_of_the_api_schema(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert not {"/", "/login", "/submit", "/compare", "/jobs/{job_id}"} & set(paths)


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.name)
def test_module_imports_resolve_and_nothing_loads_from_the_network(module):
    text = module.read_text()
    for target in re.findall(r'from "(\.[^"]+)"', text):
        assert (module.parent / target).resolve().exists(), f"{module.name} imports {target}"
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text), "no remote URLs"


def test_stylesheet_and_shell_load_nothing_remote():
    for path in (STATIC_DIR / "index.html", STATIC_DIR / "app.css"):
        assert not re.search(r"https?://", path.read_text()), path.name


@pytest.mark.skipif(not shutil.which("node"), reason="node is not installed")
@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.name)
def test_module_parses(module: Path):
    result = subprocess.run(
        ["node", "--experimental-default-type=module", "--check", str(module)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


ERROR_CASES = """
import { ApiError, messageOf } from "JS/api.js";
import { refusalText } from "JS/job.js";
const conflict = new ApiError(409, { error: { code: "illegal_transition",
  message: "cannot cancel a succeeded job", current_status: "succeeded", job_id: "j1" } });
const invalid = new ApiError(422, { errors: [{ loc: "optimizer.lrr", msg: "unknown", fix: "lr" }] });
const missing = new ApiError(404, { error: { code: "not_found", message: "job j2 not found" } });
console.log(JSON.stringify({
  conflict: [conflict.message, conflict.code, conflict.currentStatus, refusalText("cancel", conflict)],
  invalid: [invalid.message, invalid.errors.length, refusalText("pause", invalid)],
  missing: [missing.message, missing.currentStatus, refusalText("resume", missing)],
  text: messageOf(502, { text: "Bad gateway" }), empty: messageOf(500, null),
}));
"""


@pytest.mark.skipif(not shutil.which("node"), reason="node is not installed")
def test_dashboard_reads_the_apis_error_shapes(tmp_path):
    """api.js's messageOf and job.js's 409 text, run in node against the API's error bodies."""
    import json

    cases = tmp_path / "cases.mjs"
    cases.write_text(ERROR_CASES.replace("JS/", (STATIC_DIR / "js").as_uri() + "/"))
    result = subprocess.run(["node", "--experimental-default-type=module", str(cases)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "conflict": ["cannot cancel a succeeded job", "illegal_transition", "succeeded",
                     "Cannot cancel: the job is succeeded."],
        "invalid": ["optimizer.lrr: unknown", 1, "optimizer.lrr: unknown"],
        "missing": ["job j2 not found", None, "job j2 not found"],
        "text": "HTTP 502: Bad gateway", "empty": "HTTP 500",
    }  # fmt: skip
