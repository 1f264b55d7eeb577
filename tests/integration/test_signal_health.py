"""Signals that go missing, against real parts: the frontend's `/metrics` answering 500 and then
garbage (scraped over HTTP), a real Prometheus stopped and restarted, an engine's
ForwardPassMetrics publisher falling silent (a process publishing over ZMQ, killed, then another
on its endpoint) and then sending only malformed messages, and the Kubernetes API stand-in
answering 500 to reads or not answering within the connector's `request_timeout_s`. For each:
three ticks without the signal make it unavailable (`dynamo_planner_signal_unavailable`,
`dynamo_planner_degraded_signals_total`, `/readyz`, the tick record), no count is lowered
meanwhile, and the planner recovers by itself once the component answers again. And a write the
API server keeps refusing (409 Conflict on the replica patch) fails its decision, which the next
tick decides again."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from app.sim.world.frontend import FrontendCounters
from app.sources.frontend_scrape import FrontendScrapeSource
from app.workers.signals import SIGNAL_MISSES
from tests.integration.test_fpm_zmq import spawn  # noqa: F401  (fixture)
from tests.integration.test_kubernetes_connector import NAME, NS, TOKEN, connector_settings, dgd_object
from tests.integration.test_kubernetes_worker import eventually, replicas
from tests.k8s_standin import DGD, KubeStandIn
from tests.support import REPO_ROOT, demo_config
from tests.support_frontend import (
    PROMETHEUS_ENV,
    Canned,
    FrontendExporter,
    PrometheusServer,
    StandInServer,
    prometheus_binary,
)

pytestmark = pytest.mark.anyio

H200 = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")
TICK_S = 5.0


async def last_record(api) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    items = (await api.client.get("/diagnostics", params={"deployment": "demo", "limit": 1})).json()["items"]
    return items[-1]["record"]


async def metric(api, name: str, signal: str) -> float | None:  # type: ignore[no-untyped-def]
    text = (await api.client.get("/metrics")).text
    found = re.search(rf'^{name}{{deployment="demo",signal="{signal}"}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else None


async def readiness(api) -> tuple[int, list[str]]:  # type: ignore[no-untyped-def]
    r = await api.client.get("/readyz")
    return r.status_code, r.json()["deployments"]["demo"]


async def decisions(api) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    return (await api.client.get("/decisions", params={"deployment": "demo"})).json()["items"]


@pytest.mark.timeout(120)
async def test_the_frontend_failing_holds_the_counts_and_recovers(make_api) -> None:
    counters = FrontendCounters(model="llama")
    with StandInServer() as frontend:

        def serve(n: int) -> None:
            for _ in range(n):
                counters.on_arrival()
                counters.on_first_token(0.2)
                counters.on_complete(3000, 200, 0.02, 4.2)
            frontend.answer = Canned(body=counters.render_prometheus().encode())

        serve(0)
        api = await make_api(
            demo_config(
                profile=H200,
                sla={"ttft_ms": 500, "itl_ms": 50},
                scaling={"algorithm": "sla", "interval_s": TICK_S, "trend": False},
                sources={"frontend_url": frontend.url},
            )
        )
        worker = api.app.state.workers["demo"]
        worker.source = FrontendScrapeSource(frontend.url, monotonic=lambda: api.clock.now().timestamp())
        await worker.wait_until_ready()

        async def tick() -> None:
            api.clock.advance(TICK_S)
            await worker.run_tick(api.clock.now())

        serve(300)
        await tick()
        (first,) = await decisions(api)
        ordered = {"prefill": first["num_prefill"], "decode": first["num_decode"]}
        r = await api.client.post(
            f"/decisions/{first['id']}/complete", json={"status": "succeeded", "observed": ordered}
        )
        assert r.status_code == 200, r.text
        assert await metric(api, "dynamo_planner_signal_unavailable", "traffic") == 0.0

        # The frontend answers 500, then garbage: two misses are noise, the third an outage.
        faults = [Canned(status=500, body=b"upstream down")] * SIGNAL_MISSES + [
            Canned(body=b"\x00garbage{")
        ] * 4
        for n, fault in enumerate(faults, start=1):
            frontend.answer = fault
            await tick()
            unavailable = n >= SIGNAL_MISSES
            record = await last_record(api)
            assert record["signals"] == {
                "read": {"traffic": False},
                "unavailable": ["traffic"] if unavailable else [],
            }, n
            assert await metric(api, "dynamo_planner_signal_unavailable", "traffic") == float(unavailable)
            status, reasons = await readiness(api)
            assert status == 503
            assert any(r.startswith("signals unavailable: traffic") for r in reasons) == unavailable, reasons
        assert await metric(api, "dynamo_planner_degraded_signals_total", "traffic") == 1.0
        # Nothing was lowered while the traffic was unknown.
        for d in await decisions(api):
            assert d["num_prefill"] >= ordered["prefill"] and d["num_decode"] >= ordered["decode"], d

        # The frontend answers again: the next tick reads it, and the planner is ready.
        serve(300)
        await tick()
        assert (await last_record(api))["signals"] == {"read": {"traffic": True}, "unavailable": []}
        assert await metric(api, "dynamo_planner_signal_unavailable", "traffic") == 0.0
        _, reasons = await readiness(api)
        assert not [r for r in reasons if r.startswith(("signals unavailable", "traffic source"))], reasons


async def over_the_standin(make_api, standin: KubeStandIn, tmp_path: Path, **connector: Any):  # type: ignore[no-untyped-def]
    """The API and its worker, ready, with the Kubernetes connector on `standin`'s DGD; the seed's
    throughput step ticking every 5 s (no traffic source: it proposes nothing)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    standin.put(DGD.plural, NS, dgd_object())
    settings = {**connector_settings(standin, token_file), **connector}
    api = await make_api(demo_config(connector=settings, throughput={"interval_s": TICK_S}))
    worker = api.app.state.workers["demo"]
    await worker.wait_until_ready()
    return api, worker


