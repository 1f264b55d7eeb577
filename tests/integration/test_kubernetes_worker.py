"""The worker hands decisions to the Kubernetes connector: a pin reaches the DGD at once; while
the DGD is not Ready the decision stays pending and goes out at the next tick once it is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.test_kubernetes_connector import (
    NAME,
    NS,
    TOKEN,
    connector_settings,
    dgd_object,
    ready_condition,
)
from tests.k8s_standin import DGD, KubeStandIn
from tests.support import demo_config

pytestmark = pytest.mark.anyio


def replicas(standin: KubeStandIn) -> dict[str, int]:
    dgd = standin.get(DGD.plural, NS, NAME)
    assert dgd is not None
    return {s: spec["replicas"] for s, spec in dgd["spec"]["services"].items() if s != "Frontend"}


async def eventually(condition: Callable[[], bool], what: str) -> None:
    """A bounded wait (not a timing assertion)."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


async def test_pins_reach_the_dgd_and_wait_for_readiness(make_api, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    with KubeStandIn(token=TOKEN) as standin:
        standin.put(DGD.plural, NS, dgd_object())
        api = await make_api(demo_config(connector=connector_settings(standin, token_file)))
        worker = api.app.state.workers["demo"]
        await worker.wait_until_ready()
        assert worker.startup_problems == []
        # The DGD declares 2 GPUs per decode engine; the cluster wins over the configured 1.
        assert worker.gpus_per_engine == {"prefill": 1, "decode": 2}
        assert await asyncio.to_thread(worker.renew_lease, api.clock.now())

        async def decision(decision_id: int) -> dict:
            return (await api.client.get(f"/decisions/{decision_id}")).json()

        pin = {"deployment": "demo", "action": "pin", "num_prefill": 3, "num_decode": 5, "reason": "k8s"}
        assert (await api.client.post("/override", json=pin)).status_code == 201
        await eventually(
            lambda: replicas(standin) == {"PrefillWorker": 3, "DecodeWorker": 5}, "the pin patched"
        )
        for _ in range(500):
            first = await decision(1)
            if first["status"] != "pending":
                break
            await asyncio.sleep(0.02)
        assert (first["status"], first["observed"]) == ("succeeded", {"prefill": 3, "decode": 5})
        assert first["message"] == "kubernetes: replicas set to {'prefill': 3, 'decode': 5}"

        # Not Ready: nothing is patched and the decision stays pending (not failed, not succeeded).
        not_ready = dgd_object(conditions=[ready_condition("False")])["status"]
        standin.set_status(DGD.plural, NS, NAME, not_ready)
        patches_before = len(standin.patches())
        pin2 = {**pin, "num_prefill": 4, "num_decode": 6}
        assert (await api.client.post("/override", json=pin2)).status_code == 201
        await eventually(
            lambda: 2 not in worker._actuating and len(standin.requests) > 0, "the refused hand-over"
        )
        await eventually(lambda: not worker._actuations, "the hand-over task to finish")
        assert (await decision(2))["status"] == "pending"
        assert len(standin.patches()) == patches_before
        assert replicas(standin) == {"PrefillWorker": 3, "DecodeWorker": 5}

        # Ready again: the next tick hands the pending decision over.
        standin.set_status(DGD.plural, NS, NAME, dgd_object()["status"])
        api.clock.advance(180)
        await worker.run_tick(api.clock.now())
        await eventually(
            lambda: replicas(standin) == {"PrefillWorker": 4, "DecodeWorker": 6}, "the retry patched"
        )
        await eventually(lambda: not worker._actuations, "the hand-over task to finish")
        assert (await decision(2))["status"] == "succeeded"
