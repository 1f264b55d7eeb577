"""Small helpers shared by the in-process API tests (plain functions, no fixtures)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import httpx

from tests.conftest import Api
from tests.support import demo_config

TOKENS = "viewer:viewer-token-1,orchestrator:orch-token-1,operator:oper-token-1"
VIEWER, ORCH, OPER = "viewer-token-1", "orch-token-1", "oper-token-1"
PROBLEM_KEYS = {"type", "title", "status", "detail"}


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def two_deployments() -> dict[str, Any]:
    config = demo_config()
    other = copy.deepcopy(config["deployments"][0])
    other["name"] = "other"
    config["deployments"].append(other)
    return config


def assert_problem(r: httpx.Response, status: int, field: str | None = None) -> dict[str, Any]:
    """A problem document with this status; `field`, if given, is named in detail or errors[].field."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers["content-type"]
    body = r.json()
    assert PROBLEM_KEYS <= body.keys(), body
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["type"], str) and body["type"]
    assert isinstance(body["detail"], str) and body["detail"]
    if field is not None:
        fields = [e.get("field", "") for e in body.get("errors") or []]
        assert field in body["detail"] or any(field in f for f in fields), body
    return body


async def pin(
    api: Api, prefill: int | None = 3, decode: int | None = 5, *, token: str | None = None, **extra: Any
) -> httpx.Response:
    body: dict[str, Any] = {"deployment": "demo", "action": "pin", "reason": "test pin"}
    if prefill is not None:
        body["num_prefill"] = prefill
    if decode is not None:
        body["num_decode"] = decode
    body.update(extra)
    return await api.client.post("/override", json=body, headers=bearer(token))


async def override(api: Api, action: str, *, token: str | None = None, **fields: Any) -> httpx.Response:
    body: dict[str, Any] = {"deployment": "demo", "action": action, "reason": f"test {action}", **fields}
    return await api.client.post("/override", json=body, headers=bearer(token))


async def complete(
    api: Api,
    decision_id: int,
    status: str = "succeeded",
    *,
    token: str | None = None,
    deployment: str | None = None,
    **extra: Any,
) -> httpx.Response:
    return await api.client.post(
        f"/decisions/{decision_id}/complete",
        json={"status": status, **extra},
        headers=bearer(token),
        params={"deployment": deployment} if deployment else None,
    )


async def get_decision(api: Api, decision_id: int, **params: Any) -> dict[str, Any]:
    r = await api.client.get(f"/decisions/{decision_id}", params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def tick(api: Api, deployment: str = "demo"):  # type: ignore[no-untyped-def]
    return await asyncio.to_thread(api.app.state.workers[deployment].tick, api.clock.now())


async def diagnostics(api: Api, **params: Any) -> list[dict[str, Any]]:
    r = await api.client.get("/diagnostics", params=params)
    assert r.status_code == 200, r.text
    return r.json()["items"]
