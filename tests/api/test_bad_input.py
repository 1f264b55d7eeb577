"""Bad input to every endpoint that takes input: always a 4xx problem document naming the field,
never a 500."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.helpers import OPER, TOKENS, VIEWER, assert_problem, bearer

pytestmark = pytest.mark.anyio

PIN = {"deployment": "demo", "action": "pin", "num_prefill": 3, "num_decode": 5, "reason": "bad input test"}
HUGE = 2**63


def pin_with(**changes: Any) -> dict[str, Any]:
    body = {**PIN, **changes}
    return {k: v for k, v in body.items() if v is not None}


class Case:
    def __init__(
        self,
        name: str,
        method: str,
        path: str,
        status: int,
        field: str | None,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        content: bytes | None = None,
        token: str | None = OPER,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.name, self.method, self.path, self.status, self.field = name, method, path, status, field
        self.params, self.json, self.content, self.token, self.headers = params, json, content, token, headers

    def param(self):  # type: ignore[no-untyped-def]
        return pytest.param(self, id=self.name)


COMPLETE = "/decisions/1/complete"
REPORT = "/diagnostics/report"
CASES = [
    # --- POST /override ---
    Case("override-malformed-json", "POST", "/override", 422, "body", content=b'{"deployment": "demo",'),
    Case("override-not-json", "POST", "/override", 422, "body", content=b"action=pin"),
    # Bytes that are not text at all cannot reach the JSON parser: 400, still naming the body.
    Case("override-not-utf8", "POST", "/override", 400, "body", content=b'{"reason": "\xff\xfe"}'),
    Case("override-empty-body", "POST", "/override", 422, "body", content=b""),
    Case("override-null-body", "POST", "/override", 422, "body", content=b"null"),
    Case("override-list-body", "POST", "/override", 422, "body", json=[PIN]),
    Case(
        "override-num_prefill-string",
        "POST",
        "/override",
        422,
        "num_prefill",
        json=pin_with(num_prefill="three"),
    ),
    Case(
        "override-num_prefill-float", "POST", "/override", 422, "num_prefill", json=pin_with(num_prefill=2.5)
    ),
    Case(
        "override-num_prefill-negative",
        "POST",
        "/override",
        422,
        "num_prefill",
        json=pin_with(num_prefill=-1),
    ),
    Case(
        "override-num_decode-negative", "POST", "/override", 422, "num_decode", json=pin_with(num_decode=-3)
    ),
    Case(
        "override-num_prefill-huge", "POST", "/override", 422, "num_prefill", json=pin_with(num_prefill=HUGE)
    ),
    Case(
        "override-num_prefill-above-max",
        "POST",
        "/override",
        422,
        "num_prefill",
        json=pin_with(num_prefill=9),
    ),
    Case(
        "override-unknown-field",
        "POST",
        "/override",
        422,
        "num_prefil",
        json={**pin_with(num_prefill=None), "num_prefil": 3},
    ),
    Case("override-unknown-action", "POST", "/override", 422, "action", json=pin_with(action="scale")),
    Case("override-missing-action", "POST", "/override", 422, "action", json=pin_with(action=None)),
    Case("override-missing-reason", "POST", "/override", 422, "reason", json=pin_with(reason=None)),
    Case("override-empty-reason", "POST", "/override", 422, "reason", json=pin_with(reason="")),
    Case(
        "override-missing-deployment", "POST", "/override", 422, "deployment", json=pin_with(deployment=None)
    ),
    Case(
        "override-unknown-deployment",
        "POST",
        "/override",
        404,
        "deployment",
        json=pin_with(deployment="nope"),
    ),
    Case(
        "override-deployment-too-long",
        "POST",
        "/override",
        422,
        "deployment",
        json=pin_with(deployment="d" * 64),
    ),
    Case("override-expires-zero", "POST", "/override", 422, "expires_in_s", json=pin_with(expires_in_s=0)),
    Case(
        "override-expires-negative", "POST", "/override", 422, "expires_in_s", json=pin_with(expires_in_s=-5)
    ),
    Case(
        "override-expires-string",
        "POST",
        "/override",
        422,
        "expires_in_s",
        json=pin_with(expires_in_s="soon"),
    ),
    Case(
        "override-expires-too-far",
        "POST",
        "/override",
        422,
        "expires_in_s",
        json=pin_with(expires_in_s=10**9),
    ),
    Case(
        "override-bounds-negative",
        "POST",
        "/override",
        422,
        "min_prefill",
        json={"deployment": "demo", "action": "bounds", "min_prefill": -1, "reason": "x"},
    ),
    Case(
        "override-bounds-unknown-field",
        "POST",
        "/override",
        422,
        "max_prefil",
        json={"deployment": "demo", "action": "bounds", "max_prefil": 2, "reason": "x"},
    ),
    Case(
        "override-pause-with-replicas",
        "POST",
        "/override",
        422,
        "num_prefill",
        json={"deployment": "demo", "action": "pause", "num_prefill": 2, "reason": "x"},
    ),
    Case("override-no-token", "POST", "/override", 401, None, json=PIN, token=None),
    Case("override-unknown-token", "POST", "/override", 401, None, json=PIN, token="wrong-token-123"),
    Case("override-viewer-token", "POST", "/override", 403, None, json=PIN, token=VIEWER),
    # --- POST /decisions/{id}/complete ---
    Case("complete-malformed-json", "POST", COMPLETE, 422, "body", content=b'{"status": '),
    Case("complete-empty-body", "POST", COMPLETE, 422, "body", content=b""),
    Case("complete-missing-status", "POST", COMPLETE, 422, "status", json={"message": "x"}),
    Case("complete-status-done", "POST", COMPLETE, 422, "status", json={"status": "done"}),
    Case("complete-status-pending", "POST", COMPLETE, 422, "status", json={"status": "pending"}),
    Case(
        "complete-observed-negative",
        "POST",
        COMPLETE,
        422,
        "prefill",
        json={"status": "succeeded", "observed": {"prefill": -1, "decode": 5}},
    ),
    Case(
        "complete-observed-string",
        "POST",
        COMPLETE,
        422,
        "decode",
        json={"status": "succeeded", "observed": {"prefill": 3, "decode": "five"}},
    ),
    Case(
        "complete-observed-unknown-role",
        "POST",
        COMPLETE,
        422,
        "gpus",
        json={"status": "succeeded", "observed": {"gpus": 3}},
    ),
    Case(
        "complete-observed-role-not-in-mode",
        "POST",
        COMPLETE,
        422,
        "body.observed.workers",
        json={"status": "succeeded", "observed": {"workers": 3}},
    ),
    Case(
        "complete-observed-not-object",
        "POST",
        COMPLETE,
        422,
        "observed",
        json={"status": "succeeded", "observed": 3},
    ),
    Case(
        "complete-unknown-field", "POST", COMPLETE, 422, "state", json={"status": "succeeded", "state": "ok"}
    ),
    Case(
        "complete-message-too-long",
        "POST",
        COMPLETE,
        422,
        "message",
        json={"status": "failed", "message": "m" * 4001},
    ),
    Case("complete-id-zero", "POST", "/decisions/0/complete", 422, "id", json={"status": "succeeded"}),
    Case("complete-id-abc", "POST", "/decisions/abc/complete", 422, "id", json={"status": "succeeded"}),
    Case("complete-id-negative", "POST", "/decisions/-1/complete", 422, "id", json={"status": "succeeded"}),
    Case("complete-id-huge", "POST", f"/decisions/{HUGE}/complete", 422, "id", json={"status": "succeeded"}),
    Case("complete-unknown-id", "POST", "/decisions/99/complete", 404, "id", json={"status": "succeeded"}),
    Case(
        "complete-unknown-deployment",
        "POST",
        COMPLETE,
        404,
        "deployment",
        params={"deployment": "nope"},
        json={"status": "succeeded"},
    ),
    Case("complete-no-token", "POST", COMPLETE, 401, None, json={"status": "succeeded"}, token=None),
    Case("complete-viewer-token", "POST", COMPLETE, 403, None, json={"status": "succeeded"}, token=VIEWER),
    # --- GET /decisions ---
    Case("list-after-negative", "GET", "/decisions", 422, "after", params={"after": -1}),
    Case("list-after-abc", "GET", "/decisions", 422, "after", params={"after": "abc"}),
    Case("list-after-huge", "GET", "/decisions", 422, "after", params={"after": HUGE}),
    Case("list-limit-zero", "GET", "/decisions", 422, "limit", params={"limit": 0}),
    Case("list-limit-too-big", "GET", "/decisions", 422, "limit", params={"limit": 1001}),
    Case("list-cursor-negative", "GET", "/decisions", 422, "cursor", params={"cursor": -1}),
    Case("list-cursor-huge", "GET", "/decisions", 422, "cursor", params={"cursor": HUGE}),
    Case("list-status-done", "GET", "/decisions", 422, "status", params={"status": "done"}),
    Case("list-unknown-deployment", "GET", "/decisions", 404, "deployment", params={"deployment": "nope"}),
    Case("list-no-token", "GET", "/decisions", 401, None, token=None),
    # --- GET /decisions/{id} ---
    Case("get-id-zero", "GET", "/decisions/0", 422, "id"),
    Case("get-id-abc", "GET", "/decisions/abc", 422, "id"),
    Case("get-id-huge", "GET", f"/decisions/{HUGE}", 422, "id"),
    Case("get-unknown-id", "GET", "/decisions/99", 404, "id"),
    Case("get-unknown-deployment", "GET", "/decisions/1", 404, "deployment", params={"deployment": "nope"}),
    # --- GET /decisions/wait ---
    Case("wait-timeout-abc", "GET", "/decisions/wait", 422, "timeout_s", params={"timeout_s": "abc"}),
    Case("wait-timeout-301", "GET", "/decisions/wait", 422, "timeout_s", params={"timeout_s": 301}),
    Case("wait-timeout-negative", "GET", "/decisions/wait", 422, "timeout_s", params={"timeout_s": -1}),
    Case("wait-timeout-nan", "GET", "/decisions/wait", 422, "timeout_s", params={"timeout_s": "nan"}),
    Case("wait-after-negative", "GET", "/decisions/wait", 422, "after", params={"after": -1}),
    Case("wait-after-abc", "GET", "/decisions/wait", 422, "after", params={"after": "abc"}),
    Case(
        "wait-unknown-deployment",
        "GET",
        "/decisions/wait",
        404,
        "deployment",
        params={"deployment": "nope", "timeout_s": 0},
    ),
    Case("wait-no-token", "GET", "/decisions/wait", 401, None, params={"timeout_s": 0}, token=None),
    Case("wait-viewer-token", "GET", "/decisions/wait", 403, None, params={"timeout_s": 0}, token=VIEWER),
    # --- GET /diagnostics ---
    Case("diagnostics-since-yesterday", "GET", "/diagnostics", 422, "since", params={"since": "yesterday"}),
    Case(
        "diagnostics-since-no-timezone",
        "GET",
        "/diagnostics",
        422,
        "since",
        params={"since": "2026-11-29T12:00:00"},
    ),
    Case(
        "diagnostics-until-no-timezone",
        "GET",
        "/diagnostics",
        422,
        "until",
        params={"until": "2026-11-29T12:00:00"},
    ),
    Case(
        "diagnostics-until-before-since",
        "GET",
        "/diagnostics",
        422,
        "until",
        params={"since": "2026-11-29T12:00:00Z", "until": "2026-11-29T11:00:00Z"},
    ),
    Case("diagnostics-limit-zero", "GET", "/diagnostics", 422, "limit", params={"limit": 0}),
    Case("diagnostics-cursor-negative", "GET", "/diagnostics", 422, "cursor", params={"cursor": -1}),
    Case("diagnostics-cursor-huge", "GET", "/diagnostics", 422, "cursor", params={"cursor": HUGE}),
    Case(
        "diagnostics-unknown-deployment",
        "GET",
        "/diagnostics",
        404,
        "deployment",
        params={"deployment": "nope"},
    ),
    Case("diagnostics-no-token", "GET", "/diagnostics", 401, None, token=None),
    # --- GET /diagnostics/report ---
    Case("report-since-yesterday", "GET", REPORT, 422, "since", params={"since": "yesterday"}),
    Case("report-since-no-timezone", "GET", REPORT, 422, "since", params={"since": "2026-11-29T12:00:00"}),
    Case("report-until-no-timezone", "GET", REPORT, 422, "until", params={"until": "2026-11-29T12:00:00"}),
    Case(
        "report-until-before-since",
        "GET",
        REPORT,
        422,
        "until",
        params={"since": "2026-11-29T12:00:00Z", "until": "2026-11-29T11:00:00Z"},
    ),
    Case("report-unknown-deployment", "GET", REPORT, 404, "deployment", params={"deployment": "nope"}),
    Case("report-deployment-too-long", "GET", REPORT, 422, "deployment", params={"deployment": "d" * 64}),
    Case("report-no-token", "GET", REPORT, 401, None, token=None),
    Case("report-unknown-token", "GET", REPORT, 401, None, token="wrong-token-123"),
    # --- GET /override, DELETE /override/{id}, GET /audit, GET /deployments/{name} ---
    Case(
        "list-overrides-include-inactive-maybe",
        "GET",
        "/override",
        422,
        "include_inactive",
        params={"include_inactive": "maybe"},
    ),
    Case(
        "list-overrides-unknown-deployment",
        "GET",
        "/override",
        404,
        "deployment",
        params={"deployment": "nope"},
    ),
    Case("delete-override-id-zero", "DELETE", "/override/0", 422, "id"),
    Case("delete-override-id-abc", "DELETE", "/override/abc", 422, "id"),
    Case("delete-override-unknown", "DELETE", "/override/99", 404, "id"),
    Case("delete-override-viewer-token", "DELETE", "/override/1", 403, None, token=VIEWER),
    Case("audit-limit-zero", "GET", "/audit", 422, "limit", params={"limit": 0}),
    Case("audit-unknown-deployment", "GET", "/audit", 404, "deployment", params={"deployment": "nope"}),
    Case("deployment-unknown", "GET", "/deployments/nope", 404, "name"),
    Case("deployment-name-too-long", "GET", "/deployments/" + "d" * 64, 422, "name"),
    Case("deployments-no-token", "GET", "/deployments", 401, None, token=None),
]


async def _api_with_a_decision(make_api):  # type: ignore[no-untyped-def]
    api = await make_api(tokens=TOKENS)
    r = await api.client.post("/override", json=PIN, headers=bearer(OPER))
    assert r.status_code == 201, r.text
    return api


@pytest.mark.parametrize("case", [c.param() for c in CASES])
async def test_bad_input(make_api, case: Case):
    api = await _api_with_a_decision(make_api)
    headers = {**bearer(case.token), **(case.headers or {})}
    if case.content is not None:
        headers["Content-Type"] = "application/json"
    r = await api.client.request(
        case.method, case.path, params=case.params, json=case.json, content=case.content, headers=headers
    )
    assert r.status_code < 500, r.text
    assert_problem(r, case.status, case.field)
    # bad input changes nothing: still one pending decision and one override
    decisions = (await api.client.get("/decisions", headers=bearer(OPER))).json()["items"]
    assert [(d["id"], d["status"]) for d in decisions] == [(1, "pending")]
    overrides = (
        await api.client.get("/override", params={"include_inactive": "true"}, headers=bearer(OPER))
    ).json()
    assert [o["id"] for o in overrides] == [1]


def test_case_names_are_unique():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))


# Input that the schema lets through but a backend may choke on: never a 500, whatever the answer.
NEVER_500 = [
    pytest.param(
        "POST", "/override", {"json": pin_with(num_prefill=4, reason="bad\u0000reason")}, id="nul-in-reason"
    ),
    pytest.param(
        "POST", COMPLETE, {"json": {"status": "failed", "message": "bad\u0000message"}}, id="nul-in-message"
    ),
    pytest.param("GET", "/decisions", {"params": {"deployment": "demo\u0000"}}, id="nul-in-deployment"),
    pytest.param(
        "GET", "/diagnostics", {"params": {"since": "0001-01-01T00:00:00+14:00"}}, id="since-year-1"
    ),
    pytest.param(
        "GET", "/diagnostics", {"params": {"until": "9999-12-31T23:59:59-14:00"}}, id="until-year-9999"
    ),
    pytest.param("GET", REPORT, {"params": {"since": "0001-01-01T00:00:00+14:00"}}, id="report-since-year-1"),
    pytest.param(
        "GET", REPORT, {"params": {"until": "9999-12-31T23:59:59-14:00"}}, id="report-until-year-9999"
    ),
    pytest.param("GET", REPORT, {"params": {"deployment": "demo\u0000"}}, id="report-nul-in-deployment"),
]


@pytest.mark.parametrize(("method", "path", "kwargs"), NEVER_500)
async def test_odd_input_never_500(make_api, method, path, kwargs):
    api = await _api_with_a_decision(make_api)
    r = await api.client.request(method, path, headers=bearer(OPER), **kwargs)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert_problem(r, r.status_code)
