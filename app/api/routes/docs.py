"""`/docs` (Swagger UI) and `/redoc` without a CDN: their scripts and styles come from the
installed `fastapi-offline` package (it ships Swagger UI 5 and ReDoc 2 as static files), served
under `/docs/assets/`. FastAPI's own pages load them from jsdelivr, so they are blank offline; the
app factory turns those off (`docs_url=None, redoc_url=None`) and includes this router."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse

from app.core.errors import NotFoundError

ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"

router = APIRouter(include_in_schema=False)


def assets_dir() -> Path:
    return Path(str(resources.files("fastapi_offline") / "static"))


def _root(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/")


@router.get("/docs", name="swagger_ui")
def swagger_ui(request: Request) -> HTMLResponse:
    root, app = _root(request), request.app
    return get_swagger_ui_html(
        openapi_url=f"{root}{app.openapi_url}",
        title=f"{app.title} - Swagger UI",
        oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT_URL}",
        swagger_js_url=f"{root}/docs/assets/swagger-ui-bundle.js",
        swagger_css_url=f"{root}/docs/assets/swagger-ui.css",
        swagger_favicon_url=f"{root}/docs/assets/favicon.png",
        swagger_ui_parameters=app.swagger_ui_parameters,
    )


@router.get(OAUTH2_REDIRECT_URL, name="swagger_ui_oauth2_redirect")
def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc", name="redoc")
def redoc(request: Request) -> HTMLResponse:
    root, app = _root(request), request.app
    return get_redoc_html(
        openapi_url=f"{root}{app.openapi_url}",
        title=f"{app.title} - ReDoc",
        redoc_js_url=f"{root}/docs/assets/redoc.standalone.js",
        redoc_favicon_url=f"{root}/docs/assets/favicon.png",
        with_google_fonts=False,
    )


@router.get("/docs/assets/{name}", name="docs_asset")
def docs_asset(name: str) -> FileResponse:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFoundError(f"name: no documentation asset {name!r}", field="name")
    return FileResponse(
        assets_dir() / name, media_type=media_type, headers={"Cache-Control": "public, max-age=86400"}
    )
