"""GET /decisions, GET /decisions/{id}, GET /decisions/wait, POST /decisions/{id}/complete."""

from __future__ import annotations

import asyncio

import pytest

from tests.api.helpers import assert_problem, complete, get_decision, pin, two_deployments
from tests.support import demo_config

pytestmark = pytest.mark.anyio


async def _history(api):
    """demo: 1 superseded, 2 succeeded, 3 pending; other: 1 pending."""
    for n in (1, 2):
        assert (await pin(api, n, n)).status_code == 201
    assert (
        await complete(api, 2, deployment="demo", observed={"prefill": 2, "decode": 2})
    ).status_code == 200
    assert (await pin(api, 3, 3)).status_code == 201
    r = await api.client.post(
        "/override",
        json={"deployment": "other", "action": "pin", "num_prefill": 4, "num_decode": 4, "reason": "other"},
    )
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({}, [("demo", 1), ("demo", 2), ("demo", 3), ("other", 1)], id="all"),
        pytest.param({"deployment": "demo"}, [("demo", 1), ("demo", 2), ("demo", 3)], id="deployment"),
        pytest.param({"deployment": "other"}, [("other", 1)], id="other-deployment"),
        pytest.param({"deployment": "demo", "after": 1}, [("demo", 2), ("demo", 3)], id="after"),
        pytest.param(
            {"deployment": "demo", "after": 0}, [("demo", 1), ("demo", 2), ("demo", 3)], id="after-0"
        ),
        pytest.param({"deployment": "demo", "after": 3}, [], id="after-last"),
        pytest.param({"status": "superseded"}, [("demo", 1)], id="status-superseded"),
        pytest.param({"status": "succeeded"}, [("demo", 2)], id="status-succeeded"),
        pytest.param({"status": "pending"}, [("demo", 3), ("other", 1)], id="status-pending"),
        pytest.param({"status": "expired"}, [], id="status-expired"),
        pytest.param({"deployment": "demo", "after": 1, "status": "pending"}, [("demo", 3)], id="combined"),
    ],
)
async def test_list_filters(make_api, params, expected):
    api = await make_api(two_deployments())
    await _history(api)
    r = await api.client.get("/decisions", params=params)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [(d["deployment"], d["id"]) for d in body["items"]] == expected
    assert body["next_cursor"] is None


async def test_list_statuses_and_fields(make_api):
    api = await make_api()
    await _history_single(api)
    items = (await api.client.get("/decisions")).json()["items"]
    assert [(d["id"], d["status"], d["source"]) for d in items] == [
        (1, "superseded", "override"),
        (2, "succeeded", "override"),
        (3, "pending", "override"),
    ]
    assert items[1]["observed"] == {"prefill": 2, "decode": 2}
    assert [(d["num_prefill"], d["num_decode"], d["num_workers"]) for d in items] == [
        (1, 1, None),
        (2, 2, None),
        (3, 3, None),
    ]


async def _history_single(api):
    for n in (1, 2):
        assert (await pin(api, n, n)).status_code == 201
    assert (await complete(api, 2, observed={"prefill": 2, "decode": 2})).status_code == 200
    assert (await pin(api, 3, 3)).status_code == 201


