"""POST/GET/DELETE /override, GET /audit and GET /deployments/{name}."""

from __future__ import annotations

import pytest

from app.api.auth import fingerprint
from tests.api.helpers import (
    OPER,
    TOKENS,
    assert_problem,
    bearer,
    complete,
    get_decision,
    override,
    pin,
)
from tests.support import demo_config

pytestmark = pytest.mark.anyio

AGG = demo_config(mode="agg", workers={"min_replicas": 1, "max_replicas": 8})


async def audit(api, token=None):
    r = await api.client.get("/audit", headers=bearer(token))
    assert r.status_code == 200, r.text
    return list(reversed(r.json()))  # oldest first


async def listed(api, **params):
    r = await api.client.get("/override", params=params)
    assert r.status_code == 200, r.text
    return r.json()


# --- pin -----------------------------------------------------------------------------------------


async def test_pin_creates_an_override_decision(make_api):
    api = await make_api()
    r = await pin(api, 3, 5, reason="black friday")
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["id"], body["action"], body["params"], body["reason"], body["active"]) == (
        1,
        "pin",
        {"prefill": 3, "decode": 5},
        "black friday",
        True,
    )
    assert (body["created_by"], body["expires_at"], body["ended_at"]) == ("loopback", None, None)
    d = body["decision"]
    assert (d["id"], d["source"], d["status"], d["num_prefill"], d["num_decode"], d["override_id"]) == (
        1,
        "override",
        "pending",
        3,
        5,
        1,
    )
    assert any("black friday" in reason for reason in d["reasons"])
    assert body["decision_outcome"] == "create: no decision awaits acknowledgement"


async def test_second_pin_supersedes_an_unacknowledged_one(make_api):
    api = await make_api()
    await pin(api, 3, 5)
    r = await pin(api, 4, 6)
    assert r.status_code == 201, r.text
    assert r.json()["decision"]["id"] == 2
    assert r.json()["decision_outcome"] == "create: override supersedes unacknowledged decision 1"
    first = await get_decision(api, 1)
    assert (first["status"], first["status_reason"]) == (
        "superseded",
        "replaced by decision 2: override supersedes unacknowledged decision 1",
    )
    assert (await get_decision(api, 2))["status"] == "pending"
    # the first pin override was replaced by the second
    overrides = await listed(api, include_inactive="true")
    assert [(o["id"], o["active"], o["ended_reason"]) for o in overrides] == [
        (2, True, None),
        (1, False, "replaced by override #2"),
    ]


async def test_pin_after_an_acknowledged_decision_creates_a_new_one(make_api):
    api = await make_api()
    await pin(api, 3, 5)
    await complete(api, 1)
    r = await pin(api, 4, 5)
    assert r.json()["decision"]["id"] == 2
    assert (await get_decision(api, 1))["status"] == "succeeded"


@pytest.mark.parametrize("ack", [pytest.param(False, id="pending"), pytest.param(True, id="succeeded")])
async def test_pin_equal_to_the_target_in_force_creates_no_decision(make_api, ack):
    api = await make_api()
    await pin(api, 3, 5)
    if ack:
        await complete(api, 1)
    r = await pin(api, 3, 5)
    assert r.status_code == 201, r.text
    assert r.json()["decision"] is None
    status = "succeeded" if ack else "pending"
    assert r.json()["decision_outcome"] == f"unchanged: target equals decision 1 ({status})"
    items = (await api.client.get("/decisions")).json()["items"]
    assert [(d["id"], d["status"]) for d in items] == [(1, status)]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param({"num_prefill": 9, "num_decode": 5}, "body.num_prefill", id="prefill-above-max"),
        pytest.param({"num_prefill": 0, "num_decode": 5}, "body.num_prefill", id="prefill-below-min"),
        pytest.param({"num_prefill": 3, "num_decode": 9}, "body.num_decode", id="decode-above-max"),
        pytest.param({"num_prefill": 3}, "body.num_decode", id="decode-missing"),
        pytest.param({"num_decode": 3}, "body.num_prefill", id="prefill-missing"),
        pytest.param(
            {"num_prefill": 3, "num_decode": 5, "num_workers": 2}, "body.num_workers", id="workers-in-disagg"
        ),
    ],
)
async def test_pin_rejected(make_api, body, field):
    api = await make_api()
    r = await api.client.post(
        "/override", json={"deployment": "demo", "action": "pin", "reason": "x", **body}
    )
    assert_problem(r, 422, field)
    assert await listed(api, include_inactive="true") == []
    assert await audit(api) == []


