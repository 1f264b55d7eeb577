"""The worker loop skeleton, driven tick by tick on the manual clock, seen through the API."""

from __future__ import annotations

import re

import pytest

from tests.api.helpers import assert_problem, complete, diagnostics, get_decision, override, pin, tick
from tests.support import demo_config

pytestmark = pytest.mark.anyio


async def decision_ids(api) -> list[tuple[int, str]]:
    items = (await api.client.get("/decisions", params={"deployment": "demo"})).json()["items"]
    return [(d["id"], d["status"]) for d in items]


async def test_each_tick_writes_one_diagnostics_record(make_api):
    api = await make_api()
    for n in range(1, 5):
        report = await tick(api)
        assert report is not None and report.decision is None
        assert len(await diagnostics(api)) == n
        api.clock.advance(180)
    records = await diagnostics(api)
    assert [r["at"][:19] for r in records] == [
        "2026-11-29T12:00:00",
        "2026-11-29T12:03:00",
        "2026-11-29T12:06:00",
        "2026-11-29T12:09:00",
    ]
    first = records[0]
    assert (first["deployment"], first["decision_id"]) == ("demo", None)
    record = first["record"]
    assert [s["stage"] for s in record["stages"]] == ["proposal", "pause", "pin", "bounds", "budget"]
    assert [s["replicas"] for s in record["stages"]] == [None, None, None, None, None]
    # The demo deployment has throughput scaling on and no profile: every tick says so.
    assert record["stages"][0]["reason"] == (
        "throughput model_not_ready: no profile configured (set `profile:` to a profiling-results folder)"
    )
    assert (record["verdict"], record["target"], record["decision_id"]) == ("hold: no target", None, None)
    assert record["bounds"] == {"prefill": {"min": 1, "max": 8}, "decode": {"min": 1, "max": 8}}
    assert record["overrides"] == {"pin_id": None, "bounds_id": None, "pause_id": None}


async def test_no_invented_decisions(make_api):
    api = await make_api()
    for _ in range(5):
        await tick(api)
        api.clock.advance(3600)
    assert await decision_ids(api) == []
    r = await api.client.get("/decisions/wait", params={"deployment": "demo", "after": 0, "timeout_s": 0})
    assert r.status_code == 204


async def test_tick_after_a_pin_is_unchanged(make_api):
    api = await make_api()
    pin_id = (await pin(api, 3, 5)).json()["id"]
    api.clock.advance(10)
    report = await tick(api)
    assert report.decision is None
    assert await decision_ids(api) == [(1, "pending")]
    record = (await diagnostics(api))[-1]["record"]
    assert record["verdict"] == "unchanged: target equals decision 1 (pending)"
    assert record["target"] == {"prefill": 3, "decode": 5}
    assert record["overrides"]["pin_id"] == pin_id
    assert record["stages"][2] == {
        "stage": "pin",
        "replicas": {"prefill": 3, "decode": 5},
        "reason": f"pinned by override #{pin_id}",
    }
    assert (record["latest_decision_id"], record["latest_decision_status"]) == (1, "pending")


async def test_bounds_below_the_pin_clamp_the_next_decision(make_api):
    api = await make_api()
    pin_id = (await pin(api, 3, 5)).json()["id"]
    assert (await complete(api, 1, observed={"prefill": 3, "decode": 5})).status_code == 200
    api.clock.advance(10)
    assert (await override(api, "bounds", max_decode=4)).status_code == 201
    api.clock.advance(10)
    report = await tick(api)
    assert report.decision is not None and report.decision.decision_id == 2
    d = await get_decision(api, 2)
    assert (d["num_prefill"], d["num_decode"], d["source"], d["status"], d["override_id"]) == (
        3,
        4,
        "override",
        "pending",
        pin_id,
    )
    assert d["tick_id"] == report.tick_id
    assert "bounds: decode 5 -> 4 (min 1, max 4)" in d["reasons"]
    assert (await get_decision(api, 1))["status"] == "succeeded"
    tick_row = (await diagnostics(api))[-1]
    assert (tick_row["id"], tick_row["decision_id"], tick_row["record"]["decision_id"]) == (
        report.tick_id,
        2,
        2,
    )
    # the next tick finds the clamped target in force
    api.clock.advance(10)
    assert (await tick(api)).decision is None
    assert await decision_ids(api) == [(1, "succeeded"), (2, "pending")]


async def test_ack_timeout_expires_the_pending_decision(make_api):
    api = await make_api(demo_config(connector={"type": "virtual", "ack_timeout_s": 60}))
    await pin(api, 3, 5)
    api.clock.advance(30)
    await tick(api)
    assert (await get_decision(api, 1))["status"] == "pending"
    api.clock.advance(31)
    await tick(api)
    expired = await get_decision(api, 1)
    assert expired["status"] == "expired"
    assert expired["status_reason"] == "no acknowledgement within 60 s"
    assert (await diagnostics(api))[-1]["record"]["expired_decision_id"] == 1
    # a late acknowledgement of the expired decision conflicts
    assert_problem(await complete(api, 1), 409)


