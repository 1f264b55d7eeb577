"""In-process checks of the API hardening: the decisions page written from rows and
served again while the decisions stay the same, the Allow header of a 405, the body limit, a
conflicting repeated acknowledgement. The real-HTTP side is tests/integration/test_api_hardening.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from app.api.convert import decision_out
from app.api.disconnect import ClientGone, unless_client_leaves
from app.api.schemas import DecisionPage
from app.core.errors import TooBusyError
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


# --- unless_client_leaves: the long-poll's watch on the receive channel ----------------------------


class Channel:
    """An ASGI receive channel: the empty body, then nothing until `leave()`."""

    def __init__(self, *, broken: bool = False) -> None:
        self.sent_body = False
        self.left = asyncio.Event()
        self.broken = broken

    async def receive(self) -> dict:
        if not self.sent_body:
            self.sent_body = True
            return {"type": "http.request", "body": b"", "more_body": False}
        if self.broken:
            raise RuntimeError("receive failed")
        await self.left.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self.left.set()


async def test_the_work_finishing_first_gives_its_result():
    channel, done = Channel(), asyncio.Event()

    async def work() -> str:
        await done.wait()
        return "decision"

    waiting = asyncio.create_task(unless_client_leaves(channel.receive, work()))
    await asyncio.sleep(0)
    done.set()
    assert await waiting == "decision"


async def test_a_client_that_leaves_cancels_the_work_at_once():
    channel, released = Channel(), []

    async def work() -> str:
        try:
            await asyncio.sleep(3600)
            return "never"
        finally:
            released.append(True)

    waiting = asyncio.create_task(unless_client_leaves(channel.receive, work()))
    await asyncio.sleep(0.01)
    channel.leave()
    with pytest.raises(ClientGone):
        await asyncio.wait_for(waiting, 5)
    assert released == [True]


async def test_an_error_of_the_work_propagates():
    async def work() -> str:
        raise TooBusyError("full", retry_after_s=5)

    with pytest.raises(TooBusyError):
        await unless_client_leaves(Channel().receive, work())


async def test_a_cancellation_from_outside_stays_a_cancellation():
    channel = Channel()
    waiting = asyncio.create_task(unless_client_leaves(channel.receive, asyncio.sleep(3600)))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_a_channel_that_cannot_be_watched_leaves_the_work_alone():
    async def work() -> str:
        await asyncio.sleep(0.05)
        return "decision"

    assert await unless_client_leaves(Channel(broken=True).receive, work()) == "decision"