async def test_pin_outside_overridden_bounds_is_rejected(make_api):
    api = await make_api()
    assert (await override(api, "bounds", max_prefill=2)).status_code == 201
    assert_problem(await pin(api, 3, 5), 422, "body.num_prefill")
    assert (await pin(api, 2, 5)).status_code == 201


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        pytest.param({"num_workers": 2}, 201, None, id="workers"),
        pytest.param({}, 422, "body.num_workers", id="workers-missing"),
        pytest.param({"num_workers": 2, "num_prefill": 1}, 422, "body.num_prefill", id="prefill"),
        pytest.param({"num_workers": 2, "num_decode": 1}, 422, "body.num_decode", id="decode"),
        pytest.param({"num_workers": 9}, 422, "body.num_workers", id="workers-above-max"),
    ],
)
async def test_pin_in_agg_mode(make_api, body, status, field):
    api = await make_api(AGG)
    r = await api.client.post(
        "/override", json={"deployment": "demo", "action": "pin", "reason": "x", **body}
    )
    if status == 201:
        assert r.status_code == 201, r.text
        d = r.json()["decision"]
        assert (d["num_workers"], d["num_prefill"], d["num_decode"]) == (2, None, None)
    else:
        assert_problem(r, status, field)


# --- bounds, pause, resume, delete ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "fields", "field"),
    [
        pytest.param(None, {"min_workers": 1}, "body.min_workers", id="workers-in-disagg"),
        pytest.param(AGG, {"max_prefill": 3}, "body.max_prefill", id="prefill-in-agg"),
        pytest.param(None, {"min_prefill": 5, "max_prefill": 2}, "body.min_prefill", id="min-above-max"),
        pytest.param(None, {"min_decode": 9}, "body.min_decode", id="min-above-configured-max"),
        pytest.param(None, {"max_decode": 0}, "body.max_decode", id="max-below-configured-min"),
        pytest.param(None, {}, "body", id="empty"),
    ],
)
async def test_bounds_rejected(make_api, config, fields, field):
    api = await make_api(config)
    assert_problem(await override(api, "bounds", **fields), 422, field)
    assert await listed(api, include_inactive="true") == []


async def test_bounds_replace_bounds(make_api):
    api = await make_api()
    first = await override(api, "bounds", min_prefill=2, max_prefill=4)
    assert first.status_code == 201, first.text
    assert (first.json()["params"], first.json()["decision"], first.json()["decision_outcome"]) == (
        {"min_prefill": 2, "max_prefill": 4},
        None,
        None,
    )
    second = await override(api, "bounds", max_decode=6)
    active = await listed(api)
    assert [(o["id"], o["params"]) for o in active] == [(second.json()["id"], {"max_decode": 6})]


async def test_pause_then_resume(make_api):
    api = await make_api()
    pause = await override(api, "pause")
    assert pause.status_code == 201, pause.text
    assert (pause.json()["action"], pause.json()["active"]) == ("pause", True)
    assert (await api.client.get("/deployments/demo")).json()["paused"] is True

    resume = await override(api, "resume")
    assert resume.status_code == 201, resume.text
    assert (resume.json()["action"], resume.json()["active"]) == ("resume", False)
    assert (await api.client.get("/deployments/demo")).json()["paused"] is False
    assert await listed(api) == []
    everything = await listed(api, include_inactive="true")
    assert [(o["action"], o["ended_reason"]) for o in everything] == [
        ("resume", "resume is an event, not a state"),
        ("pause", f"ended by override #{resume.json()['id']}"),
    ]


@pytest.mark.parametrize(
    "history", [pytest.param([], id="never-paused"), pytest.param(["pause", "resume"], id="already-resumed")]
)
async def test_resume_when_not_paused_is_409(make_api, history):
    api = await make_api()
    for action in history:
        assert (await override(api, action)).status_code == 201
    assert_problem(await override(api, "resume"), 409)
    assert len(await listed(api, include_inactive="true")) == len(history)
    assert len(await audit(api)) == len(history)


async def test_delete_ends_an_override_and_is_idempotent(make_api):
    api = await make_api()
    created = (await pin(api, 3, 5)).json()
    api.clock.advance(10)
    r = await api.client.delete(f"/override/{created['id']}")
    assert r.status_code == 200, r.text
    ended = r.json()
    assert (ended["id"], ended["active"], ended["ended_reason"]) == (
        created["id"],
        False,
        "deleted by loopback",
    )
    assert ended["ended_at"].startswith("2026-11-29T12:00:10")
    assert await listed(api) == []

    api.clock.advance(10)
    again = await api.client.delete(f"/override/{created['id']}")
    assert again.status_code == 200, again.text
    assert again.json() == ended
    assert [a["action"] for a in await audit(api)] == ["override.pin", "override.delete"]
    # ending a pin does not touch the decision it made
    assert (await get_decision(api, 1))["status"] == "pending"


