"""The fleet step in the service, in-process: three deployments wish more GPUs than the budget
holds; the fleet loop grants, each worker's next tick decides within its grant, and GET /fleet,
GET /deployments, /metrics and the decisions say who was cut, why and by whom."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime, timedelta
from typing import Any

import pytest

from app.workers.gather import Gathered
from tests.support import REPO_ROOT, demo_config
from tests.unit.test_planner import _input

pytestmark = pytest.mark.anyio

H200 = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")
NAMES = ("chat", "code", "batch")
BUDGET_GPUS = 8
PRIORITY = {"chat": 3, "code": 2, "batch": 1}


def member(name: str) -> dict[str, Any]:
    """A fleet member: SLA scaling every 5 s on the H200 profile, advisory (no connector)."""
    return demo_config(
        name=name,
        connector={"type": "none"},
        profile=H200,
        sla={"ttft_ms": 1000, "itl_ms": 30},
        prefill={"min_replicas": 1, "max_replicas": 32},
        decode={"min_replicas": 1, "max_replicas": 32},
        scaling={"algorithm": "sla", "interval_s": 5.0},
    )["deployments"][0]


def fleet_config(**fleet: Any) -> dict[str, Any]:
    return {
        "deployments": [member(name) for name in NAMES],
        "fleet": {
            "budget_gpus": {"h200": BUDGET_GPUS},
            "interval_s": 5,
            "deployments": {n: {"priority": PRIORITY[n], "guaranteed_gpus": 2} for n in NAMES},
            **fleet,
        },
    }


async def tick(api, name: str, i: int):
    inp = _input(i)
    gathered = Gathered(traffic=inp.traffic, fpm=dict(inp.fpm), ready=dict(inp.ready))
    return await asyncio.to_thread(api.app.state.workers[name].tick, api.clock.now(), gathered)


async def step(api):
    return await asyncio.to_thread(api.app.state.fleet.step, api.clock.now())


async def run(api, ticks: int, *, start: int = 0) -> list[Any]:
    """`ticks` rounds of: the fleet step, then every deployment's tick, 5 s apart."""
    reports = []
    for i in range(start, start + ticks):
        await step(api)
        for name in NAMES:
            reports.append((name, await tick(api, name, i)))
        api.clock.advance(5)
    return reports


def metric_values(text: str, name: str) -> dict[tuple[str, ...], float]:
    out = {}
    for line in text.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if m:
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(1))))
            out[labels] = float(m.group(2))  # type: ignore[assignment]
    return out


