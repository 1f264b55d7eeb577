"""Shadow mode on the virtual connector, in-process on each store backend: the planner's decisions
are recorded as `shadow` and never awaited, an acknowledgement of one is refused and nothing of it
kept, the orchestrator's progress reports are what ran, and `GET /deployments/{name}/shadow`
reads the window's ticks (bad requests refused naming the field)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from app.reports.shadow import EMPTY_NOTE
from app.workers.gather import Gathered
from tests.api.helpers import ORCH, TOKENS, VIEWER, assert_problem, bearer, pin
from tests.support import demo_config

pytestmark = pytest.mark.anyio

SHADOW = {"type": "virtual", "mode": "shadow"}


def shadow_and_control() -> dict:
    config = demo_config(
        connector=SHADOW, decode={"gpus_per_engine": 2, "min_replicas": 1, "max_replicas": 8}
    )
    config["deployments"].append(demo_config(name="ctl")["deployments"][0])
    return config


async def tick(api, after_s: float) -> None:
    """A tick after `after_s`, reading what the worker reads (the orchestrator's reports)."""
    api.clock.advance(after_s)
    worker = api.app.state.workers["demo"]
    gathered = await worker.gather(api.clock.now())
    await asyncio.to_thread(worker.tick, api.clock.now(), gathered)


async def last_record(api) -> dict:
    r = await api.client.get(
        "/diagnostics", params={"deployment": "demo", "limit": 1}, headers=bearer(VIEWER)
    )
    assert r.status_code == 200, r.text
    return r.json()["items"][-1]["record"]


async def report(api, **params) -> dict:
    r = await api.client.get("/deployments/demo/shadow", params=params, headers=bearer(VIEWER))
    assert r.status_code == 200, r.text
    return r.json()


async def test_a_shadow_decision_is_recorded_never_awaited_nor_acknowledged(make_api) -> None:
    api = await make_api(shadow_and_control(), tokens=TOKENS)
    created = await pin(api, 3, 5, token="oper-token-1")
    assert created.status_code == 201, created.text
    decision = created.json()["decision"]
    assert decision["status"] == "shadow"

    ack = await api.client.post(
        f"/decisions/{decision['id']}/complete",
        params={"deployment": "demo"},
        json={"status": "succeeded", "observed": {"prefill": 3, "decode": 5}},
        headers=bearer(ORCH),
    )
    body = assert_problem(ack, 409)
    assert "shadow decision" in body["detail"] and "/progress" in body["detail"]
    # Nothing of it was kept: the next tick knows of nothing that runs.
    await tick(api, 5)
    last = await last_record(api)
    assert last["ready_source"] is None
    assert last["shadow"]["roles"]["prefill"] == {
        "incumbent": None,
        "incumbent_ready": None,
        "planner": 3,
        "wish": None,
        "attainment_incumbent": None,
        "attainment_planner": None,
    }

    # What the orchestrator runs, reported without acknowledging anything.
    progress = await api.client.post(
        f"/decisions/{decision['id']}/progress",
        params={"deployment": "demo"},
        json={"observed": {"prefill": 2, "decode": 5}},
        headers=bearer(ORCH),
    )
    assert progress.status_code == 200, progress.text
    assert progress.json()["status"] == "shadow"
    await tick(api, 5)
    last = await last_record(api)
    roles = last["shadow"]["roles"]
    assert {r: (roles[r]["incumbent"], roles[r]["planner"]) for r in roles} == {
        "prefill": (2, 3),
        "decode": (5, 5),
    }
    # The decision is what the planner would have ordered, and stays so: nothing is pending.
    got = await api.client.get(
        f"/decisions/{decision['id']}", params={"deployment": "demo"}, headers=bearer(VIEWER)
    )
    got = got.json()
    assert (got["status"], got["observed"]) == ("shadow", None)


async def test_the_window_holds_its_own_ticks(make_api) -> None:
    """Ticks a minute apart; the window of the last 90 s holds the last two (inclusive of its
    start) and bills the minute between them: 2 prefill engines and 5 decode of 2 GPUs."""
    api = await make_api(shadow_and_control(), tokens=TOKENS)
    decision = (await pin(api, 2, 5, token="oper-token-1")).json()["decision"]
    await api.client.post(
        f"/decisions/{decision['id']}/progress",
        params={"deployment": "demo"},
        json={"observed": {"prefill": 1, "decode": 5}},
        headers=bearer(ORCH),
    )
    for _ in range(3):
        await tick(api, 60)
    out = await report(api, window_s=60)
    assert (out["ticks"], out["compared"]) == (2, 2)
    assert (out["agreement_exact"], out["agreement_within_one"]) == (0.0, 1.0)
    assert out["incumbent"]["engine_hours"] == pytest.approx({"prefill": 1 / 60, "decode": 5 / 60})
    assert out["planner"]["engine_hours"] == pytest.approx({"prefill": 2 / 60, "decode": 5 / 60})
    assert out["planner"]["gpu_hours_total"] == pytest.approx(12 / 60)
    # No latency model (no profile): nothing predicted, said as unknown.
    assert out["planner"]["mean_predicted_attainment"] == {"prefill": None, "decode": None}
    assert "not a measurement" in out["caveat"]
    whole = await report(api)
    assert whole["ticks"] == 3 and whole["window_s"] == 3600


async def test_an_empty_window_says_so(make_api) -> None:
    api = await make_api(shadow_and_control(), tokens=TOKENS)
    out = await report(api)
    assert (out["ticks"], out["compared"], out["agreement_exact"], out["agreement_within_one"]) == (
        0,
        0,
        None,
        None,
    )
    assert out["note"] == EMPTY_NOTE
    assert out["first_tick"] is None


@dataclass(frozen=True)
class BadCase:
    name: str
    path: str
    params: dict
    status: int
    field: str | None
    why: str


BAD_CASES = [
    BadCase("window_zero", "demo", {"window_s": 0}, 422, "window_s", "an empty window reports nothing"),
    BadCase("window_over_a_day", "demo", {"window_s": 86401}, 422, "window_s", "reads are bounded to a day"),
    BadCase("window_not_a_number", "demo", {"window_s": "an hour"}, 422, "window_s", "seconds, as a number"),
    BadCase("window_infinite", "demo", {"window_s": "inf"}, 422, "window_s", "no unbounded read"),
    BadCase("unknown_deployment", "nope", {}, 404, "name", "a name the deployments file does not hold"),
    BadCase(
        "control_deployment",
        "ctl",
        {},
        409,
        None,
        "a deployment in control mode has no incumbent to compare with",
    ),
]


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.name)
async def test_bad_requests(case: BadCase, make_api) -> None:
    api = await make_api(shadow_and_control(), tokens=TOKENS)
    r = await api.client.get(f"/deployments/{case.path}/shadow", params=case.params, headers=bearer(VIEWER))
    body = assert_problem(r, case.status, case.field)
    if case.name == "control_deployment":
        assert "does not run in shadow mode" in body["detail"], case.why


