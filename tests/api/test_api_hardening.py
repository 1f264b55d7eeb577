"""In-process checks of the API hardening (issue 17): the decisions page written from rows and
served again while the decisions stay the same, the Allow header of a 405, the body limit, a
conflicting repeated acknowledgement. The real-HTTP side is tests/integration/test_api_hardening.py."""

from __future__ import annotations

import json

import pytest

from app.api.convert import decision_out
from app.api.schemas import DecisionPage
from app.store import decisions as store
from tests.api.helpers import assert_problem, complete, pin, two_deployments

pytestmark = pytest.mark.anyio


async def page(api, **params) -> bytes:  # type: ignore[no-untyped-def]
    r = await api.client.get("/decisions", params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    return r.content


def pydantic_page(api, **filters) -> bytes:  # type: ignore[no-untyped-def]
    """The page as the response model writes it, from ORM objects."""
    with api.app.state.session_factory() as session:
        rows = store.list_decisions(session, **filters)
    return DecisionPage(items=[decision_out(d) for d in rows], next_cursor=None).model_dump_json().encode()


async def test_the_page_is_what_the_response_model_writes(make_api):
    api = await make_api(two_deployments())
    for n in (1, 2, 3):
        assert (await pin(api, n, n + 1)).status_code == 201
    assert (await pin(api, 5, 5, deployment="other")).status_code == 201
    ack = {"deployment": "demo", "observed": {"prefill": 3, "decode": 4}, "message": "é ✓"}
    assert (await complete(api, 2, **ack)).status_code == 409  # superseded by 3
    assert (await complete(api, 3, **ack)).status_code == 200
    assert await page(api) == pydantic_page(api)
    assert await page(api, deployment="demo", after=1) == pydantic_page(api, deployment="demo", after=1)


async def test_the_page_follows_every_change_to_the_decisions(make_api):
    api = await make_api()
    assert (await pin(api, 2, 2)).status_code == 201
    first = json.loads(await page(api, deployment="demo"))
    assert [(d["id"], d["status"]) for d in first["items"]] == [(1, "pending")]
    assert json.loads(await page(api, deployment="demo")) == first  # served again, unchanged

    assert (await complete(api, 1, observed={"prefill": 2, "decode": 2})).status_code == 200
    acked = json.loads(await page(api, deployment="demo"))
    assert [(d["id"], d["status"], d["observed"]) for d in acked["items"]] == [
        (1, "succeeded", {"prefill": 2, "decode": 2})
    ]
    assert (await pin(api, 3, 3)).status_code == 201
    assert (await pin(api, 4, 4)).status_code == 201  # supersedes decision 2
    later = json.loads(await page(api, deployment="demo"))
    assert [(d["id"], d["status"]) for d in later["items"]] == [
        (1, "succeeded"),
        (2, "superseded"),
        (3, "pending"),
    ]
    # Other filters are other pages.
    pending = json.loads(await page(api, deployment="demo", status="pending"))
    assert [d["id"] for d in pending["items"]] == [3]
    two = json.loads(await page(api, deployment="demo", limit=2))
    assert ([d["id"] for d in two["items"]], two["next_cursor"] is not None) == ([1, 2], True)


async def test_a_405_lists_every_method_of_the_path(make_api):
    api = await make_api()
    r = await api.client.request("PUT", "/override")
    assert_problem(r, 405)
    assert r.headers["allow"] == "GET, POST"
    r = await api.client.post("/decisions/wait")
    assert_problem(r, 405)
    assert r.headers["allow"] == "GET"


async def test_bodies_over_the_limit_are_refused(make_api):
    api = await make_api()
    big = b'{"deployment": "demo", "action": "pause", "reason": "' + b"x" * (1024 * 1024) + b'"}'
    body = assert_problem(
        await api.client.post("/override", content=big, headers={"content-type": "application/json"}),
        413,
        "body",
    )
    assert "Content-Length" in body["detail"]

    async def chunks():  # no Content-Length: read until over the limit
        for _ in range(20):
            yield b" " * 65536

    body = assert_problem(
        await api.client.post("/override", content=chunks(), headers={"content-type": "application/json"}),
        413,
        "body",
    )
    assert "chunked" in body["detail"]

    async def small():  # a chunked body within the limit reaches the route whole
        yield b'{"deployment": "demo", "action": "pause",'
        yield b' "reason": "chunked"}'

    r = await api.client.post("/override", content=small(), headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text


async def test_a_repeat_with_other_observed_replicas_is_a_409_naming_the_field(make_api):
    api = await make_api()
    assert (await pin(api, 3, 5)).status_code == 201
    assert (await complete(api, 1, observed={"prefill": 3, "decode": 5})).status_code == 200
    assert (await complete(api, 1, observed={"prefill": 3, "decode": 5}, message="again")).status_code == 200
    body = assert_problem(await complete(api, 1, observed={"prefill": 3}), 409, "body.observed")
    assert body["errors"][0]["field"] == "body.observed"
    assert_problem(await complete(api, 1), 409, "body.observed")  # nothing observed, after 3 and 5
