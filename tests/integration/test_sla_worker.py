"""SLA scaling in `planner serve`'s worker: a deployment with `scaling: {algorithm: sla}` is
decided by SLA scaling alone, from real inputs: the frontend's `/metrics` (the simulator's
counters, scraped over HTTP by the direct-scrape source), stand-in engines publishing
ForwardPassMetrics over ZMQ on loopback (separate processes), and the store on SQLite and on
PostgreSQL. The seed's throughput and load steps must not run beside it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

import pytest

from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics
from app.core.sla.capacity import LengthMix, prefill_engines
from app.core.sla.latency import prior_models
from app.planner_setup import DEFAULT_MAX_NUM_BATCHED_TOKENS
from app.sim.world.frontend import FrontendCounters
from app.sources.frontend_scrape import FrontendScrapeSource
from tests.fpm_publisher import Publisher, encode
from tests.integration.test_fpm_zmq import LOOPBACK_ANY_PORT, WAIT_S, spawn, wait_until  # noqa: F401  (fixture)
from tests.support import REPO_ROOT, demo_config
from tests.support_frontend import Canned, StandInServer

pytestmark = pytest.mark.anyio

H200 = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")
TICK_S = 5.0  # scaling.interval_s
TTFT_MS = 500.0
# Per tick: enough prompt tokens that one prefill engine cannot meet the TTFT target.
REQUESTS, ISL, OSL = 300, 3000, 200


async def diagnostics(api) -> list[dict[str, Any]]:
    return (await api.client.get("/diagnostics", params={"deployment": "demo"})).json()["items"]


def sla_config(frontend_url: str, prefill_endpoint: str, decode_endpoint: str) -> dict[str, Any]:
    """Deployment `demo` under SLA scaling on the H200 profile, reading the frontend and one
    engine per role. No forecast: these tests are about the wiring, the forecast has its own."""
    return demo_config(
        profile=H200,
        sla={"ttft_ms": TTFT_MS, "itl_ms": 50},
        scaling={"algorithm": "sla", "interval_s": TICK_S, "trend": False},
        sources={
            "frontend_url": frontend_url,
            "fpm_endpoints": {"prefill": [prefill_endpoint], "decode": [decode_endpoint]},
        },
    )


def serve(counters: FrontendCounters, frontend: StandInServer, n: int) -> None:
    """`n` requests of ISL/OSL tokens completed, and `/metrics` now says so."""
    for _ in range(n):
        counters.on_arrival()
        counters.on_first_token(0.2)
        counters.on_complete(ISL, OSL, 0.02, 4.2)
    frontend.answer = Canned(body=counters.render_prometheus().encode())


@pytest.mark.timeout(60)
async def test_sla_scaling_decides_alone_from_traffic_and_engines(make_api, spawn) -> None:  # noqa: F811
    prefill_engine = spawn("prefill-a", "--mode", "heartbeats")
    decode_engine = spawn("decode-a", "--mode", "heartbeats")
    counters = FrontendCounters(model="llama")
    with StandInServer() as frontend:
        frontend.answer = Canned(body=counters.render_prometheus().encode())
        api = await make_api(sla_config(frontend.url, prefill_engine.endpoint, decode_engine.endpoint))
        worker = api.app.state.workers["demo"]
        assert worker.interval_s == TICK_S
        # The real scrape source, measuring its intervals on the test's clock (as `planner serve`
        # measures them on its scaled clock), so a tick's traffic lasts exactly TICK_S.
        worker.source = FrontendScrapeSource(frontend.url, monotonic=lambda: api.clock.now().timestamp())
        # SLA scaling reads the engines even though load scaling is off.
        assert set(worker.fpm) == {"prefill", "decode"}
        for subscriber in worker.fpm.values():
            subscriber.start()
        try:
            deadline = time.monotonic() + WAIT_S
            while not all(len(s.snapshot().engines) == 1 for s in worker.fpm.values()):
                assert time.monotonic() < deadline, "the engines never reported"
                await asyncio.sleep(0.05)
            await worker.wait_until_ready()  # the start-up check takes the first scrape

            api.clock.advance(TICK_S)
            serve(counters, frontend, REQUESTS)
            first = await worker.run_tick(api.clock.now())
            api.clock.advance(TICK_S)
            serve(counters, frontend, REQUESTS)  # the same traffic again
            second = await worker.run_tick(api.clock.now())
        finally:
            for subscriber in worker.fpm.values():
                await asyncio.to_thread(subscriber.stop)

    records = [item["record"] for item in await diagnostics(api)]
    assert len(records) == 2
    record = records[0]
    # SLA scaling alone decided; the seed's steps did not run.
    assert (record["throughput"], record["load"]) == (None, None)
    sla = record["sla"]
    assert sla["reason"] == "scale_up"
    observed = record["traffic"]["observed"]
    assert (observed["duration_s"], observed["num_req"], observed["isl"], observed["osl"]) == (
        TICK_S,
        REQUESTS,
        ISL,
        OSL,
    )
    # The engines' heartbeats are their latest forward passes: nothing queued, no iteration to
    # measure the world's speed by (scale 1), and without an acknowledged decision they are the
    # ready counts (one engine per role).
    assert record["fpm"]["prefill"]["engines"][0]["worker_id"] == "prefill-a"
    assert sla["scale"] == {}
    assert sla["roles"]["prefill"]["queued_tokens"] == 0
    # The exact count the capacity formula gives for what was observed: one tick's prompt tokens
    # per second, lengths from the scraped ISL histogram, Poisson.
    buckets = [(math.inf if b == "+Inf" else b, n) for b, n in observed["isl_buckets"]]
    assert sum(n for _, n in buckets) == REQUESTS
    # Heartbeats teach the latency model nothing: the cost is the profile's prior.
    settings = worker.planner.settings.sla
    prior = prior_models(
        worker.planner.model,
        chunk_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        prior_records=settings.latency_prior_records,
        half_life_s=settings.latency_half_life_s,
    )
    expected = prefill_engines(
        prior.prefill,
        token_rate_s=observed["num_req"] / observed["duration_s"] * observed["isl"],
        mix=LengthMix.from_histogram(buckets, observed["isl"], 0.99),
        ttft_target_ms=TTFT_MS,
        max_engines=8,
    )
    assert expected.meets_target and 1 < expected.engines < 8, expected
    assert sla["roles"]["prefill"]["wish"] == expected.engines
    decode_wish = sla["roles"]["decode"]["wish"]
    assert sla["detail"].startswith(f"prefill 1->{expected.engines} (scale_up, wish {expected.engines})")

    assert first is not None and first.decision is not None
    decision = (await api.client.get(f"/decisions/{first.decision.decision_id}")).json()
    assert decision["source"] == "sla"
    assert (decision["num_prefill"], decision["num_decode"]) == (expected.engines, decode_wish)
    assert f"sla scale_up: prefill 1->{expected.engines}" in first.summary
    assert "throughput" not in first.summary and "load" not in first.summary

    # The next tick compares its wish with the pending decision, not with the engines still
    # starting: the same traffic changes nothing, and no second decision is made.
    assert second is not None and second.decision is None
    again = records[1]["sla"]
    assert again["reason"] == "no_change", again
    assert again["roles"]["prefill"]["wish"] == expected.engines
    assert records[1]["verdict"].startswith("unchanged")

    metrics = (await api.client.get("/metrics")).text
    wish = f'dynamo_planner_sla_wish_replicas{{deployment="demo",role="prefill"}} {expected.engines}.0'
    assert wish in metrics


async def test_sla_without_a_profile_records_model_not_ready(make_api, caplog) -> None:
    api = await make_api(demo_config(scaling={"algorithm": "sla"}))
    worker = api.app.state.workers["demo"]
    with caplog.at_level(logging.INFO, logger="app.workers.loop"):
        report = await worker.run_tick(api.clock.now())
        api.clock.advance(5)
        await worker.run_tick(api.clock.now())

    assert report is not None and report.decision is None
    (record, _) = [item["record"] for item in await diagnostics(api)]
    assert record["sla"]["reason"] == "model_not_ready"
    assert (record["throughput"], record["load"], record["target"]) == (None, None, None)
    assert record["verdict"] == "hold: no target"
    assert record["traffic"]["error"].startswith("no traffic source configured")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[demo] tick")]
    assert len(lines) == 2 and all("sla model_not_ready: no performance model" in line for line in lines)
    assert worker.last_error is None and worker.consecutive_failures == 0


@pytest.mark.timeout(120)
async def test_the_computed_share_comes_from_every_prefill_pass_over_zmq(make_api, spawn) -> None:  # noqa: F811
    """A prefill engine whose passes compute 40% of the prompt tokens the frontend counted (the
    rest a prefix cache served), every pass sent over real ZMQ: once a trend window of ticks has
    every pass, the tick record says 0.4, and prefill is sized for it."""
    share, ticks = 0.4, 15
    decode_engine = spawn("decode-a", "--mode", "heartbeats")
    publisher = Publisher(LOOPBACK_ANY_PORT)
    counters = FrontendCounters(model="llama")
    try:
        with StandInServer() as frontend:
            frontend.answer = Canned(body=counters.render_prometheus().encode())
            api = await make_api(sla_config(frontend.url, publisher.endpoint, decode_engine.endpoint))
            worker = api.app.state.workers["demo"]
            worker.source = FrontendScrapeSource(frontend.url, monotonic=lambda: api.clock.now().timestamp())
            for subscriber in worker.fpm.values():
                subscriber.start()
            publisher.wait_for_subscriber(timeout_s=WAIT_S)
            # Full chunks at the profile's time: the passes teach the latency model nothing new.
            chunk = DEFAULT_MAX_NUM_BATCHED_TOKENS
            wall_s = worker.planner.model.prefill_ttft_ms(chunk) / 1000.0
            chunk_pass = ForwardPassMetrics(
                worker_id="prefill-a",
                dp_rank=0,
                wall_time_s=wall_s,
                scheduled=ScheduledRequestMetrics(num_prefill_requests=1, sum_prefill_tokens=chunk),
                queued=QueuedRequestMetrics(),
            )
            passes = round(REQUESTS * ISL * share / chunk)
            sent = 0
            try:
                publisher.send(encode(chunk_pass, "map"))
                sent += 1
                prefill = worker.fpm["prefill"]
                wait_until(lambda: prefill.snapshot().received >= sent, "the prefill engine's first pass")
                wait_until(lambda: len(worker.fpm["decode"].snapshot().engines) == 1, "the decode engine")
                await worker.wait_until_ready()
                for _ in range(ticks):
                    for _ in range(passes):
                        publisher.send(encode(chunk_pass, "map"))
                    sent += passes
                    await asyncio.to_thread(
                        wait_until, lambda n=sent: prefill.snapshot().received >= n, "the passes"
                    )
                    api.clock.advance(TICK_S)
                    serve(counters, frontend, REQUESTS)
                    await worker.run_tick(api.clock.now())
            finally:
                for subscriber in worker.fpm.values():
                    await asyncio.to_thread(subscriber.stop)
    finally:
        publisher.close()

    records = [item["record"] for item in await diagnostics(api)]
    assert len(records) == ticks
    measured = passes * chunk / (REQUESTS * ISL)  # 0.4, to whole chunks
    last = records[-1]["sla"]
    assert last["demand"]["computed_share_measured"] is True
    # Every pass of the ticks arrived: the share is what they computed, the first ticks' too.
    assert last["demand"]["computed_share"] == pytest.approx(measured, abs=1e-3), last["demand"]
    assert last["roles"]["prefill"]["computed_share"] == pytest.approx(measured, abs=1e-3)
    # Until the passes span a trend window every prompt token is charged.
    assert records[3]["sla"]["demand"]["computed_share"] == 1.0
    assert last["roles"]["prefill"]["wish"] < records[3]["sla"]["roles"]["prefill"]["wish"], (
        "a cache serving 60% of the prompt tokens leaves prefill less to do"
    )