@pytest.mark.timeout(120)
async def test_the_kubernetes_api_failing_holds_the_counts_and_recovers(make_api, tmp_path: Path) -> None:
    with KubeStandIn(token=TOKEN) as standin:
        api, worker = await over_the_standin(make_api, standin, tmp_path)

        async def tick() -> dict[str, Any]:
            api.clock.advance(TICK_S)
            await worker.run_tick(api.clock.now())
            return await last_record(api)

        assert (await tick())["signals"]["read"]["inventory"] is True
        standin.fail_next_reads(SIGNAL_MISSES + 2, code=500)
        for n in range(1, SIGNAL_MISSES + 3):
            record = await tick()
            assert record["signals"]["read"]["inventory"] is False, n
            assert (record["signals"]["unavailable"] == ["inventory"]) == (n >= SIGNAL_MISSES), n
        assert await metric(api, "dynamo_planner_signal_unavailable", "inventory") == 1.0
        status, reasons = await readiness(api)
        assert status == 503 and any(r.startswith("signals unavailable: inventory") for r in reasons), reasons
        assert standin.patches() == [], "nothing is written while what runs is unknown"

        record = await tick()
        assert record["signals"] == {"read": {"inventory": True}, "unavailable": []}
        assert await metric(api, "dynamo_planner_signal_unavailable", "inventory") == 0.0


@pytest.mark.timeout(120)
async def test_the_kubernetes_api_timing_out_holds_the_counts_and_recovers(make_api, tmp_path: Path) -> None:
    """The API server takes longer than `request_timeout_s` to answer: each tick's read gives up
    after that long (one read, no retries within the call), which is a missing inventory."""
    with KubeStandIn(token=TOKEN) as standin:
        api, worker = await over_the_standin(make_api, standin, tmp_path, request_timeout_s=1)

        async def tick() -> dict[str, Any]:
            api.clock.advance(TICK_S)
            await worker.run_tick(api.clock.now())
            return await last_record(api)

        assert (await tick())["signals"]["read"]["inventory"] is True
        # Far longer than the timeout; the stand-in lets them go when it stops.
        standin.delay_next_reads(SIGNAL_MISSES, seconds=60)
        for n in range(1, SIGNAL_MISSES + 1):
            record = await tick()
            assert record["signals"]["read"]["inventory"] is False, n
            assert (record["signals"]["unavailable"] == ["inventory"]) == (n >= SIGNAL_MISSES), n
        assert standin.pending_read_delays() == 0, "one read per tick, none retried"
        assert "did not answer get dynamographdeployments 'llm' within 1 s" in (worker.inventory_error or "")
        assert await metric(api, "dynamo_planner_signal_unavailable", "inventory") == 1.0
        assert await metric(api, "dynamo_planner_degraded_signals_total", "inventory") == 1.0
        status, reasons = await readiness(api)
        assert status == 503 and any(r.startswith("signals unavailable: inventory") for r in reasons), reasons
        assert standin.patches() == [], "nothing is written while what runs is unknown"

        record = await tick()  # the API server answers in time again
        assert record["signals"] == {"read": {"inventory": True}, "unavailable": []}
        assert await metric(api, "dynamo_planner_signal_unavailable", "inventory") == 0.0
        _, reasons = await readiness(api)
        assert not [r for r in reasons if r.startswith("signals unavailable")], reasons