async def test_list_pagination(make_api):
    api = await make_api()
    for n in range(1, 8):
        assert (await pin(api, 1 + n % 2, n)).status_code == 201
    pages, params = [], {"deployment": "demo", "limit": 3}
    while True:
        r = await api.client.get("/decisions", params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        pages.append([d["id"] for d in body["items"]])
        if body["next_cursor"] is None:
            break
        params = {"deployment": "demo", "limit": 3, "cursor": body["next_cursor"]}
    assert pages == [[1, 2, 3], [4, 5, 6], [7]]


async def test_list_pagination_exact_multiple_ends_with_null_cursor(make_api):
    api = await make_api()
    for n in range(1, 5):
        await pin(api, 1, n)
    first = (await api.client.get("/decisions", params={"limit": 2})).json()
    assert [d["id"] for d in first["items"]] == [1, 2]
    second = (await api.client.get("/decisions", params={"limit": 2, "cursor": first["next_cursor"]})).json()
    assert [d["id"] for d in second["items"]] == [3, 4]
    assert second["next_cursor"] is None


async def test_list_unknown_deployment_is_404(make_api):
    api = await make_api()
    assert_problem(await api.client.get("/decisions", params={"deployment": "nope"}), 404, "deployment")


# --- get -----------------------------------------------------------------------------------------


async def test_get_with_and_without_deployment_when_one_is_configured(make_api):
    api = await make_api()
    created = (await pin(api, 3, 5)).json()["decision"]
    without = await get_decision(api, 1)
    with_name = await get_decision(api, 1, deployment="demo")
    assert without == with_name == created
    assert (without["id"], without["deployment"], without["num_prefill"], without["num_decode"]) == (
        1,
        "demo",
        3,
        5,
    )
    assert (without["status"], without["source"], without["completed_at"]) == ("pending", "override", None)
    assert without["created_at"].startswith("2026-11-29T12:00:00")


async def test_get_with_two_deployments(make_api):
    api = await make_api(two_deployments())
    await _history(api)
    assert_problem(await api.client.get("/decisions/1"), 422, "deployment")
    assert (await get_decision(api, 1, deployment="other"))["num_prefill"] == 4
    assert (await get_decision(api, 1, deployment="demo"))["num_prefill"] == 1


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        pytest.param("/decisions/2", {}, "id", id="unknown-id"),
        pytest.param("/decisions/1", {"deployment": "nope"}, "deployment", id="unknown-deployment"),
    ],
)
async def test_get_not_found(make_api, path, params, field):
    api = await make_api()
    await pin(api)
    assert_problem(await api.client.get(path, params=params), 404, field)


# --- wait ----------------------------------------------------------------------------------------


async def test_wait_answers_at_once_with_the_latest_newer_decision(make_api):
    api = await make_api()
    for n in (1, 2, 3):
        await pin(api, n, n)
    for after in (0, 1, 2):
        r = await api.client.get(
            "/decisions/wait", params={"deployment": "demo", "after": after, "timeout_s": 30}
        )
        assert r.status_code == 200, r.text
        assert (r.json()["id"], r.json()["num_prefill"], r.json()["status"]) == (3, 3, "pending")


async def test_wait_without_deployment_when_one_is_configured(make_api):
    api = await make_api()
    await pin(api, 3, 5)
    r = await api.client.get("/decisions/wait", params={"after": 0, "timeout_s": 5})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == 1


async def test_wait_without_deployment_when_two_are_configured_is_422(make_api):
    api = await make_api(two_deployments())
    assert_problem(
        await api.client.get("/decisions/wait", params={"after": 0, "timeout_s": 0}), 422, "deployment"
    )


@pytest.mark.parametrize(
    "after",
    [pytest.param(None, id="no-decision"), pytest.param(1, id="nothing-newer")],
)
async def test_wait_answers_204_at_the_timeout(make_api, after):
    api = await make_api()
    params = {"deployment": "demo", "timeout_s": 0.2}
    if after is not None:
        await pin(api)
        params["after"] = after
    r = await api.client.get("/decisions/wait", params=params)
    assert r.status_code == 204
    assert r.content == b""


async def test_wait_is_woken_by_a_pin(make_api):
    api = await make_api()
    waiters = api.app.state.metrics.registry

    async def wait():
        return await api.client.get(
            "/decisions/wait", params={"deployment": "demo", "after": 0, "timeout_s": 60}
        )

    task = asyncio.create_task(wait())
    # make sure the waiter is parked before the pin, so the pin has to wake it
    for _ in range(500):
        if waiters.get_sample_value("dynamo_planner_decision_waiters") == 1:
            break
        await asyncio.sleep(0.01)
    assert waiters.get_sample_value("dynamo_planner_decision_waiters") == 1
    created = (await pin(api, 3, 5)).json()["decision"]
    r = await asyncio.wait_for(task, 30)
    assert r.status_code == 200, r.text
    assert r.json() == created
    assert (r.json()["id"], r.json()["num_prefill"], r.json()["num_decode"]) == (1, 3, 5)
    assert waiters.get_sample_value("dynamo_planner_decision_waiters") == 0


