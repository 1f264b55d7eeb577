"""The cost account on the service's tick path: each tick bills the interval since the previous
one at the previous tick's engines, `/diagnostics/cost` and `/metrics` read the same account, and
bad requests are refused naming the field."""

from __future__ import annotations

import asyncio
import re

import pytest

from app.workers.gather import Gathered
from tests.api.helpers import assert_problem, diagnostics, pin
from tests.support import demo_config

pytestmark = pytest.mark.anyio


def config() -> dict:
    return demo_config(
        cost_per_gpu_hour=3.0, decode={"gpus_per_engine": 2, "min_replicas": 1, "max_replicas": 8}
    )


async def tick_at(api, after_s: float, ready: dict[str, int]):
    api.clock.advance(after_s)
    worker = api.app.state.workers["demo"]
    return await asyncio.to_thread(worker.tick, api.clock.now(), Gathered(ready=ready))


def metric(text: str, name: str, labels: str) -> float:
    found = re.search(rf"^{name}\{{{re.escape(labels)}\}} (\S+)$", text, re.MULTILINE)
    assert found, text
    return float(found.group(1))


async def test_ticks_bill_the_engines_from_order_to_removal(make_api) -> None:
    api = await make_api(config())
    # Ordered 2 prefill and 3 decode (2 GPUs each) while 1 and 1 are ready: billed from the order.
    assert (await pin(api, 2, 3)).status_code == 201
    await tick_at(api, 0, {"prefill": 1, "decode": 1})
    await tick_at(api, 60, {"prefill": 2, "decode": 3})
    # Lowered to 1 and 1: the engines stay billed while the inventory still reports them ready.
    assert (await pin(api, 1, 1)).status_code == 201
    await tick_at(api, 60, {"prefill": 2, "decode": 3})
    await tick_at(api, 60, {"prefill": 1, "decode": 1})
    await tick_at(api, 60, {"prefill": 1, "decode": 1})
    # The planner was stopped for longer than a restart takes: that gap is not billed.
    await tick_at(api, 1000, {"prefill": 1, "decode": 1})

    billed = [t["record"]["cost"]["billed"] for t in await diagnostics(api, deployment="demo")]
    assert billed == [{"prefill": 2, "decode": 3}] * 3 + [{"prefill": 1, "decode": 1}] * 3

    report = (await api.client.get("/diagnostics/cost", params={"deployment": "demo"})).json()
    # Three minutes of 2 x 1 + 3 x 2 GPUs, one of 1 x 1 + 1 x 2: 1620 GPU-seconds at 3 per hour.
    assert report["ticks"] == 6
    assert report["gpu_hours"] == pytest.approx({"prefill": 420 / 3600, "decode": 1200 / 3600})
    assert report["cost"] == pytest.approx(1.35)
    assert report["cost_per_gpu_hour"] == 3.0
    assert (report["billed_s"], report["unobserved_s"]) == (240.0, 1000.0)
    # No forward passes were read: idleness is unknown, not zero.
    assert report["idle_share"] is None
    # The peak (2 and 3) held for the 240 s billed: 8 GPUs, 0.533 GPU-hours, 1.6.
    assert report["peak_engines"] == {"prefill": 2, "decode": 3}
    assert report["static_gpu_hours"] == pytest.approx(1920 / 3600)
    assert report["static_cost"] == pytest.approx(1.6)
    assert report["saving"] == pytest.approx(0.25)
    # T0 is 12:00 UTC: all of it in one hour and one day.
    assert [(b["start"][:19], round(b["cost"], 9)) for b in report["per_hour"]] == [
        ("2026-11-29T12:00:00", 1.35)
    ]
    assert len(report["per_day"]) == 1

    text = (await api.client.get("/metrics")).text
    assert metric(
        text, "dynamo_planner_gpu_hours_total", 'deployment="demo",role="prefill"'
    ) == pytest.approx(420 / 3600)
    assert metric(text, "dynamo_planner_gpu_hours_total", 'deployment="demo",role="decode"') == pytest.approx(
        1200 / 3600
    )
    assert metric(text, "dynamo_planner_cost_total", 'deployment="demo"') == pytest.approx(1.35)


async def test_a_window_reports_its_own_ticks(make_api) -> None:
    api = await make_api(config())
    assert (await pin(api, 2, 3)).status_code == 201
    for _ in range(4):
        await tick_at(api, 60, {"prefill": 2, "decode": 3})
    ticks = await diagnostics(api, deployment="demo")
    window = {"deployment": "demo", "since": ticks[1]["at"], "until": ticks[3]["at"]}
    report = (await api.client.get("/diagnostics/cost", params=window)).json()
    # Ticks 2 and 3: one minute between them, of 8 GPUs.
    assert report["ticks"] == 2
    assert report["gpu_hours_total"] == pytest.approx(8 * 60 / 3600)


@pytest.mark.parametrize(
    ("params", "status", "field", "why"),
    [
        ({"deployment": "nope"}, 404, "deployment", "an unknown deployment"),
        ({"deployment": "demo", "since": "2026-11-29T12:00:00"}, 422, "since", "a time without its zone"),
        (
            {"deployment": "demo", "since": "2026-11-29T12:00:00Z", "until": "2026-11-29T11:00:00Z"},
            422,
            "until",
            "a range that ends before it starts",
        ),
    ],
)
async def test_bad_requests_name_the_field(make_api, params, status, field, why) -> None:
    api = await make_api(config())
    assert_problem(await api.client.get("/diagnostics/cost", params=params), status, field)
