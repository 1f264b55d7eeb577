"""What runs, as the planner knows it behind the virtual connector: the freshest report of the
orchestrator, whether a progress report (`POST /decisions/{id}/progress`) while a decision is
applied, or the observed counts of any acknowledgement, also of a decision SLA scaling or a pin
superseded. The tick record says which."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.helpers import ORCH, TOKENS, VIEWER, assert_problem, bearer, complete, get_decision, pin
from tests.support import REPO_ROOT, demo_config

pytestmark = pytest.mark.anyio

H200 = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")


async def progress(api, decision_id: int, observed: Any, token: str | None = None):  # type: ignore[no-untyped-def]
    return await api.client.post(
        f"/decisions/{decision_id}/progress", json={"observed": observed}, headers=bearer(token)
    )


async def ticked(api) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """One tick that gathers as `planner serve` does; its record."""
    api.clock.advance(5)
    await api.app.state.workers["demo"].run_tick(api.clock.now())
    items = (await api.client.get("/diagnostics", params={"deployment": "demo", "limit": 1})).json()["items"]
    return items[-1]["record"]


async def sla_api(make_api, **extra: Any):  # type: ignore[no-untyped-def]
    # SLA scaling without a traffic source: it decides nothing, and records the counts it read.
    return await make_api(demo_config(profile=H200, scaling={"algorithm": "sla", "interval_s": 5}), **extra)


async def test_the_freshest_report_is_what_runs(make_api) -> None:
    api = await sla_api(make_api)
    first = await ticked(api)
    assert (first["sla"]["ready"], first["ready_source"]) == ({"prefill": 0, "decode": 0}, None)

    assert (await pin(api, 3, 5)).status_code == 201
    r = await progress(api, 1, {"prefill": 2, "decode": 1})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "pending", "a progress report does not settle the decision"
    record = await ticked(api)
    assert record["sla"]["ready"] == {"prefill": 2, "decode": 1}
    assert record["ready_source"] == "progress report of decision 1"

    # A second pin supersedes decision 1 before it is acknowledged; the orchestrator then
    # acknowledges 1 with what it sees. The acknowledgement conflicts, but what it saw counts.
    assert (await pin(api, 4, 6)).status_code == 201
    assert (await get_decision(api, 1))["status"] == "superseded"
    assert_problem(await complete(api, 1, observed={"prefill": 3, "decode": 5}), 409)
    record = await ticked(api)
    assert record["sla"]["ready"] == {"prefill": 3, "decode": 5}
    assert record["ready_source"] == "acknowledgement (succeeded, conflict) of decision 1"
    summary = (await api.client.get("/deployments/demo")).json()
    assert summary["ready"] == {"prefill": 3, "decode": 5}

    # Decision 2 succeeds without counts: its replicas run.
    assert (await complete(api, 2)).status_code == 200
    record = await ticked(api)
    assert record["sla"]["ready"] == {"prefill": 4, "decode": 6}
    assert record["ready_source"] == "acknowledgement (succeeded, applied) of decision 2"


BAD = [
    ("no counts", {}, 422, "body.observed"),
    ("a role the mode lacks", {"workers": 2}, 422, "body.observed.workers"),
    ("negative", {"prefill": -1}, 422, "body.observed.prefill"),
    ("not an object", [1, 2], 422, "body.observed"),
]


@pytest.mark.parametrize(("observed", "status", "field"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
async def test_a_bad_report_is_refused_and_counts_nothing(make_api, observed, status, field) -> None:
    api = await sla_api(make_api)
    assert (await pin(api, 3, 5)).status_code == 201
    assert_problem(await progress(api, 1, observed), status, field)
    assert (await ticked(api))["ready_source"] is None


async def test_only_an_orchestrator_reports_and_only_on_a_known_decision(make_api) -> None:
    api = await sla_api(make_api, tokens=TOKENS)
    assert_problem(await progress(api, 1, {"prefill": 1}, token=VIEWER), 403)
    assert_problem(await progress(api, 7, {"prefill": 1}, token=ORCH), 404)
