"""GET and PATCH /deployments/{name}/settings: the revision as ETag, a change applied from the
next tick, refused when stale (412), unnamed (428), invalid (422 naming the field) or not an
operator's (403), and audited."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.helpers import OPER, TOKENS, VIEWER, assert_problem, bearer, complete, diagnostics, pin, tick
from tests.support import demo_config

pytestmark = pytest.mark.anyio


async def get_settings(api, token: str | None = None):  # type: ignore[no-untyped-def]
    return await api.client.get("/deployments/demo/settings", headers=bearer(token))


async def patch(api, body: Any, if_match: str | None, token: str | None = None):  # type: ignore[no-untyped-def]
    headers = bearer(token)
    if if_match is not None:
        headers["If-Match"] = if_match
    return await api.client.patch(
        "/deployments/demo/settings",
        json=body,
        headers={**headers, "Content-Type": "application/merge-patch+json"},
    )


async def test_a_change_runs_from_the_next_tick(make_api):
    api = await make_api()
    r = await get_settings(api)
    assert r.status_code == 200 and r.headers["etag"] == '"0"'
    body = r.json()
    assert (body["revision"], body["overrides"], body["updated_by"]) == (0, {}, None)
    assert body["settings"]["prefill"] == {"min_replicas": 1, "max_replicas": 8}
    assert set(body["sources"].values()) == {"file"}

    await tick(api)
    assert (await diagnostics(api))[-1]["record"]["settings_revision"] == 0

    r = await patch(api, {"prefill": {"max_replicas": 2}, "sla": {"ttft_ms": 300}}, '"0"')
    assert r.status_code == 200, r.text
    assert r.headers["etag"] == '"1"'
    changed = r.json()
    assert changed["settings"]["prefill"]["max_replicas"] == 2
    assert (changed["sources"]["prefill.max_replicas"], changed["sources"]["prefill.min_replicas"]) == (
        "store",
        "file",
    )
    assert changed["updated_by"] == "loopback"

    api.clock.advance(180)
    await tick(api)
    record = (await diagnostics(api))[-1]["record"]
    assert record["settings_revision"] == 1
    assert record["bounds"]["prefill"] == {"min": 1, "max": 2}
    summary = (await api.client.get("/deployments/demo")).json()
    assert (summary["sla"]["ttft_ms"], summary["roles"]["prefill"]["max_replicas"]) == (300, 2)


async def test_a_pin_is_clamped_by_the_changed_bounds(make_api):
    api = await make_api()
    assert (await pin(api, 3, 5)).status_code == 201
    assert (await complete(api, 1, observed={"prefill": 3, "decode": 5})).status_code == 200
    # A pin is checked against the bounds as they run: above the changed maximum, refused.
    assert (await patch(api, {"decode": {"max_replicas": 4}}, "*")).status_code == 200
    assert_problem(await pin(api, 3, 5), 422, "body.num_decode")
    api.clock.advance(10)
    report = await tick(api)
    assert report.decision is not None
    assert (report.decision.num_prefill, report.decision.num_decode) == (3, 4)


async def test_null_returns_a_field_to_the_file(make_api):
    api = await make_api()
    await patch(api, {"sla": {"itl_ms": 30}}, '"0"')
    r = await patch(api, {"sla": {"itl_ms": None}}, '"1"')
    assert r.status_code == 200
    assert (r.json()["overrides"], r.json()["settings"]["sla"]["itl_ms"]) == ({}, 50)
    assert r.json()["sources"]["sla.itl_ms"] == "file"


BAD = [
    ("stale revision", {"sla": {"ttft_ms": 300}}, '"0"', 412, None),
    ("no If-Match", {"sla": {"ttft_ms": 300}}, None, 428, None),
    ("If-Match not a revision", {"sla": {"ttft_ms": 300}}, '"abc"', 422, "If-Match"),
    ("unknown field", {"sla": {"ttft": 300}}, '"1"', 422, "body.sla.ttft"),
    ("not live", {"profile": "elsewhere"}, '"1"', 422, "body.profile"),
    ("invalid value", {"decode": {"max_replicas": 0}}, '"1"', 422, "body.decode.max_replicas"),
]


@pytest.mark.parametrize(
    ("body", "if_match", "status", "field"), [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
async def test_a_bad_change_is_refused_and_changes_nothing(make_api, body, if_match, status, field):
    api = await make_api()
    assert (await patch(api, {"sla": {"itl_ms": 40}}, '"0"')).status_code == 200
    before = (await get_settings(api)).json()
    assert_problem(await patch(api, body, if_match), status, field)
    assert (await get_settings(api)).json() == before


async def test_only_an_operator_changes_settings_and_each_change_is_audited(make_api):
    api = await make_api(tokens=TOKENS)
    assert (await get_settings(api, VIEWER)).status_code == 200
    assert_problem(await patch(api, {"sla": {"ttft_ms": 300}}, '"0"', VIEWER), 403)
    assert (await patch(api, {"sla": {"ttft_ms": 300}}, '"0"', OPER)).status_code == 200
    audit = (await api.client.get("/audit", headers=bearer(VIEWER))).json()
    assert [a["action"] for a in audit] == ["settings.change"]
    entry = audit[0]
    assert entry["actor_role"] == "operator" and entry["actor"].startswith("token:")
    assert entry["details"]["revision"] == 1
    assert entry["details"]["patch"] == {"sla": {"ttft_ms": 300}}
    assert (entry["details"]["before"]["sla"]["ttft_ms"], entry["details"]["after"]["sla"]["ttft_ms"]) == (
        500,
        300,
    )


async def test_changes_the_file_no_longer_accepts_are_shown_and_not_run(make_api):
    before = await make_api()
    assert (await patch(before, {"prefill": {"min_replicas": 6}}, '"0"')).status_code == 200
    # The deployments file changed since: its prefill maximum is now below the stored minimum.
    api = await make_api(demo_config(prefill={"min_replicas": 1, "max_replicas": 4}))
    shown = (await get_settings(api)).json()
    assert shown["revision"] == 1 and shown["overrides"] == {"prefill": {"min_replicas": 6}}
    assert shown["not_applied"] == "prefill.min_replicas: min_replicas (6) is above max_replicas (4)"
    assert shown["settings"]["prefill"] == {"min_replicas": 1, "max_replicas": 4}
    await tick(api)
    assert (await diagnostics(api))[-1]["record"]["bounds"]["prefill"] == {"min": 1, "max": 4}
    # Returning the field to the file's value repairs it.
    repaired = await patch(api, {"prefill": {"min_replicas": None}}, '"1"')
    assert repaired.status_code == 200 and repaired.json()["not_applied"] is None