@pytest.mark.timeout(120)
async def test_a_replica_patch_refused_with_409_fails_the_decision_and_the_next_tick_decides_again(
    make_api, tmp_path: Path
) -> None:
    """The DGD keeps changing under the planner (409 Conflict on every attempt of a call): the
    decision fails with the conflict, no signal is affected, and the next tick decides the same
    target again, which lands once the API server accepts."""
    with KubeStandIn(token=TOKEN) as standin:
        api, worker = await over_the_standin(make_api, standin, tmp_path)

        async def tick() -> dict[str, Any]:
            api.clock.advance(TICK_S)
            await worker.run_tick(api.clock.now())
            await eventually(lambda: not worker._actuations, "the hand-over to finish")
            return await last_record(api)

        await tick()  # takes the lease: this process hands decisions to the cluster
        attempts = worker.connector.conflict_retries + 1
        standin.fail_next_patches(attempts, code=409, resource=DGD.plural)
        pin = {"deployment": "demo", "action": "pin", "num_prefill": 3, "num_decode": 5, "reason": "k8s"}
        assert (await api.client.post("/override", json=pin)).status_code == 201
        await eventually(lambda: not worker._actuations and standin.patches(), "the refused hand-over")

        (first,) = await decisions(api)
        assert first["status"] == "failed", first
        assert first["message"] == (
            f"kubernetes: DynamoGraphDeployment {NS}/{NAME}: still conflicting after {attempts} attempts "
            "(the DGD keeps changing under the planner); giving up on this decision"
        )
        dgd_patches = [p for p in standin.patches() if p.path.endswith(f"/dynamographdeployments/{NAME}")]
        assert len(dgd_patches) == attempts
        assert replicas(standin) == {"PrefillWorker": 1, "DecodeWorker": 2}

        record = await tick()  # the API server accepts again
        assert record["verdict"].startswith("create"), record["verdict"]
        assert record["signals"] == {"read": {"inventory": True}, "unavailable": []}
        first_again, second = await decisions(api)
        assert (first_again["id"], first_again["status"]) == (first["id"], "failed")
        assert (second["num_prefill"], second["num_decode"], second["source"]) == (3, 5, "override")
        assert (second["status"], second["observed"]) == ("succeeded", {"prefill": 3, "decode": 5}), second
        assert replicas(standin) == {"PrefillWorker": 3, "DecodeWorker": 5}
        assert await metric(api, "dynamo_planner_signal_unavailable", "inventory") == 0.0


async def received_more(subscriber, than: int) -> int:  # type: ignore[no-untyped-def]
    """Wait (bounded) until the subscriber received a message after `than` of them; the count."""
    for _ in range(500):
        received = subscriber.snapshot().received
        if received > than:
            return received
        await asyncio.sleep(0.02)
    raise AssertionError("no forward pass arrived")


