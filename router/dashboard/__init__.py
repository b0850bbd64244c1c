"""The dashboard at `GET /admin`: static HTML, JavaScript and CSS (no build step, nothing
fetched from elsewhere) that polls the router's own `/admin/status` and calls the existing
`/admin/models/...` and `/admin/workers/.../restart` routes. The files carry no data, so
they are served without a key (`router.middleware.auth`); the page asks for the admin key when the
service answers 401 or 403 and keeps it in the tab's sessionStorage."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response

ASSETS_DIR = Path(__file__).resolve().parent / "static"
ASSETS_PATH = "/admin/dashboard"  # where the script and the style sheet are served


async def page(request: Request) -> Response:
    """GET /admin (and /admin/): the page itself; its assets are under ASSETS_PATH."""
    return FileResponse(ASSETS_DIR / "index.html", headers={"Cache-Control": "no-store"})
