"""Load-based scaling end to end: stand-in engines publish ForwardPassMetrics over real ZMQ on
loopback, the planner's worker subscribes, keeps the live engines, counts the bad messages, drops
the silent engine, trains its regressions and decides."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.store import decisions as decision_store
from app.store import ticks as tick_store
from tests.integration.test_fpm_zmq import WAIT_S, spawn  # noqa: F401  (fixture)
from tests.support import REPO_ROOT, demo_config

H200 = REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"

pytestmark = pytest.mark.anyio


@pytest.mark.timeout(180)
async def test_the_worker_decides_from_the_live_engines(make_api, spawn) -> None:  # noqa: F811
    good_a = spawn("engine-a", "--mode", "good", "--count", "30", "--rate", "300")
    good_b = spawn("engine-b", "--mode", "good", "--count", "30", "--rate", "300")
    bad = spawn("engine-bad", "--mode", "malformed", "--count", "20", "--rate", "300")
    gone = spawn("engine-gone", "--mode", "stop-after", "--count", "10", "--rate", "300")
    config = demo_config(
        mode="prefill",
        profile=str(H200),
        # A 1 ms TTFT target: every engine is over it, so the decision is a scale-up by one.
        sla={"ttft_ms": 1, "itl_ms": 50},
        throughput={"enabled": False},
        load={"enabled": True, "interval_s": 5, "engine_timeout_s": 1.5},
        sources={"fpm_endpoints": [good_a.endpoint, good_b.endpoint, bad.endpoint, gone.endpoint]},
    )
    api = await make_api(config)
    worker = api.app.state.workers["demo"]
    subscriber = worker.fpm["prefill"]
    subscriber.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            snap = subscriber.snapshot()
            if snap.malformed == 20 and snap.expired == 1 and len(snap.engines) == 3:
                break
            assert time.monotonic() < deadline, f"inventory never settled: {snap}"
            await asyncio.sleep(0.05)
        report = await worker.run_tick(api.clock.now())
    finally:
        await asyncio.to_thread(subscriber.stop)

    assert report is not None and report.decision is not None
    # Three live engines (no acknowledged decision yet, so the inventory is the engines that
    # report), all over the target: one more.
    assert decision_store.replicas_of(report.decision) == {"prefill": 4}
    with api.app.state.session_factory() as session:
        record = tick_store.last_tick(session, "demo").record
    load = record["load"]
    assert load["reason"] == "scale_up"
    engines = load["roles"]["prefill"]["engines"]
    assert sorted(e["engine"] for e in engines) == ["engine-a:dp0", "engine-b:dp0", "engine-bad:dp0"]
    assert all(e["estimated_ttft_ms"] > 1 for e in engines)
    fpm = record["fpm"]["prefill"]
    assert (fpm["malformed"], fpm["expired"]) == (20, 1)
    assert sorted(e["worker_id"] for e in fpm["engines"]) == ["engine-a", "engine-b", "engine-bad"]
    # The regressions learned from the live records on top of the profile's.
    assert load["models"]["prefill"]["observations"] > 17
    assert load["models"]["prefill"]["ready"] is True
