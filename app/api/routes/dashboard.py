"""The live dashboard: one HTML page that polls the JSON API and draws it with plotly.js.

- `GET /dashboard`: the page (public, like `/docs`: it holds no data). Its script reads
  `/deployments`, `/diagnostics` and `/decisions` with the viewer's bearer token when the
  service has tokens (typed into the page, or passed as `#token=...` in the URL, which never
  reaches the server; kept in the tab's sessionStorage), and asks again every few seconds.
- `GET /dashboard/assets/{name}`: the page's script and style sheet, and plotly.js from the
  installed `plotly` package (no CDN: the page works offline).
- `GET /dashboard/clock`: the planner's clock (viewer): what its timestamps mean (wall, scaled,
  or simulated in `planner demo`) and its time now, from which the page picks the ticks to load.

None of these is part of the committed OpenAPI document: they are a page, not the API.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse

from app.api.auth import Viewer
from app.core.errors import NotFoundError

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
# Served as they are; the page names them with the planner's version so a new release reloads them.
_ASSETS = {
    "dashboard.js": (STATIC_DIR / "dashboard.js", "text/javascript"),
    "dashboard.css": (STATIC_DIR / "dashboard.css", "text/css"),
}
_CACHE = "public, max-age=3600"

router = APIRouter(tags=["dashboard"], include_in_schema=False)


def plotly_js() -> Path:
    """plotly.min.js as the installed plotly package ships it (the one the HTML report inlines)."""
    return Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))


@router.get("/dashboard", name="dashboard", response_class=HTMLResponse)
def dashboard() -> HTMLResponse:
    from app import __version__

    page = (STATIC_DIR / "dashboard.html").read_text().replace("{{version}}", __version__)
    return HTMLResponse(page, headers={"Cache-Control": "no-cache"})


@router.get("/dashboard/assets/{name}", name="dashboard_asset")
def dashboard_asset(name: str) -> FileResponse:
    if name == "plotly.min.js":
        path, media_type = plotly_js(), "text/javascript"
    elif name in _ASSETS:
        path, media_type = _ASSETS[name]
    else:
        raise NotFoundError(f"name: no dashboard asset {name!r}", field="name")
    return FileResponse(path, media_type=media_type, headers={"Cache-Control": _CACHE})


@router.get("/dashboard/clock", name="dashboard_clock")
def dashboard_clock(request: Request, _: Viewer) -> dict[str, Any]:
    clock = request.app.state.clock
    describe = getattr(clock, "describe", None)
    info = describe() if callable(describe) else {"kind": type(clock).__name__, "detail": "unknown clock"}
    return {"now": clock.now().isoformat(), "clock": info}
