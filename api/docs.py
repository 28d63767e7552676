"""The API's documentation pages, `/docs` (Swagger UI) and `/redoc`, served with the
JavaScript and CSS that the `fastapi-standalone-docs` package ships: no CDN, and they work
where the server cannot reach the internet.

FastAPI builds both pages (`get_swagger_ui_html`, `get_redoc_html`); only the asset URLs
change, to `/docs/assets/`. Swagger UI's page starts it with one inline script, both
libraries style their elements inline, and Redoc searches in a `blob:` worker, so these
pages carry their own Content-Security-Policy: the dashboard's, plus the hash of that
script, inline styles and blob workers. `api.middleware.SecurityHeadersMiddleware` leaves
a policy an answer sets alone.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import re
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs/assets"
SWAGGER_JS = "swagger/swagger-ui-bundle.js"
SWAGGER_CSS = "swagger/swagger-ui.css"
REDOC_JS = "redoc/redoc.standalone.js"
FAVICON = "fastapi/favicon.png"
_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)


def assets_dir() -> Path:
    """Swagger UI, Redoc and a favicon, as installed with the package."""
    return Path(str(importlib.resources.files("fastapi_standalone_docs") / "static"))


def docs_policy(page: bytes) -> str:
    """The Content-Security-Policy of a docs page: its own inline scripts by hash."""
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(script).digest()).decode("ascii") + "'"
        for script in _INLINE_SCRIPT.findall(page)
    ]
    return "; ".join(
        [
            "default-src 'self'",
            " ".join(["script-src 'self'", *hashes]),
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data:",
            "worker-src 'self' blob:",
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )


def _with_policy(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = docs_policy(bytes(page.body))
    return page


def _urls(request: Request) -> tuple[str, str]:
    """The schema's URL and the assets' prefix, under the proxy's root path if any."""
    root = request.scope.get("root_path", "").rstrip("/")
    return root + (request.app.openapi_url or ""), root + ASSETS_URL


async def swagger_page(request: Request) -> HTMLResponse:
    openapi_url, assets = _urls(request)
    return _with_policy(
        get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{request.app.title} - Swagger UI",
            swagger_js_url=f"{assets}/{SWAGGER_JS}",
            swagger_css_url=f"{assets}/{SWAGGER_CSS}",
            swagger_favicon_url=f"{assets}/{FAVICON}",
        )
    )


async def redoc_page(request: Request) -> HTMLResponse:
    openapi_url, assets = _urls(request)
    return _with_policy(
        get_redoc_html(
            openapi_url=openapi_url,
            title=f"{request.app.title} - ReDoc",
            redoc_js_url=f"{assets}/{REDOC_JS}",
            redoc_favicon_url=f"{assets}/{FAVICON}",
            with_google_fonts=False,
        )
    )


def mount_docs(app: FastAPI) -> None:
    """`/docs`, `/redoc` and their assets on an app built with `docs_url=None,
    redoc_url=None` (kept out of the OpenAPI schema)."""
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")
    # Redoc's footer asks for its logo at `<page path>/logo-mini.svg`.
    redoc_files = StaticFiles(directory=assets_dir() / "redoc")
    app.mount("/redoc", redoc_files, name="redoc-assets")
    app.add_api_route("/docs", swagger_page, methods=["GET"], include_in_schema=False)
    app.add_api_route("/redoc", redoc_page, methods=["GET"], include_in_schema=False)
