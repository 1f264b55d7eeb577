"""Throughput scaling end to end: a stand-in frontend serves real trace requests, the planner
reads them back (through a real Prometheus server, or by scraping the frontend directly),
predicts, and issues a decision through the virtual connector; a source that fails gives no
decision, a reason in the diagnostics and in /readyz, and the loop recovers when it returns.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.core.seed.replicas import plan_replicas
from tests.support import REPO_ROOT, demo_config
from tests.support_frontend import (
    MODEL,
    NAMESPACE,
    PROMETHEUS_ENV,
    FrontendExporter,
    PrometheusServer,
    load_trace,
    prometheus_binary,
    wait_until,
)

pytestmark = pytest.mark.anyio

H200 = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")
# The Prometheus window reaches back before its first sample, so increase() adds nothing at
# the start (the module docstring of test_prometheus_source.py explains the edges).
INTERVAL_S = 3600.0
STARTED = "dynamo_frontend_requests_started_total"


def deployment(sources: dict[str, Any]) -> dict[str, Any]:
    return demo_config(
        profile=H200,
        model_name=MODEL.lower(),
        sla={"ttft_ms": 500, "itl_ms": 50},
        throughput={"enabled": True, "interval_s": INTERVAL_S, "predictor": {"type": "constant"}},
        sources=sources,
    )


async def diagnostics(api) -> list[dict[str, Any]]:
    return (await api.client.get("/diagnostics", params={"deployment": "demo"})).json()["items"]


def assert_decided_as_profile_says(record: dict[str, Any], decision: dict[str, Any]) -> None:
    """The decision is the profile's answer for what was observed (constant predictor)."""
    throughput = record["throughput"]
    assert throughput["reason"] == "scale", throughput
    observed, factors = throughput["observed"], throughput["correction"]
    plan = plan_replicas(
        model=_h200(),
        num_req=observed["num_req"],
        interval_s=INTERVAL_S,
        isl_tokens=observed["isl"],
        osl_tokens=observed["osl"],
        itl_target_ms=50,
        prefill_correction=factors["prefill"] if factors["prefill"] is not None else 1.0,
        decode_correction=factors["decode"] if factors["decode"] is not None else 1.0,
    )
    assert throughput["raw_replicas"] == {"prefill": plan.num_prefill, "decode": plan.num_decode}
    assert record["target"] == throughput["raw_replicas"]  # within bounds, no budget
    assert (decision["num_prefill"], decision["num_decode"]) == (plan.num_prefill, plan.num_decode)
    assert (decision["source"], decision["status"], decision["tick_id"]) == (
        "throughput",
        "pending",
        record["id"],
    )


_MODEL_CACHE: dict[str, Any] = {}


def _h200():
    if "h200" not in _MODEL_CACHE:
        from app.core.perf.interpolation import PerfModel
        from app.sources.profile_files import load_profile

        _MODEL_CACHE["h200"] = PerfModel.from_profile(load_profile(H200))
    return _MODEL_CACHE["h200"]


@pytest.fixture
def prometheus_stack(tmp_path: Path) -> Iterator[tuple[FrontendExporter, PrometheusServer]]:
    binary = prometheus_binary()
    if binary is None:
        pytest.skip(f"no prometheus binary: install Debian's `prometheus` package or set {PROMETHEUS_ENV}")
    exporter = FrontendExporter().start()
    prometheus = PrometheusServer(binary, tmp_path / "prometheus", [exporter.target])
    (tmp_path / "prometheus").mkdir()
    try:
        prometheus.start()
        wait_until(
            lambda: prometheus.values(f'{STARTED}{{model="{MODEL}"}}') == [0.0], "the idle exporter scraped"
        )
        # increase() extrapolates from the last scrape to "now" at the samples' average rate, by up
        # to (one 1 s scrape interval + the query's delay) / (the span of the series' samples). A
        # series a few seconds old could read 40% high (seen: 426 of 300 on a busy CI machine); six
        # seconds of idle samples keep it within the test's 25%.
        time.sleep(6.0)
        yield exporter, prometheus
    finally:
        prometheus.stop()
        exporter.stop()


