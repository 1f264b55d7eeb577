"""Engines that never come, in a fleet: the GPUs a deployment could not get go to the others.

Two deployments share a GPU budget both want more of. The higher priority's orders never become
ready (its engines stay at one per role, as when the cluster has no GPU for them); once its wait
bound passes, its wish is capped at what runs, and the fleet step grants the rest to the other
deployment, whose engines do come."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.core.sla.shortfall import WAIT_MIN_S
from app.workers.gather import Gathered
from tests.api.test_fleet_api import member
from tests.unit.test_planner import _input

pytestmark = pytest.mark.anyio

BUDGET_GPUS = 12
TICK_S = 5  # the members' tick and the fleet step's
TRAFFIC = 10  # _input's tick 10: 60 requests/s, more than either deployment's share of the budget


def config() -> dict[str, Any]:
    deployments = [member(name) for name in ("chat", "code")]
    return {
        "deployments": deployments,
        "fleet": {
            "budget_gpus": {"h200": BUDGET_GPUS},
            "interval_s": TICK_S,
            "deployments": {"chat": {"priority": 2}, "code": {"priority": 1}},
        },
    }


async def tick(api, name: str, ready: dict[str, int]):  # type: ignore[no-untyped-def]
    inp = _input(TRAFFIC)
    gathered = Gathered(traffic=inp.traffic, fpm=dict(inp.fpm), ready=ready)
    return await asyncio.to_thread(api.app.state.workers[name].tick, api.clock.now(), gathered)


async def test_gpus_a_deployment_cannot_get_go_to_the_others(make_api) -> None:
    api = await make_api(config())
    fleet = api.app.state.fleet
    chat_ready = {"prefill": 1, "decode": 1}  # chat's engines never come
    code_ready = {"prefill": 1, "decode": 1}
    granted: list[dict[str, int]] = []
    shortfall_at = None
    for n in range(int(2 * WAIT_MIN_S / TICK_S)):
        await asyncio.to_thread(fleet.step, api.clock.now())
        await tick(api, "chat", chat_ready)
        report = await tick(api, "code", code_ready)
        if report is not None and report.decision is not None:
            code_ready = {"prefill": report.decision.num_prefill, "decode": report.decision.num_decode}
        members = {m["deployment"]: m for m in (await api.client.get("/fleet")).json()["members"]}
        granted.append({name: m["granted_gpus"] for name, m in members.items()})
        last = (await api.client.get("/diagnostics", params={"deployment": "chat", "limit": 1})).json()
        if shortfall_at is None and last["items"][-1]["record"]["sla"].get("capacity_unavailable"):
            shortfall_at = n
        api.clock.advance(TICK_S)
    assert shortfall_at is not None, "chat's orders never came: a shortfall within two bounds"
    before, after = granted[shortfall_at - 1], granted[-1]
    # Before: chat, the higher priority, holds more than it runs (its orders are pending).
    assert before["chat"] > sum(chat_ready.values()), granted
    # After: chat is granted what runs, and code gets what chat gave back, within the budget.
    assert after["chat"] == sum(chat_ready.values()), granted
    assert after["code"] > before["code"], granted
    assert after["chat"] + after["code"] <= BUDGET_GPUS
