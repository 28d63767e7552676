"""The web dashboard: serves the single-page app and its static assets from `api/static/`.

`mount_dashboard(app)` adds `/static/*` (plain HTML, CSS and ES-module JavaScript: no build
step, no CDN, works offline) and returns `index.html` for the app's own routes (`/`,
`/login`, `/submit`, `/compare`, `/jobs/{id}`), so a job page URL can be shared and
reloaded. The pages talk only to the public `/v1` API with the key the user signs in with.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
INDEX_HTML = STATIC_DIR / "index.html"
PAGE_ROUTES = ("/", "/login", "/submit", "/compare", "/jobs/{job_id}")
# The pages change with the code, not per user: let browsers revalidate instead of caching.
NO_CACHE = {"Cache-Control": "no-cache"}


async def dashboard_page() -> FileResponse:
    """The single-page app's shell; the JavaScript router renders the page for the URL."""
    return FileResponse(INDEX_HTML, media_type="text/html", headers=NO_CACHE)


def mount_dashboard(app: FastAPI) -> None:
    """Serve the dashboard on `app` (kept out of the OpenAPI schema)."""
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
    for path in PAGE_ROUTES:
        app.add_api_route(path, dashboard_page, methods=["GET"], include_in_schema=False)
