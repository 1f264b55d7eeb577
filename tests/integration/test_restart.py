"""Crash and restart: `planner serve` is killed with SIGKILL (no shutdown hooks) and a new process
starts on the same database and configuration. Nothing stored is lost, an unacknowledged decision
is still handed out by `wait`, and decision ids continue the sequence."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import (
    OPER_NAME,
    ORCH,
    VIEWER,
    PlannerProcess,
    acknowledge,
    expect,
    next_decision,
    pin,
    planner_starter,
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
    with planner_starter(db_url, tmp_path) as start:
        yield start


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
        again = next_decision(client, 0, second, timeout_s=5)
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
        woken = next_decision(client, 1, second, timeout_s=5)
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
        acknowledge(client, 2, 4, 6, second)
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
        three = next_decision(client, 2, third, timeout_s=5)
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
