"""Bearer tokens and roles: viewer < orchestrator < operator; health endpoints are public."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.helpers import OPER, ORCH, TOKENS, VIEWER, assert_problem, bearer

pytestmark = pytest.mark.anyio

RANK = {"viewer": 1, "orchestrator": 2, "operator": 3}
TOKEN_OF = {
    "none": None,
    "unknown": "not-a-configured-token",
    "viewer": VIEWER,
    "orchestrator": ORCH,
    "operator": OPER,
}

PIN = {"deployment": "demo", "action": "pin", "num_prefill": 2, "num_decode": 2, "reason": "auth test"}

# (name, method, path, query, json body, role needed or None for public, status when allowed)
ENDPOINTS: list[tuple[str, str, str, dict[str, Any] | None, dict[str, Any] | None, str | None, int]] = [
    ("healthz", "GET", "/healthz", None, None, None, 200),
    # workers do not run in these in-process tests, so readiness reports 503 (with reasons)
    ("readyz", "GET", "/readyz", None, None, None, 503),
    ("metrics", "GET", "/metrics", None, None, None, 200),
    ("list-deployments", "GET", "/deployments", None, None, "viewer", 200),
    ("get-deployment", "GET", "/deployments/demo", None, None, "viewer", 200),
    ("list-decisions", "GET", "/decisions", None, None, "viewer", 200),
    ("get-decision", "GET", "/decisions/1", None, None, "viewer", 200),
    (
        "wait",
        "GET",
        "/decisions/wait",
        {"deployment": "demo", "after": 1, "timeout_s": 0},
        None,
        "orchestrator",
        204,
    ),
    ("complete", "POST", "/decisions/1/complete", None, {"status": "succeeded"}, "orchestrator", 200),
    ("diagnostics", "GET", "/diagnostics", None, None, "viewer", 200),
    ("list-overrides", "GET", "/override", None, None, "viewer", 200),
    ("audit", "GET", "/audit", None, None, "viewer", 200),
    ("create-override", "POST", "/override", None, PIN, "operator", 201),
    ("delete-override", "DELETE", "/override/1", None, None, "operator", 200),
]


def _cases():
    for name, method, path, query, body, role, ok in ENDPOINTS:
        for who, token in TOKEN_OF.items():
            if role is None:
                expected = ok
            elif token is None or who == "unknown":
                expected = 401
            elif RANK[who] < RANK[role]:
                expected = 403
            else:
                expected = ok
            yield pytest.param(
                method, path, query, body, token, expected, role is None, id=f"{name}-{who}-{expected}"
            )


@pytest.mark.parametrize(("method", "path", "query", "body", "token", "expected", "public"), list(_cases()))
async def test_roles(make_api, method, path, query, body, token, expected, public):
    api = await make_api(tokens=TOKENS)
    # one pending decision 1 and one override 1 to read, wait past, complete and delete
    setup = await api.client.post("/override", json={**PIN, "num_prefill": 3}, headers=bearer(OPER))
    assert setup.status_code == 201, setup.text

    r = await api.client.request(method, path, params=query, json=body, headers=bearer(token))
    if public:
        assert r.status_code == expected, r.text
        if path == "/readyz":
            assert r.json()["deployments"] == {"demo": ["worker loop is not running"]}
    elif expected >= 400:
        body_ = assert_problem(r, expected)
        if expected == 401:
            assert r.headers["www-authenticate"] == "Bearer"
        if expected == 403:
            assert "role" in body_["detail"]
        # nothing changed
        decision = (await api.client.get("/decisions/1", headers=bearer(VIEWER))).json()
        assert (decision["status"], decision["num_prefill"]) == ("pending", 3)
        overrides = (await api.client.get("/override", headers=bearer(VIEWER))).json()
        assert [o["id"] for o in overrides] == [1]
    else:
        assert r.status_code == expected, r.text


async def test_wait_by_orchestrator_returns_the_decision(make_api):
    api = await make_api(tokens=TOKENS)
    await api.client.post("/override", json=PIN, headers=bearer(OPER))
    r = await api.client.get("/decisions/wait", params={"after": 0, "timeout_s": 1}, headers=bearer(ORCH))
    assert r.status_code == 200, r.text
    assert r.json()["id"] == 1


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"Authorization": "Basic dXNlcjpwYXNz"}, id="basic-scheme"),
        pytest.param({"Authorization": "Bearer"}, id="bearer-without-token"),
        pytest.param({"Authorization": OPER}, id="token-without-scheme"),
        pytest.param({"Authorization": f"Bearer {OPER}x"}, id="token-with-suffix"),
    ],
)
async def test_malformed_authorization_is_401(make_api, headers):
    api = await make_api(tokens=TOKENS)
    r = await api.client.post("/override", json=PIN, headers=headers)
    assert_problem(r, 401)
    assert r.headers["www-authenticate"] == "Bearer"


async def test_without_tokens_loopback_acts_as_operator(make_api):
    api = await make_api()
    r = await api.client.post("/override", json=PIN)
    assert r.status_code == 201, r.text
    assert r.json()["created_by"] == "loopback"