async def test_gauges_only_for_shadow_deployments(make_api) -> None:
    api = await make_api(shadow_and_control(), tokens=TOKENS)
    decision = (await pin(api, 2, 5, token="oper-token-1")).json()["decision"]
    await api.client.post(
        f"/decisions/{decision['id']}/progress",
        params={"deployment": "demo"},
        json={"observed": {"prefill": 2, "decode": 4}},
        headers=bearer(ORCH),
    )
    await tick(api, 5)
    await tick(api, 5)
    ctl = api.app.state.workers["ctl"]
    await asyncio.to_thread(ctl.tick, api.clock.now(), Gathered(ready={"prefill": 1, "decode": 1}))
    text = (await api.client.get("/metrics", headers=bearer(VIEWER))).text
    shadow = [line for line in text.splitlines() if line.startswith("dynamo_planner_shadow")]
    assert sorted(shadow) == sorted(
        [
            'dynamo_planner_shadow_agreement{deployment="demo",kind="exact"} 0.0',
            'dynamo_planner_shadow_agreement{deployment="demo",kind="within_one"} 1.0',
            'dynamo_planner_shadow_engines{deployment="demo",role="prefill",source="incumbent"} 2.0',
            'dynamo_planner_shadow_engines{deployment="demo",role="prefill",source="planner"} 2.0',
            'dynamo_planner_shadow_engines{deployment="demo",role="decode",source="incumbent"} 4.0',
            'dynamo_planner_shadow_engines{deployment="demo",role="decode",source="planner"} 5.0',
        ]
    )