async def test_wait_after_a_restart_on_the_same_database_returns_the_pending_decision(make_api):
    first = await make_api()
    await pin(first, 3, 5)
    second = await make_api()  # a second app on the same database: fresh hub, nothing cached
    r = await second.client.get("/decisions/wait", params={"deployment": "demo", "after": 0, "timeout_s": 1})
    assert r.status_code == 200
    assert r.json()["id"] == 1
    assert (await pin(second, 4, 5)).json()["decision"]["id"] == 2


# --- complete ------------------------------------------------------------------------------------


async def test_complete_succeeded(make_api):
    api = await make_api()
    await pin(api, 3, 5)
    api.clock.advance(12)
    r = await complete(api, 1, observed={"prefill": 3, "decode": 5}, message="applied by slurm")
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["id"], body["status"], body["observed"], body["message"]) == (
        1,
        "succeeded",
        {"prefill": 3, "decode": 5},
        "applied by slurm",
    )
    assert body["completed_at"].startswith("2026-11-29T12:00:12")
    assert await get_decision(api, 1) == body


async def test_complete_failed(make_api):
    api = await make_api()
    await pin(api, 3, 5)
    r = await complete(api, 1, "failed", message="no GPUs")
    assert r.status_code == 200, r.text
    assert (r.json()["status"], r.json()["observed"], r.json()["message"]) == ("failed", None, "no GPUs")


async def test_complete_is_idempotent(make_api):
    api = await make_api()
    await pin(api, 3, 5)
    first = await complete(api, 1, observed={"prefill": 3, "decode": 5})
    api.clock.advance(5)
    again = await complete(api, 1, observed={"prefill": 3, "decode": 5})
    assert again.status_code == 200, again.text
    assert again.json() == first.json()


@pytest.mark.parametrize(
    ("setup", "status"),
    [
        pytest.param("succeeded", "failed", id="succeeded-then-failed"),
        pytest.param("failed", "succeeded", id="failed-then-succeeded"),
        pytest.param("superseded", "succeeded", id="superseded"),
    ],
)
async def test_complete_conflict_is_409(make_api, setup, status):
    api = await make_api()
    await pin(api, 3, 5)
    if setup == "superseded":
        await pin(api, 4, 5)
    else:
        assert (await complete(api, 1, setup)).status_code == 200
    body = assert_problem(await complete(api, 1, status), 409)
    assert setup in body["detail"]
    decision = await get_decision(api, 1)
    assert decision["status"] == setup


async def test_complete_unknown_id_is_404(make_api):
    api = await make_api()
    await pin(api, 3, 5)
    assert_problem(await complete(api, 2), 404, "id")
    assert_problem(await complete(api, 7), 404, "id")


async def test_complete_observed_role_the_mode_lacks_is_422(make_api):
    api = await make_api()
    await pin(api, 3, 5)
    assert_problem(
        await complete(api, 1, observed={"prefill": 3, "workers": 2}), 422, "body.observed.workers"
    )
    assert (await get_decision(api, 1))["status"] == "pending"


async def test_complete_observed_prefill_in_agg_mode_is_422(make_api):
    api = await make_api(demo_config(mode="agg", workers={"min_replicas": 1, "max_replicas": 8}))
    r = await api.client.post(
        "/override", json={"deployment": "demo", "action": "pin", "num_workers": 2, "reason": "agg"}
    )
    assert r.status_code == 201, r.text
    assert_problem(await complete(api, 1, observed={"prefill": 2}), 422, "body.observed.prefill")
    ok = await complete(api, 1, observed={"workers": 2})
    assert ok.status_code == 200, ok.text
    assert ok.json()["observed"] == {"workers": 2}


async def test_complete_with_two_deployments_needs_the_deployment(make_api):
    api = await make_api(two_deployments())
    await _history(api)
    assert_problem(await complete(api, 1), 422, "deployment")
    r = await api.client.post(
        "/decisions/1/complete", params={"deployment": "other"}, json={"status": "succeeded"}
    )
    assert r.status_code == 200, r.text
    assert (r.json()["deployment"], r.json()["status"]) == ("other", "succeeded")
    assert (await get_decision(api, 1, deployment="demo"))["status"] == "superseded"


async def test_created_at_uses_the_injected_clock(make_api):
    api = await make_api()
    api.clock.advance(3600)
    decision = (await pin(api)).json()["decision"]
    assert decision["created_at"].startswith("2026-11-29T13:00:00")
