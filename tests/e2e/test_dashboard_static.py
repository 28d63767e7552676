"""The dashboard's files and routes, checked without a browser (runs where Chromium is absent).

Every page route returns the single-page shell, every asset it names is served, every ES
module import resolves to a shipped file, the scripts parse (when `node` exists), and nothing
is fetched from another origin (the dashboard works offline).
"""

from __future__ import annotations

import hashlib
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


def test_vendored_uplot_is_served_at_the_version_its_readme_names(client):
    vendor = STATIC_DIR / "vendor" / "uplot"
    version = re.search(r"uPlot (\d+\.\d+\.\d+)", (vendor / "README.md").read_text()).group(1)
    script = client.get("/static/vendor/uplot/uPlot.iife.min.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith(("application/javascript", "text/javascript"))
    assert f"(v{version})" in script.text.splitlines()[0]
    assert client.get("/static/vendor/uplot/uPlot.min.css").status_code == 200
    assert "MIT License" in (vendor / "LICENSE").read_text()


def test_vendored_codejar_is_the_file_its_readme_names(client):
    vendor = STATIC_DIR / "vendor" / "codejar"
    readme = (vendor / "README.md").read_text()
    assert re.search(r"CodeJar \d+\.\d+\.\d+ \(MIT", readme)
    digest = hashlib.sha256((vendor / "codejar.js").read_bytes()).hexdigest()
    assert f"| {digest} |" in readme  # unmodified since it was copied from the package
    script = client.get("/static/vendor/codejar/codejar.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith(("application/javascript", "text/javascript"))
    assert "export function CodeJar(" in script.text
    assert "MIT License" in (vendor / "LICENSE").read_text()


PURE_CASES = """
import { fixValue } from "JS/submit_plan.js";
import { recipeToYaml, failureOf, memoryRows } from "JS/job_facts.js";
import { highlightLine } from "JS/yaml_highlight.js";
const recipe = { optimizer: { _target_: "torch.optim.AdamW", lr: 1e-7, betas: [0.9, 0.95] },
  dataset: [{ path: "a b: c" }], flag: "yes", empty: {} };
const events = [{ data: { event: "started", peak_memory_bytes: [100] } }];
const plan = { estimate: { memory_per_rank_bytes: { total: 200, params: 1, grads: 1,
  optimizer: 1, activations: 1, workspace: 1 } } };
console.log(JSON.stringify({
  fixes: ["set optimizer.lr: 1.0e-5", "set distributed.tp_size: 1, or resid_pdrop: 0.0",
          "set peft.exclude_modules: [a, b]", "use strategy: fsdp2"].map(fixValue),
  yaml: recipeToYaml(recipe),
  failure: failureOf({ error_code: "nan_loss", error_message: "loss nan (fix: lower lr)" }),
  running: memoryRows(plan, events)[1][1],
  finished: memoryRows(plan, [...events, { data: { event: "finished", peak_memory_bytes: [100] } }])[1][1],
  line: highlightLine("  lr: 1.0e-5  # small"),
}));
"""


@pytest.mark.skipif(not shutil.which("node"), reason="node is not installed")
def test_dashboard_helpers_fix_values_yaml_and_memory(tmp_path):
    """The submit page's "apply fix" parsing, the job page's recipe YAML (it reads back as the
    same recipe), its failure/fix split and its memory comparison (only against the finished
    peak), and the editor's highlighting, run in node."""
    import json

    import yaml

    cases = tmp_path / "pure.mjs"
    cases.write_text(PURE_CASES.replace("JS/", (STATIC_DIR / "js").as_uri() + "/"))
    result = subprocess.run(["node", "--experimental-default-type=module", str(cases)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["fixes"] == [{"path": "optimizer.lr", "value": "1.0e-5"},
                            {"path": "distributed.tp_size", "value": "1"}, None, None]  # fmt: skip
    assert yaml.safe_load(out["yaml"]) == {
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-7, "betas": [0.9, 0.95]},
        "dataset": [{"path": "a b: c"}], "flag": "yes", "empty": {},
    }  # fmt: skip
    assert out["failure"] == {"code": "nan_loss", "message": "loss nan", "fix": "lower lr"}
    assert "% off" not in out["running"] and "when the run finishes" in out["running"]
    assert out["finished"].endswith("estimate 100.0% off")
    assert out["line"] == ('  <span class="y-key">lr</span>: <span class="y-num">1.0e-5</span> '
                           '<span class="y-comment"> # small</span>')  # fmt: skip
