"""`/docs` and `/redoc` (`api.docs`): served from the assets installed with the package, so
the pages name no other host, every asset they load answers, and their own
Content-Security-Policy admits exactly their inline script."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from jobs.store.settings import Settings

PAGES = ("/docs", "/redoc")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    home = tmp_path_factory.mktemp("home")
    return TestClient(create_app(Settings(home=home, auth="on")))


def assets_of(page: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]+)"', page)


@pytest.mark.parametrize("path", PAGES)
def test_docs_pages_load_nothing_from_another_host(client, path) -> None:
    page = client.get(path)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", page.text), page.text
    assert assets_of(page.text), "the page names its assets"
    for asset in assets_of(page.text):
        answer = client.get(asset)
        assert answer.status_code == 200, asset
        assert answer.content, asset


def test_swagger_ui_loads_the_openapi_schema_and_its_script_and_style(client) -> None:
    page = client.get("/docs").text
    assert "url: '/openapi.json'" in page
    assets = assets_of(page)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    assert any(a.endswith("swagger-ui.css") for a in assets)
    script = next(a for a in assets if a.endswith(".js"))
    assert "SwaggerUIBundle" in client.get(script).text


def test_the_docs_policy_admits_only_the_page_own_inline_script(client) -> None:
    page = client.get("/docs")
    inline = re.findall(rb"<script>(.*?)</script>", page.content, re.DOTALL)
    assert len(inline) == 1
    digest = base64.b64encode(hashlib.sha256(inline[0]).digest()).decode()
    policy = page.headers["content-security-policy"]
    script_src = next(d for d in policy.split("; ") if d.startswith("script-src"))
    assert script_src == f"script-src 'self' 'sha256-{digest}'"
    assert "frame-ancestors 'none'" in policy and "'unsafe-eval'" not in policy


def test_redoc_finds_its_logo_where_it_asks_for_it(client) -> None:
    assert client.get("/redoc/logo-mini.svg").status_code == 200