async def test_none_connector_second_pin_supersedes_without_waiting(make_api):
    api = await make_api(demo_config(connector={"type": "none"}))
    assert (await pin(api, 3, 5)).json()["decision"]["id"] == 1
    r = await pin(api, 4, 5)
    assert r.json()["decision"]["id"] == 2
    assert await decision_ids(api) == [(1, "superseded"), (2, "pending")]
    deployment = (await api.client.get("/deployments/demo")).json()
    assert deployment["connector"] == "none"


async def test_pause_is_recorded_in_the_tick(make_api):
    api = await make_api()
    pause_id = (await override(api, "pause")).json()["id"]
    await tick(api)
    record = (await diagnostics(api))[-1]["record"]
    assert record["overrides"]["pause_id"] == pause_id
    assert record["stages"][1]["reason"] == "paused"
    assert await decision_ids(api) == []


# --- /diagnostics filters and pagination ----------------------------------------------------------


async def _ticks(api, count=6, every_s=60):
    ids = []
    for _ in range(count):
        ids.append((await tick(api)).tick_id)
        api.clock.advance(every_s)
    return ids


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({}, [0, 1, 2, 3, 4, 5], id="all"),
        pytest.param({"deployment": "demo"}, [0, 1, 2, 3, 4, 5], id="deployment"),
        pytest.param({"since": "2026-11-29T12:02:00Z"}, [2, 3, 4, 5], id="since-inclusive"),
        pytest.param({"until": "2026-11-29T12:02:00Z"}, [0, 1], id="until-exclusive"),
        pytest.param(
            {"since": "2026-11-29T12:01:30Z", "until": "2026-11-29T12:04:00+00:00"}, [2, 3], id="since-until"
        ),
        pytest.param({"since": "2026-11-29T13:02:00+01:00"}, [2, 3, 4, 5], id="since-other-zone"),
        pytest.param({"since": "2026-11-29T13:00:00Z"}, [], id="since-after-all"),
        pytest.param({"limit": 2}, [4, 5], id="limit-keeps-the-newest"),
        pytest.param({"since": "1795953660"}, [1, 2, 3, 4, 5], id="since-unix-time"),
    ],
)
async def test_diagnostics_filters(make_api, params, expected):
    api = await make_api()
    ids = await _ticks(api)
    assert [r["id"] for r in await diagnostics(api, **params)] == [ids[i] for i in expected]


async def test_diagnostics_cursor_pagination(make_api):
    api = await make_api()
    ids = await _ticks(api, count=7)
    pages, params = [], {"limit": 3, "since": "2026-11-29T12:01:00Z"}
    while True:
        r = await api.client.get("/diagnostics", params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        pages.append([t["id"] for t in body["items"]])
        if body["next_cursor"] is None:
            break
        params = {**params, "cursor": body["next_cursor"]}
    # Newest first, each page in chronological order.
    assert pages == [ids[4:7], ids[1:4]]


async def test_diagnostics_until_not_after_since_is_422(make_api):
    api = await make_api()
    r = await api.client.get(
        "/diagnostics", params={"since": "2026-11-29T12:00:00Z", "until": "2026-11-29T12:00:00Z"}
    )
    assert_problem(r, 422, "until")


# --- /metrics ------------------------------------------------------------------------------------


def sample(text: str, name: str, labels: str = 'deployment="demo"') -> float | None:
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


async def test_metrics_count_ticks_and_export_the_decision(make_api):
    api = await make_api()
    await _ticks(api, count=3)
    r = await api.client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert sample(r.text, "dynamo_planner_ticks_total") == 3.0

    await pin(api, 3, 5)
    await tick(api)
    text = (await api.client.get("/metrics")).text
    assert sample(text, "dynamo_planner_ticks_total") == 4.0
    assert sample(text, "dynamo_planner_predicted_num_prefill_replicas") == 3.0
    assert sample(text, "dynamo_planner_predicted_num_decode_replicas") == 5.0
    assert sample(text, "dynamo_planner_pending_decision") == 1.0
    assert sample(text, "dynamo_planner_decisions_total", 'deployment="demo",source="override"') == 1.0

    await complete(api, 1, observed={"prefill": 2, "decode": 5})
    text = (await api.client.get("/metrics")).text
    assert sample(text, "dynamo_planner_num_prefill_replicas") == 2.0
    assert sample(text, "dynamo_planner_pending_decision") == 0.0
    assert sample(text, "dynamo_planner_decision_acks_total", 'deployment="demo",outcome="accepted"') == 1.0