@pytest.mark.timeout(120)
async def test_silent_fpm_publishers_hold_the_counts_and_recover(make_api, spawn) -> None:  # noqa: F811
    counters = FrontendCounters(model="llama")
    prefill = spawn("prefill-a", "--count", "1000000", "--rate", "200")
    decode = spawn("decode-a", "--count", "1000000", "--rate", "200")
    with StandInServer() as frontend:

        def serve() -> None:
            for _ in range(300):
                counters.on_arrival()
                counters.on_first_token(0.2)
                counters.on_complete(3000, 200, 0.02, 4.2)
            frontend.answer = Canned(body=counters.render_prometheus().encode())

        frontend.answer = Canned(body=counters.render_prometheus().encode())
        api = await make_api(
            demo_config(
                profile=H200,
                sla={"ttft_ms": 500, "itl_ms": 50},
                scaling={"algorithm": "sla", "interval_s": TICK_S, "trend": False},
                sources={
                    "frontend_url": frontend.url,
                    "fpm_endpoints": {"prefill": [prefill.endpoint], "decode": [decode.endpoint]},
                },
            )
        )
        worker = api.app.state.workers["demo"]
        worker.source = FrontendScrapeSource(frontend.url, monotonic=lambda: api.clock.now().timestamp())
        for subscriber in worker.fpm.values():
            subscriber.start()
        try:
            await worker.wait_until_ready()

            async def tick(wait_for_prefill: bool) -> dict[str, Any]:
                if wait_for_prefill:
                    await received_more(worker.fpm["prefill"], worker.fpm["prefill"].snapshot().received)
                await received_more(worker.fpm["decode"], worker.fpm["decode"].snapshot().received)
                serve()
                api.clock.advance(TICK_S)
                await worker.run_tick(api.clock.now())
                return await last_record(api)

            record = await tick(wait_for_prefill=True)
            assert record["signals"]["read"] == {"traffic": True, "fpm_prefill": True, "fpm_decode": True}
            prefill.proc.kill()  # the prefill engine's publisher falls silent
            prefill.proc.wait(timeout=10)
            await tick(wait_for_prefill=False)  # what it sent before it died
            for n in range(1, SIGNAL_MISSES + 1):
                record = await tick(wait_for_prefill=False)
                assert record["signals"]["read"]["fpm_prefill"] is False, n
                assert record["signals"]["read"]["fpm_decode"] is True, n
            assert record["signals"]["unavailable"] == ["fpm_prefill"]
            assert await metric(api, "dynamo_planner_signal_unavailable", "fpm_prefill") == 1.0
            assert await metric(api, "dynamo_planner_signal_unavailable", "fpm_decode") == 0.0
            first, *later = await decisions(api)
            for d in later:  # nothing lowered while the prefill engines' signal was missing
                assert d["num_prefill"] >= first["num_prefill"] and d["num_decode"] >= first["num_decode"], d

            # A publisher on the same endpoint again: the subscriber reconnects by itself.
            spawned = [spawn("prefill-b", "--bind", prefill.endpoint, "--count", "1000000", "--rate", "200")]
            record = await tick(wait_for_prefill=True)
            assert record["signals"] == {
                "read": {"traffic": True, "fpm_prefill": True, "fpm_decode": True},
                "unavailable": [],
            }
            assert await metric(api, "dynamo_planner_signal_unavailable", "fpm_prefill") == 0.0

            # Then one whose every message is malformed: each is skipped and counted, none read.
            restarted = spawned[0]
            restarted.proc.kill()
            restarted.proc.wait(timeout=10)
            spawn(
                "prefill-c",
                "--bind",
                prefill.endpoint,
                "--mode",
                "garbage",
                "--count",
                "1000000",
                "--rate",
                "200",
            )
            malformed = worker.fpm["prefill"].snapshot().malformed
            await tick(wait_for_prefill=True)  # the garbage has begun to arrive
            for n in range(1, SIGNAL_MISSES + 1):
                record = await tick(wait_for_prefill=True)
                assert record["signals"]["read"]["fpm_prefill"] is False, n
            assert record["signals"]["unavailable"] == ["fpm_prefill"]
            assert worker.fpm["prefill"].snapshot().malformed > malformed
            assert await metric(api, "dynamo_planner_degraded_signals_total", "fpm_prefill") == 2.0
        finally:
            for subscriber in worker.fpm.values():
                await asyncio.to_thread(subscriber.stop)


@pytest.mark.timeout(180)
async def test_prometheus_stopped_and_restarted(make_api, tmp_path: Path) -> None:
    binary = prometheus_binary()
    if binary is None:
        pytest.skip(
            f"no prometheus binary: install Debian's `prometheus` package (CI does) or set {PROMETHEUS_ENV}"
        )
    exporter = FrontendExporter().start()
    prometheus = PrometheusServer(binary, tmp_path / "prometheus", [exporter.target])
    (tmp_path / "prometheus").mkdir()
    prometheus.start()
    try:
        api = await make_api(
            demo_config(
                profile=H200,
                sla={"ttft_ms": 500, "itl_ms": 50},
                scaling={"algorithm": "sla", "interval_s": TICK_S, "trend": False},
                sources={"prometheus": {"url": prometheus.url}},
            )
        )
        worker = api.app.state.workers["demo"]
        await worker.wait_until_ready()

        async def tick() -> dict[str, Any]:
            api.clock.advance(TICK_S)
            await worker.run_tick(api.clock.now())
            return await last_record(api)

        assert (await tick())["signals"]["read"] == {"traffic": True}
        prometheus.stop()
        for n in range(1, SIGNAL_MISSES + 2):
            record = await tick()
            assert record["signals"]["read"] == {"traffic": False}, n
            assert (record["signals"]["unavailable"] == ["traffic"]) == (n >= SIGNAL_MISSES), n
        assert await metric(api, "dynamo_planner_signal_unavailable", "traffic") == 1.0
        status, reasons = await readiness(api)
        assert status == 503 and any(r.startswith("signals unavailable: traffic") for r in reasons), reasons

        prometheus.start()  # the same port and storage: a restarted server
        assert (await tick())["signals"] == {"read": {"traffic": True}, "unavailable": []}
        assert await metric(api, "dynamo_planner_signal_unavailable", "traffic") == 0.0
        assert await metric(api, "dynamo_planner_degraded_signals_total", "traffic") == 1.0
    finally:
        prometheus.stop()
        exporter.stop()