async def test_a_fleet_over_budget_cuts_the_lowest_priority_and_says_so(make_api) -> None:
    api = await make_api(fleet_config())
    await run(api, 12)

    fleet = (await api.client.get("/fleet")).json()
    members = {m["deployment"]: m for m in fleet["members"]}
    assert set(members) == set(NAMES)
    wished = sum(m["wish_gpus"] for m in members.values())
    assert wished > BUDGET_GPUS, f"the traffic must ask for more than the budget: {members}"
    [budget] = fleet["budgets"]
    assert budget["budget_gpus"] == BUDGET_GPUS
    assert budget["granted_gpus"] == sum(m["granted_gpus"] for m in members.values()) <= BUDGET_GPUS
    assert fleet["leader"] is True and fleet["stepped_at"] is not None

    # The lowest priority is cut by the budget, and names the higher priorities holding the GPUs.
    batch = members["batch"]
    assert batch["cut"] is True
    cut_roles = [r for r in batch["roles"].values() if r["cut"]]
    assert cut_roles and {r["reason"] for r in cut_roles} == {"cut_budget"}
    holders = {c["by"]: c["why"] for c in batch["cut_by"]}
    assert "chat" in holders and holders["chat"].startswith("higher priority (3 > 1)"), holders
    # A lower priority keeps GPUs from a higher one only by its guarantee.
    for m in members.values():
        for c in m["cut_by"]:
            if PRIORITY[c["by"]] < m["priority"]:
                assert c["why"].startswith("guarantee"), (m["deployment"], c)

    # Every decision respects the grant in force at its tick (the fleet steps before each tick).
    decisions = 0
    for name in NAMES:
        ticks = (await api.client.get("/diagnostics", params={"deployment": name})).json()["items"]
        assert len(ticks) == 12
        for row in ticks:
            granted, target = row["record"]["fleet"], row["record"]["target"]
            assert granted is not None
            if row["decision_id"] is not None:
                decisions += 1
                for role, n in target.items():
                    assert n <= granted["roles"][role]["granted"], (name, row["record"])
    assert decisions >= len(NAMES)

    # batch's last tick was held down by its grant, and says by whom.
    last = (await api.client.get("/diagnostics", params={"deployment": "batch"})).json()["items"][-1]
    note = last["record"]["fleet"]["note"]
    assert last["record"]["fleet"]["binding"] is True
    assert "cut_budget" in note and "chat: higher priority (3 > 1)" in note, note
    # A decision the grant lowered says so in its reasons.
    items = (await api.client.get("/decisions", params={"deployment": "batch"})).json()["items"]
    notes = [r for d in items for r in d["reasons"] if r.startswith("fleet: cut by the fleet grant")]
    assert notes, [d["reasons"] for d in items]

    # /deployments carries the same grant, cut and reasons.
    listed = {d["name"]: d for d in (await api.client.get("/deployments")).json()}
    assert listed["batch"]["fleet"] == members["batch"]
    one = (await api.client.get("/deployments/chat")).json()
    assert one["fleet"]["cut_by"] == [] or one["fleet"]["cut"] is True

    # /metrics: budget, grants, wishes and the cut flag per deployment and role.
    text = (await api.client.get("/metrics")).text
    assert metric_values(text, "dynamo_planner_fleet_budget_gpus") == {(("gpu_type", "h200"),): BUDGET_GPUS}
    granted = metric_values(text, "dynamo_planner_fleet_granted_gpus")
    assert sum(granted.values()) == budget["granted_gpus"]
    cut = metric_values(text, "dynamo_planner_fleet_cut")
    for role, r in batch["roles"].items():
        assert cut[(("deployment", "batch"), ("role", role))] == (1.0 if r["cut"] else 0.0)
    wish = metric_values(text, "dynamo_planner_fleet_wish_engines")
    assert wish[(("deployment", "batch"), ("role", "prefill"))] == batch["roles"]["prefill"]["wish"]
    changes = metric_values(text, "dynamo_planner_fleet_grant_changes_total")
    assert sum(changes.values()) == sum(m["grant_changes"] for m in members.values())


async def test_grants_never_exceed_the_budget_at_any_step(make_api) -> None:
    api = await make_api(fleet_config())
    for i in range(12):
        decision = await step(api)
        assert decision is not None
        used = sum(
            n * 1 for g in decision.grants.values() for n in g.engines.values()
        )  # one GPU per engine in this configuration
        assert used <= BUDGET_GPUS, decision.as_dict()
        for name in NAMES:
            await tick(api, name, i)
        api.clock.advance(5)


async def test_fleet_is_404_without_a_fleet_section(make_api) -> None:
    api = await make_api()
    r = await api.client.get("/fleet")
    assert r.status_code == 404 and "fleet" in r.json()["detail"]
    assert (await api.client.get("/deployments/demo")).json()["fleet"] is None


