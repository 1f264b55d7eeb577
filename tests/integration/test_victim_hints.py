"""A decision that lowers a count names the engines to remove, from real engines' forward passes
over ZMQ (`tests/fpm_publisher.py`): idle engines first, then the least work. Both ways a
decision is made: an operator's pin (the route reads the engines' latest passes) and the tick
(the core reads the same); both reach an orchestrator in the decision's JSON, and the
Kubernetes connector turns them into pod deletion costs before it lowers the replicas."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.connectors.deletion_cost import DELETION_COST, DGD_LABEL, SERVICE_LABEL
from tests.api.helpers import complete, override, pin
from tests.integration.test_fpm_zmq import spawn  # noqa: F401  (fixture)
from tests.integration.test_kubernetes_connector import (
    NAME,
    NS,
    TOKEN,
    connector_settings,
    dgd_object,
    disagg_services,
)
from tests.k8s_standin import DGD, POD, KubeStandIn
from tests.support import REPO_ROOT, demo_config

pytestmark = pytest.mark.anyio

H200 = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")
DECODE = "DecodeWorker"


async def engines_seen(worker, expected: dict[str, bool]) -> None:  # type: ignore[no-untyped-def]
    """Until the decode subscriber's latest pass of each engine is busy (True) or idle (False)."""
    for _ in range(400):
        latest = {key[0]: e.trainable for key, e in worker.fpm["decode"].snapshot().engines.items()}
        if latest == expected:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"engines seen: {latest}, expected {expected}")


async def api_over_engines(make_api, decode_endpoints: list[str], **config: Any):  # type: ignore[no-untyped-def]
    """The API over decode engines publishing FPM at `decode_endpoints`, its subscribers started.
    SLA scaling, since it reads the engines' passes; the tests' pins decide whatever it would."""
    api = await make_api(
        demo_config(
            profile=H200,
            scaling={"algorithm": "sla", "interval_s": 5.0},
            sources={"fpm_endpoints": {"decode": decode_endpoints}},
            **config,
        )
    )
    worker = api.app.state.workers["demo"]
    for subscriber in worker.fpm.values():
        subscriber.start()
    await worker.wait_until_ready()
    return api


async def wait_for(api, after: int) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    r = await api.client.get("/decisions/wait", params={"deployment": "demo", "after": after, "timeout_s": 0})
    assert r.status_code == 200, r.text
    return r.json()


async def three_decoders(make_api, spawn):  # type: ignore[no-untyped-def]  # noqa: F811
    """The API over three decode engines publishing FPM: one busy, two idle; decision 1 (a pin to
    3 decode engines, which names nothing) acknowledged."""
    busy = spawn("decode-busy", "--count", "1000000", "--rate", "200")
    idle = spawn("decode-idle", "--mode", "heartbeats")
    done = spawn("decode-done", "--count", "3")  # three passes, then idle heartbeats
    api = await api_over_engines(make_api, [busy.endpoint, idle.endpoint, done.endpoint])
    worker = api.app.state.workers["demo"]
    await engines_seen(worker, {"decode-busy": True, "decode-idle": False, "decode-done": False})
    assert (await pin(api, 1, 3)).status_code == 201
    assert (await wait_for(api, 0))["remove"] is None
    assert (await complete(api, 1, observed={"prefill": 1, "decode": 3})).status_code == 200
    api.clock.advance(10)
    return api


IDLE_FIRST = {"decode": ["decode-done", "decode-idle"]}  # both idle: ties go to the worker id


async def test_a_pin_that_lowers_a_count_names_idle_engines_first(make_api, spawn) -> None:  # noqa: F811
    api = await three_decoders(make_api, spawn)
    r = await pin(api, 1, 1)
    assert r.status_code == 201, r.text
    assert r.json()["decision"]["remove"] == IDLE_FIRST
    assert (await wait_for(api, 1))["remove"] == IDLE_FIRST


async def test_a_tick_that_lowers_a_count_names_idle_engines_first(make_api, spawn) -> None:  # noqa: F811
    api = await three_decoders(make_api, spawn)
    # Bounds below the pin: the tick lowers decode to 1, and its record names what the decision does.
    assert (await override(api, "bounds", max_decode=1)).status_code == 201
    report = await api.app.state.workers["demo"].run_tick(api.clock.now())
    assert report.decision is not None and report.decision.num_decode == 1
    assert (await wait_for(api, 1))["remove"] == IDLE_FIRST
    items = (await api.client.get("/diagnostics", params={"deployment": "demo", "limit": 1})).json()["items"]
    assert items[-1]["record"]["remove"] == IDLE_FIRST


@pytest.mark.timeout(120)
async def test_the_kubernetes_connector_passes_the_hint_to_the_pods(make_api, spawn, tmp_path) -> None:  # noqa: F811
    """The whole way: engines whose worker ids are their pods' names publish forward passes; a pin
    lowers decode from 3 to 1; the worker hands the decision to the Kubernetes connector, which
    sets the idle pods' deletion cost, then lowers the replicas (the API stand-in records both)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    busy = spawn("llm-decode-a", "--count", "1000000", "--rate", "200")
    idle = spawn("llm-decode-b", "--mode", "heartbeats")
    done = spawn("llm-decode-c", "--count", "3")
    with KubeStandIn(token=TOKEN) as standin:
        services = disagg_services()
        services[DECODE]["replicas"] = 3
        standin.put(DGD.plural, NS, dgd_object(services))
        for pod in ("llm-decode-a", "llm-decode-b", "llm-decode-c"):
            standin.put_pod(NS, pod, labels={DGD_LABEL: NAME, SERVICE_LABEL: DECODE}, uid=f"uid-{pod}")
        endpoints = [busy.endpoint, idle.endpoint, done.endpoint]
        api = await api_over_engines(make_api, endpoints, connector=connector_settings(standin, token_file))
        worker = api.app.state.workers["demo"]
        assert await asyncio.to_thread(worker.renew_lease, api.clock.now())
        await engines_seen(worker, {"llm-decode-a": True, "llm-decode-b": False, "llm-decode-c": False})
        assert (await pin(api, 1, 3)).status_code == 201
        for _ in range(500):
            if (await api.client.get("/decisions/1")).json()["status"] != "pending":
                break
            await asyncio.sleep(0.02)
        before = len(standin.patches())
        r = await pin(api, 1, 1)
        assert r.json()["decision"]["remove"] == {"decode": ["llm-decode-b", "llm-decode-c"]}
        for _ in range(500):
            if (await api.client.get("/decisions/2")).json()["status"] != "pending":
                break
            await asyncio.sleep(0.02)
        patched = [r.path for r in standin.patches()[before:]]
        # The pods first, the first choice lowest; then the replicas (the scale subresource, the DGD).
        assert [p.rsplit("/", 1)[-1] for p in patched[:2]] == ["llm-decode-b", "llm-decode-c"], patched
        assert patched[2:] and not any("/pods/" in p for p in patched[2:]), patched
        costs = {
            p: standin.get(POD.plural, NS, p)["metadata"].get("annotations", {})
            for p in ("llm-decode-a", "llm-decode-b", "llm-decode-c")
        }
        assert costs["llm-decode-b"][DELETION_COST] == "-2" and costs["llm-decode-c"][DELETION_COST] == "-1"
        assert DELETION_COST not in costs["llm-decode-a"]
        dgd = standin.get(DGD.plural, NS, NAME)
        assert dgd["spec"]["services"][DECODE]["replicas"] == 1
