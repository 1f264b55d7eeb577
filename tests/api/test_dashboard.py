"""The live dashboard's page and assets, and the offline /docs and /redoc: everything they load
comes from the service itself (no CDN), the page is public, the data behind it needs a viewer."""

from __future__ import annotations

import re

import pytest

from app.api.routes.dashboard import plotly_js
from tests.api.helpers import TOKENS, VIEWER, assert_problem, bearer

pytestmark = pytest.mark.anyio

# src= and href= of a page, and every absolute URL in it.
REFERENCE = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")
ABSOLUTE = re.compile(r"(?:https?:)?//[\w.-]+")


def local_references(page: str) -> list[str]:
    """The page's src and href targets; fails on any that leaves the service."""
    assert not ABSOLUTE.search(page), ABSOLUTE.search(page)
    return REFERENCE.findall(page)


async def test_dashboard_page_is_public_and_loads_only_its_own_assets(make_api):
    api = await make_api(tokens=TOKENS)
    r = await api.client.get("/dashboard")  # no token: the page holds no data
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    refs = local_references(r.text)
    assert {ref.split("?")[0] for ref in refs} == {
        "dashboard/assets/dashboard.css",
        "dashboard/assets/plotly.min.js",
        "dashboard/assets/dashboard.js",
        "docs",
    }, refs
    expected = {
        "dashboard/assets/plotly.min.js": ("text/javascript", plotly_js().read_bytes()[:40]),
        "dashboard/assets/dashboard.js": ("text/javascript", b"// The planner's live dashboard"),
        "dashboard/assets/dashboard.css": ("text/css", b"body {"),
    }
    for ref in refs:
        path = ref.split("?")[0]
        if path not in expected:
            continue
        media_type, start = expected[path]
        asset = await api.client.get("/" + ref)
        assert asset.status_code == 200, ref
        assert asset.headers["content-type"].startswith(media_type), asset.headers
        assert asset.content.startswith(start), ref
    assert b"plotly.js v" in (await api.client.get("/dashboard/assets/plotly.min.js")).content[:100]
    # The script reads only the service's own JSON API (relative URLs).
    script = (await api.client.get("/dashboard/assets/dashboard.js")).text
    assert not ABSOLUTE.search(script), "the script names another host"
    for path in ("deployments", "diagnostics?deployment=", "decisions?deployment=", "dashboard/clock"):
        assert f'"{path}' in script, path


async def test_unknown_dashboard_asset_is_a_404_problem(make_api):
    api = await make_api()
    assert_problem(await api.client.get("/dashboard/assets/../../app/config/settings.py"), 404)
    assert_problem(await api.client.get("/dashboard/assets/secrets.txt"), 404, "name")


@pytest.mark.parametrize(
    ("token", "status"),
    [
        pytest.param(None, 401, id="no-token"),
        pytest.param("not-a-configured-token", 401, id="unknown-token"),
        pytest.param(VIEWER, 200, id="viewer"),
    ],
)
async def test_the_clock_needs_a_viewer(make_api, token, status):
    api = await make_api(tokens=TOKENS)
    r = await api.client.get("/dashboard/clock", headers=bearer(token))
    if status != 200:
        assert_problem(r, status)
        return
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["now"] == api.clock.now().isoformat()
    assert set(body["clock"]) >= {"kind", "detail"}


async def test_pages_are_not_part_of_the_api_document(make_api):
    api = await make_api()
    paths = (await api.client.get("/openapi.json")).json()["paths"]
    assert not [p for p in paths if p.startswith(("/dashboard", "/docs", "/redoc"))]


@pytest.mark.parametrize(
    ("page", "assets"),
    [
        pytest.param(
            "/docs", {"/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css"}, id="swagger"
        ),
        pytest.param("/redoc", {"/docs/assets/redoc.standalone.js"}, id="redoc"),
    ],
)
async def test_api_docs_work_offline(make_api, page, assets):
    """Swagger UI and ReDoc from the installed package, not a CDN: the page names no other host
    and every script and style it loads is served here."""
    api = await make_api()
    r = await api.client.get(page)
    assert r.status_code == 200, r.text
    refs = set(local_references(r.text))
    assert assets <= refs, refs
    assert "/openapi.json" in r.text
    for ref in refs:
        asset = await api.client.get(ref)
        assert asset.status_code == 200, ref
        assert len(asset.content) > 1000, ref
    bundle = await api.client.get("/docs/assets/swagger-ui-bundle.js")
    assert bundle.headers["content-type"].startswith("text/javascript")
    assert b"SwaggerUIBundle" in bundle.content[:2000]
    redirect = await api.client.get("/docs/oauth2-redirect")
    assert redirect.status_code == 200
    assert_problem(await api.client.get("/docs/assets/nope.js"), 404, "name")