async def test_a_restart_resumes_the_stored_grants(make_api) -> None:
    first = await make_api(fleet_config())
    await run(first, 10)
    before = (await first.client.get("/fleet")).json()
    # Another process on the same database after the first one's fleet lease ran out.
    second = await make_api(fleet_config(), start=first.clock.now() + timedelta(seconds=60))
    worker = second.app.state.fleet
    assert worker.step(second.clock.now()) is not None
    assert worker.state.grants.keys() == set(NAMES)
    after = (await second.client.get("/fleet")).json()
    # The counts of grant changes carry on from the stored ones.
    changes_before = {m["deployment"]: m["grant_changes"] for m in before["members"]}
    changes_after = {m["deployment"]: m["grant_changes"] for m in after["members"]}
    assert all(changes_after[n] >= changes_before[n] for n in NAMES) and sum(changes_before.values()) > 0
    # The hold times came back: a grant the restart did not change keeps the first process's
    # change time (a fresh fleet state would stamp every grant with the second process's now).
    first_state = first.app.state.fleet.state
    kept = 0
    for name in NAMES:
        for role, at in worker.state.changed_s[name].items():
            if worker.state.grants[name][role] == first_state.grants[name][role]:
                assert at == first_state.changed_s[name][role], (name, role)
                kept += 1
    assert kept > 0


async def test_a_failing_fleet_step_is_counted_and_shown_in_readyz(make_api) -> None:
    api = await make_api(fleet_config())
    fleet = api.app.state.fleet
    # A real failure: the fleet's table is gone (as after a wrong manual migration).
    with api.app.state.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE fleet_state")
    fleet.start()
    try:
        for _ in range(100):
            if fleet.last_error:
                break
            await asyncio.sleep(0.02)
        assert fleet.last_error and fleet.consecutive_failures >= 1
        r = await api.client.get("/readyz")
        assert r.status_code == 503
        reasons = r.json()["deployments"]
        assert all(any(x.startswith("last fleet step failed:") for x in reasons[n]) for n in NAMES), reasons
        text = (await api.client.get("/metrics")).text
        [failures] = [
            float(line.split()[1])
            for line in text.splitlines()
            if line.startswith("dynamo_planner_fleet_step_failures_total ")
        ]
        assert failures == fleet.consecutive_failures >= 1
    finally:
        await fleet.stop()


async def test_only_the_lease_holder_steps_and_the_other_shows_its_grants(make_api) -> None:
    first = await make_api(fleet_config())
    await run(first, 3)
    # A second process on the same database while the first one's fleet lease runs.
    second = await make_api(fleet_config(), start=first.clock.now())
    assert await step(second) is None
    assert second.app.state.fleet.is_leader is False
    mine = (await first.client.get("/fleet")).json()
    theirs = (await second.client.get("/fleet")).json()
    assert (mine["leader"], theirs["leader"]) == (True, False)
    assert theirs["members"] == mine["members"] and theirs["stepped_at"] == mine["stepped_at"]
    # A deployment worker leading in the second process (the first one's stopped and let its
    # lease go) ticks within the grants the first process stored.
    await first.app.state.workers["batch"].stop()
    assert await tick(second, "batch", 3) is not None
    last = (await second.client.get("/diagnostics", params={"deployment": "batch"})).json()["items"][-1]
    granted_at = datetime.fromisoformat(last["record"]["fleet"]["granted_at"])
    assert granted_at == datetime.fromisoformat(mine["stepped_at"])


async def test_a_process_that_lost_the_fleet_lease_stops_exporting_fleet_gauges(make_api) -> None:
    first = await make_api(fleet_config())
    await run(first, 2)
    assert "dynamo_planner_fleet_budget_gpus{" in (await first.client.get("/metrics")).text
    # The first process stalls past its lease; a second one takes the fleet step over.
    second = await make_api(fleet_config(), start=first.clock.now() + timedelta(seconds=60))
    assert await step(second) is not None
    first.clock.advance(60)
    assert await step(first) is None
    mine = (await first.client.get("/metrics")).text
    theirs = (await second.client.get("/metrics")).text
    assert metric_values(mine, "dynamo_planner_fleet_granted_gpus") == {}
    assert metric_values(mine, "dynamo_planner_fleet_budget_gpus") == {}
    assert metric_values(theirs, "dynamo_planner_fleet_budget_gpus") == {(("gpu_type", "h200"),): BUDGET_GPUS}