async def test_delete_unknown_override_is_404(make_api):
    api = await make_api()
    assert_problem(await api.client.delete("/override/42"), 404, "id")


# --- expiry --------------------------------------------------------------------------------------


async def test_pin_expires(make_api):
    api = await make_api()
    created = (await pin(api, 3, 5, expires_in_s=60)).json()
    assert created["expires_at"].startswith("2026-11-29T12:01:00")
    assert [o["id"] for o in await listed(api)] == [created["id"]]
    api.clock.advance(59)
    assert [o["active"] for o in await listed(api)] == [True]
    api.clock.advance(2)
    assert await listed(api) == []
    inactive = await listed(api, include_inactive="true")
    assert [(o["id"], o["active"], o["ended_at"]) for o in inactive] == [(created["id"], False, None)]
    assert (await api.client.get("/deployments/demo")).json()["active_overrides"] == []


async def test_list_filters_by_deployment(make_api):
    api = await make_api()
    await pin(api)
    assert [o["deployment"] for o in await listed(api, deployment="demo")] == ["demo"]
    assert_problem(await api.client.get("/override", params={"deployment": "nope"}), 404, "deployment")


# --- audit ---------------------------------------------------------------------------------------


async def _every_action(api, token=None):
    p = (await pin(api, 3, 5, token=token)).json()["id"]
    assert (await override(api, "bounds", token=token, max_decode=6)).status_code == 201
    assert (await override(api, "pause", token=token)).status_code == 201
    assert (await override(api, "resume", token=token)).status_code == 201
    assert (await api.client.delete(f"/override/{p}", headers=bearer(token))).status_code == 200


EXPECTED_ACTIONS = ["override.pin", "override.bounds", "override.pause", "override.resume", "override.delete"]


async def test_audit_without_tokens_names_loopback(make_api):
    api = await make_api()
    await _every_action(api)
    entries = await audit(api)
    assert [(a["action"], a["actor_role"], a["actor"], a["deployment"]) for a in entries] == [
        (action, "operator", "loopback", "demo") for action in EXPECTED_ACTIONS
    ]
    assert entries[0]["details"]["params"] == {"prefill": 3, "decode": 5}
    assert entries[0]["details"]["reason"] == "test pin"


async def test_audit_with_tokens_names_the_token_fingerprint(make_api):
    api = await make_api(tokens=TOKENS)
    await _every_action(api, token=OPER)
    entries = await audit(api, token=OPER)
    name = fingerprint(OPER)
    assert name.startswith("token:") and OPER not in name
    assert [(a["action"], a["actor_role"], a["actor"]) for a in entries] == [
        (action, "operator", name) for action in EXPECTED_ACTIONS
    ]
    r = await api.client.get("/override", params={"include_inactive": "true"}, headers=bearer(OPER))
    assert {o["created_by"] for o in r.json()} == {name}


async def test_rejected_overrides_are_not_audited(make_api):
    api = await make_api()
    await pin(api, 99, 5)
    await override(api, "resume")
    await override(api, "bounds")
    assert await audit(api) == []


# --- deployment state ----------------------------------------------------------------------------


async def test_deployment_state(make_api):
    api = await make_api()
    before = (await api.client.get("/deployments/demo")).json()
    assert (before["name"], before["mode"], before["connector"]) == ("demo", "disagg", "virtual")
    assert (
        before["ready"],
        before["desired"],
        before["last_decision"],
        before["active_overrides"],
        before["paused"],
    ) == (None, None, None, [], False)
    assert before["roles"]["prefill"] == {"gpus_per_engine": 1, "min_replicas": 1, "max_replicas": 8}

    pin_id = (await pin(api, 3, 5)).json()["id"]
    await override(api, "pause")
    state = (await api.client.get("/deployments/demo")).json()
    assert state["desired"] == {"prefill": 3, "decode": 5}
    assert state["ready"] is None
    assert state["last_decision"]["id"] == 1
    assert sorted(o["id"] for o in state["active_overrides"]) == [pin_id, pin_id + 1]
    assert state["paused"] is True

    assert (await complete(api, 1, observed={"prefill": 2, "decode": 5})).status_code == 200
    state = (await api.client.get("/deployments/demo")).json()
    assert state["ready"] == {"prefill": 2, "decode": 5}
    assert state["desired"] == {"prefill": 3, "decode": 5}
    assert state["last_decision"]["status"] == "succeeded"

    listing = (await api.client.get("/deployments")).json()
    assert [d["name"] for d in listing] == ["demo"]
    assert listing[0] == state


async def test_unknown_deployment_is_404(make_api):
    api = await make_api()
    assert_problem(await api.client.get("/deployments/nope"), 404, "name")
