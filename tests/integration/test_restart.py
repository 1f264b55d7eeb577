"""Crash and restart: `planner serve` is killed with SIGKILL (no shutdown hooks) and a new process
starts on the same database and configuration. Nothing stored is lost, an unacknowledged decision
is still handed out by `wait`, and decision ids continue the sequence."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import PlannerProcess, demo_config, write_config

TOKENS = "viewer:viewer-token-1,orchestrator:orch-token-1,operator:oper-token-1"
VIEWER = {"Authorization": "Bearer viewer-token-1"}
ORCH = {"Authorization": "Bearer orch-token-1"}
OPER = {"Authorization": "Bearer oper-token-1"}
OPER_NAME = "token:" + hashlib.sha256(b"oper-token-1").hexdigest()[:10]


def log_tail(proc: PlannerProcess, lines: int = 60) -> str:
    if proc.log_path is None or not Path(proc.log_path).exists():
        return "(no log)"
    text = Path(proc.log_path).read_text(errors="replace").splitlines()
    return f"--- {proc.log_path} (last {lines} lines) ---\n" + "\n".join(text[-lines:])


def expect(resp: httpx.Response, status: int, proc: PlannerProcess) -> Any:
    assert resp.status_code == status, (
        f"{resp.request.method} {resp.request.url} -> {resp.status_code}, expected {status}: {resp.text}\n"
        + log_tail(proc)
    )
    return resp.json() if resp.content else None


def pin(client: httpx.Client, prefill: int, decode: int, reason: str, proc: PlannerProcess) -> dict[str, Any]:
    return expect(
        client.post(
            "/override",
            headers=OPER,
            json={
                "deployment": "demo",
                "action": "pin",
                "num_prefill": prefill,
                "num_decode": decode,
                "reason": reason,
            },
        ),
        201,
        proc,
    )


def snapshot(client: httpx.Client, proc: PlannerProcess) -> dict[str, Any]:
    """Everything the API shows about the stored state of `demo`."""
    return {
        "decisions": expect(
            client.get("/decisions", headers=VIEWER, params={"deployment": "demo"}), 200, proc
        ),
        "overrides": expect(
            client.get("/override", headers=VIEWER, params={"deployment": "demo", "include_inactive": True}),
            200,
            proc,
        ),
        "audit": expect(client.get("/audit", headers=VIEWER, params={"deployment": "demo"}), 200, proc),
    }


@pytest.fixture
def start_planner(db_url: str, tmp_path: Path) -> Iterator[Callable[[], PlannerProcess]]:
    """Start `planner serve` on this test's database (same config every time); all are stopped at teardown."""
    config = write_config(tmp_path / "planner.yaml", demo_config())
    procs: list[PlannerProcess] = []

    def start() -> PlannerProcess:
        proc = PlannerProcess(db_url, config, tokens=TOKENS, log_path=tmp_path / f"planner-{len(procs)}.log")
        procs.append(proc)
        try:
            return proc.start()
        except RuntimeError as exc:
            raise AssertionError(f"{exc}\n{log_tail(proc)}") from None

    try:
        yield start
    finally:
        for proc in procs:
            proc.stop()


def test_sigkill_with_an_unacknowledged_decision_loses_nothing(
    start_planner: Callable[[], PlannerProcess],
) -> None:
    first = start_planner()
    with httpx.Client(base_url=first.base_url, timeout=30) as client:
        created = pin(client, 3, 5, "before the crash", first)
        decision_1 = created["decision"]
        assert decision_1["id"] == 1
        assert decision_1["status"] == "pending"
        before = snapshot(client, first)
    assert [d["id"] for d in before["decisions"]["items"]] == [1]
    assert len(before["overrides"]) == 1
    assert len(before["audit"]) == 1

    first.kill()  # decision 1 is unacknowledged
    assert first.proc is not None and first.proc.returncode == -9

    second = start_planner()
    with httpx.Client(base_url=second.base_url, timeout=30) as client:
        # The orchestrator that saw nothing yet still gets decision 1, exactly as stored.
        again = expect(
            client.get(
                "/decisions/wait", headers=ORCH, params={"deployment": "demo", "after": 0, "timeout_s": 5}
            ),
            200,
            second,
        )
        assert again == decision_1
        assert again["status"] == "pending"
        assert again["created_at"] == decision_1["created_at"]
        assert again["reasons"] == [
            f"pin: pinned by override #1 ({OPER_NAME}): before the crash",
            "protocol: no decision awaits acknowledgement",
        ]
        # Everything stored before the crash reads back unchanged.
        assert snapshot(client, second) == before

        # The sequence continues: the next pin is decision 2 and supersedes the unacknowledged 1.
        created = pin(client, 4, 6, "after the crash", second)
        assert created["id"] == 2  # override ids continue too
        assert created["decision"]["id"] == 2
        assert created["decision_outcome"] == "create: override supersedes unacknowledged decision 1"
        one = expect(client.get("/decisions/1", headers=VIEWER), 200, second)
        assert one["status"] == "superseded"
        assert one["created_at"] == decision_1["created_at"]
        woken = expect(
            client.get(
                "/decisions/wait", headers=ORCH, params={"deployment": "demo", "after": 1, "timeout_s": 5}
            ),
            200,
            second,
        )
        assert woken["id"] == 2
        assert woken["status"] == "pending"

        after = snapshot(client, second)
        assert [(d["id"], d["status"]) for d in after["decisions"]["items"]] == [
            (1, "superseded"),
            (2, "pending"),
        ]
        assert [(o["id"], o["active"]) for o in after["overrides"]] == [(2, True), (1, False)]
        assert [(a["id"], a["action"], a["actor_role"]) for a in after["audit"]] == [
            (2, "override.pin", "operator"),
            (1, "override.pin", "operator"),
        ]
        # The orchestrator applies decision 2.
        expect(
            client.post(
                "/decisions/2/complete",
                headers=ORCH,
                json={"status": "succeeded", "observed": {"prefill": 4, "decode": 6}},
            ),
            200,
            second,
        )
        settled = snapshot(client, second)

    second.kill()  # a crash while nothing is pending

    third = start_planner()
    with httpx.Client(base_url=third.base_url, timeout=30) as client:
        assert snapshot(client, third) == settled
        # Decision 2 is acknowledged, so a waiter that saw it is held, then times out.
        r = client.get(
            "/decisions/wait", headers=ORCH, params={"deployment": "demo", "after": 2, "timeout_s": 0.3}
        )
        expect(r, 204, third)
        state = expect(client.get("/deployments/demo", headers=VIEWER), 200, third)
        assert state["ready"] == {"prefill": 4, "decode": 6}
        assert state["desired"] == {"prefill": 4, "decode": 6}

        created = pin(client, 2, 2, "after the second crash", third)
        assert created["id"] == 3
        assert created["decision"]["id"] == 3
        assert created["decision_outcome"] == "create: no decision awaits acknowledgement"
        three = expect(
            client.get(
                "/decisions/wait", headers=ORCH, params={"deployment": "demo", "after": 2, "timeout_s": 5}
            ),
            200,
            third,
        )
        assert three["id"] == 3
        assert (three["num_prefill"], three["num_decode"], three["status"]) == (2, 2, "pending")

        final = snapshot(client, third)
        assert [(d["id"], d["status"]) for d in final["decisions"]["items"]] == [
            (1, "superseded"),
            (2, "succeeded"),
            (3, "pending"),
        ]
        assert [(o["id"], o["active"]) for o in final["overrides"]] == [(3, True), (2, False), (1, False)]
        assert [a["id"] for a in final["audit"]] == [3, 2, 1]
