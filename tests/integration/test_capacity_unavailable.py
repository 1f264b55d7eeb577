"""Engines that never come, in `planner serve`'s worker: the orchestrator acknowledges SLA
scaling's order with fewer engines than it asked for (the cluster had no room for the rest), and
they never come. Past the wait bound the tick record says `capacity_unavailable`, the planner
gives the missing engines back (a decision at what runs), and `/metrics` raises
`dynamo_planner_capacity_unavailable` for the role. Real parts: the frontend's `/metrics`
scraped over HTTP, the store, the decision protocol over the API."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.sla.shortfall import WAIT_MIN_S
from app.sim.world.frontend import FrontendCounters
from app.sources.frontend_scrape import FrontendScrapeSource
from tests.support import REPO_ROOT, demo_config
from tests.support_frontend import Canned, StandInServer

pytestmark = pytest.mark.anyio

H200 = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")
TICK_S = 5.0
REQUESTS, ISL, OSL = 300, 3000, 200  # per tick: more than one prefill engine serves


def serve(counters: FrontendCounters, frontend: StandInServer) -> None:
    for _ in range(REQUESTS):
        counters.on_arrival()
        counters.on_first_token(0.2)
        counters.on_complete(ISL, OSL, 0.02, 4.2)
    frontend.answer = Canned(body=counters.render_prometheus().encode())


async def records(api) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    r = await api.client.get("/diagnostics", params={"deployment": "demo", "limit": 1000})
    return [item["record"] for item in r.json()["items"]]


@pytest.mark.timeout(120)
async def test_an_order_that_never_becomes_ready_is_reported_and_given_back(make_api) -> None:
    counters = FrontendCounters(model="llama")
    with StandInServer() as frontend:
        frontend.answer = Canned(body=counters.render_prometheus().encode())
        api = await make_api(
            demo_config(
                profile=H200,
                sla={"ttft_ms": 500, "itl_ms": 50},
                # A 120 s start-up estimate: three leads are under ten minutes, so the bound is that.
                scaling={"algorithm": "sla", "interval_s": TICK_S, "trend": False, "startup_estimate_s": 120},
                sources={"frontend_url": frontend.url},
            )
        )
        worker = api.app.state.workers["demo"]
        worker.source = FrontendScrapeSource(frontend.url, monotonic=lambda: api.clock.now().timestamp())
        await worker.wait_until_ready()

        api.clock.advance(TICK_S)
        serve(counters, frontend)
        first = await worker.run_tick(api.clock.now())
        assert first is not None and first.decision is not None
        asked = {"prefill": first.decision.num_prefill, "decode": first.decision.num_decode}
        assert asked["prefill"] > 1, asked
        # One engine of each role came up; the others have no GPU and stay pending.
        r = await api.client.post(
            f"/decisions/{first.decision.decision_id}/complete",
            json={"status": "succeeded", "observed": {"prefill": 1, "decode": 1}},
        )
        assert r.status_code == 200, r.text

        ordered_at = api.clock.now()
        while (api.clock.now() - ordered_at).total_seconds() <= WAIT_MIN_S + TICK_S:
            api.clock.advance(TICK_S)
            serve(counters, frontend)
            await worker.run_tick(api.clock.now())
        metrics = (await api.client.get("/metrics")).text

    ticks = await records(api)
    reasons = [t["sla"]["reason"] for t in ticks]
    first_capped = reasons.index("capacity_unavailable")
    # Within the bound the order stands; the lead is never read longer than the bound.
    assert all(t["sla"]["lead_s"] <= WAIT_MIN_S for t in ticks)
    assert "capacity_unavailable" not in reasons[:first_capped]
    capped = ticks[first_capped]
    report = capped["sla"]["capacity_unavailable"]["prefill"]
    assert (report["asked"], report["ready"], report["attempts"]) == (asked["prefill"], 1, 1)
    # The engines that did not come are given back: the decision orders what runs.
    assert capped["target"]["prefill"] == 1
    decisions = (await api.client.get("/decisions", params={"deployment": "demo"})).json()["items"]
    assert (decisions[-1]["num_prefill"], decisions[-1]["source"]) == (1, "sla")
    assert 'dynamo_planner_capacity_unavailable{deployment="demo",role="prefill"} 1.0' in metrics