async def test_prometheus_traffic_becomes_a_decision_and_an_outage_does_not(
    make_api, prometheus_stack
) -> None:
    exporter, prometheus = prometheus_stack
    sources = {"prometheus": {"url": prometheus.url, "labels": {"dynamo_namespace": NAMESPACE}}}
    api = await make_api(deployment(sources))
    worker = api.app.state.workers["demo"]
    await worker.wait_until_ready()
    assert worker.startup_problems == []

    served = exporter.serve_requests(load_trace(limit=300))
    wait_until(lambda: prometheus.values(f'{STARTED}{{model="{MODEL}"}}') == [300.0], "the batch scraped")
    report = await worker.run_tick(api.clock.now())
    assert report is not None and report.decision is not None

    (record,) = await diagnostics(api)
    observed = record["record"]["throughput"]["observed"]
    # Means are ratios of two increases over the same samples: exact. The count is evaluated
    # at "now", and Prometheus extrapolates increase() from the last scrape (at most one 1 s
    # scrape interval ago) to now at the window's average rate, so it may read a little high.
    # (Both increases are scaled by the same extrapolation factor, so only rounding differs.)
    expected = served.observation(INTERVAL_S)
    assert observed["isl"] == pytest.approx(expected.isl, rel=1e-12)
    assert observed["osl"] == pytest.approx(expected.osl, rel=1e-12)
    assert observed["ttft_ms"] == pytest.approx(expected.ttft_ms, rel=1e-12)
    assert observed["itl_ms"] == pytest.approx(expected.itl_ms, rel=1e-12)
    assert 300 <= observed["num_req"] <= 300 * 1.25, observed
    decision = (await api.client.get("/decisions/1")).json()
    assert_decided_as_profile_says({**record["record"], "id": record["id"]}, decision)
    metrics = (await api.client.get("/metrics")).text
    assert 'dynamo_planner_throughput_scaling_decision="scale"} 1.0' in metrics
    assert (
        f'dynamo_planner_observed_output_sequence_tokens{{deployment="demo"}} {observed["osl"]!r}' in metrics
    )
    waited = await api.client.get(
        "/decisions/wait", params={"deployment": "demo", "after": 0, "timeout_s": 1}
    )
    assert waited.json()["id"] == 1
    assert (await api.client.post("/decisions/1/complete", json={"status": "succeeded"})).status_code == 200

    # Prometheus goes away: no decision, the reason in the tick record and in /readyz.
    prometheus.stop()
    api.clock.advance(INTERVAL_S)
    report = await worker.run_tick(api.clock.now())
    assert report is not None and report.decision is None
    last = (await diagnostics(api))[-1]["record"]
    assert last["throughput"]["reason"] == "no_traffic_data"
    assert last["throughput"]["detail"].startswith("prometheus: cannot connect to")
    assert last["target"] is None
    ready = (await api.client.get("/readyz")).json()
    assert any(
        r.startswith("traffic source failing: prometheus: cannot connect")
        for r in ready["deployments"]["demo"]
    )
    metrics = (await api.client.get("/metrics")).text
    assert 'dynamo_planner_throughput_scaling_decision="no_traffic_data"} 1.0' in metrics

    # It comes back: the loop reads traffic again and decides (same load: unchanged target).
    prometheus.start()
    wait_until(lambda: prometheus.values(f'{STARTED}{{model="{MODEL}"}}') == [300.0], "prometheus back")
    api.clock.advance(INTERVAL_S)
    await worker.run_tick(api.clock.now())
    last = (await diagnostics(api))[-1]["record"]
    assert last["throughput"]["reason"] == "scale"
    assert worker.source_error is None
    ready = (await api.client.get("/readyz")).json()
    assert not any(r.startswith("traffic source failing") for r in ready["deployments"]["demo"])


async def test_direct_scrape_traffic_becomes_a_decision(make_api) -> None:
    with FrontendExporter() as exporter:
        api = await make_api(deployment({"frontend_url": exporter.url}))
        worker = api.app.state.workers["demo"]
        await worker.wait_until_ready()  # the start-up check takes the first scrape
        # From here the scrapes' clock is the test's: a tick reads the time since the last scrape.
        source = worker.source
        scrape_clock = [source._baseline.taken_at]
        source._monotonic = lambda: scrape_clock[0]
        # The first tick right after the check: a window of no time is no reading, and the
        # source is not failing for it.
        report = await worker.run_tick(api.clock.now())
        assert report is not None and report.decision is None
        (first,) = await diagnostics(api)
        assert "too short to read a rate from" in first["record"]["throughput"]["detail"]
        ready = (await api.client.get("/readyz")).json()
        assert not any(r.startswith("traffic source failing") for r in ready["deployments"]["demo"])
        served = exporter.serve_requests(load_trace(limit=200))
        scrape_clock[0] += INTERVAL_S
        api.clock.advance(INTERVAL_S)
        report = await worker.run_tick(api.clock.now())
        assert report is not None and report.decision is not None
        record = (await diagnostics(api))[-1]
        observed = record["record"]["throughput"]["observed"]
        expected = served.observation(observed["duration_s"])
        # Between two scrapes the differences are exact, the count included.
        assert observed["num_req"] == 200
        assert (observed["isl"], observed["osl"]) == (expected.isl, expected.osl)
        assert observed["ttft_ms"] == pytest.approx(expected.ttft_ms, rel=1e-12)
        assert observed["itl_ms"] == pytest.approx(expected.itl_ms, rel=1e-12)
        decision = (await api.client.get("/decisions/1")).json()
        assert_decided_as_profile_says({**record["record"], "id": record["id"]}, decision)
