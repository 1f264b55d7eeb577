"""End to end over real HTTP: a `planner serve` subprocess on a free port, on SQLite and PostgreSQL.

An operator pins replicas, an orchestrator long-polls `GET /decisions/wait`, applies the decision
and acknowledges it; a later pin wakes a held waiter, and a pin made while a decision is still
unacknowledged supersedes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support import (
    OPER_NAME,
    ORCH,
    VIEWER,
    PlannerProcess,
    acknowledge,
    expect,
    held_wait,
    metric,
    next_decision,
    pin,
    planner_starter,
    poll,
)

# --- helpers ---------------------------------------------------------------------------------------


def waiters(client: httpx.Client) -> float:
    value = metric(client, "dynamo_planner_decision_waiters")
    if value is None:
        raise AssertionError(
            "dynamo_planner_decision_waiters missing from /metrics:\n" + client.get("/metrics").text
        )
    return value


def wait_for_waiters(client: httpx.Client, count: int, proc: PlannerProcess) -> None:
    """Poll /metrics until `count` long-poll requests are held (bounded; a wait, not a timing check)."""
    poll(lambda: waiters(client) == count, f"/metrics showing {count} held waiter(s)", proc)


@pytest.fixture
def start_planner(db_url: str, tmp_path: Path) -> Iterator[Callable[[], PlannerProcess]]:
    """Start `planner serve` on this test's database; every process is stopped at teardown."""
    with planner_starter(db_url, tmp_path) as start:
        yield start


# --- tests -----------------------------------------------------------------------------------------


def test_pin_wait_complete_reads_succeeded(start_planner: Callable[[], PlannerProcess]) -> None:
    proc = start_planner()
    with httpx.Client(base_url=proc.base_url, timeout=30) as client:
        created = pin(client, 3, 5, "e2e: load test", proc)
        assert created["id"] == 1
        assert created["action"] == "pin"
        assert created["params"] == {"prefill": 3, "decode": 5}
        assert created["created_by"] == OPER_NAME
        assert created["active"] is True
        assert created["decision_outcome"] == "create: no decision awaits acknowledgement"
        assert created["decision"]["id"] == 1

        decision = next_decision(client, 0, proc)
        assert decision == {
            "id": 1,
            "deployment": "demo",
            "num_prefill": 3,
            "num_decode": 5,
            "num_workers": None,
            "source": "override",
            "reasons": [
                f"pin: pinned by override #1 ({OPER_NAME}): e2e: load test",
                "protocol: no decision awaits acknowledgement",
            ],
            "created_at": created["decision"]["created_at"],
            "status": "pending",
            "status_reason": None,
            "completed_at": None,
            "observed": None,
            "message": None,
            "remove": None,
            "tick_id": None,
            "override_id": 1,
        }

        done = acknowledge(client, 1, 3, 5, proc)
        assert done["status"] == "succeeded"
        assert done["observed"] == {"prefill": 3, "decode": 5}
        assert done["completed_at"] is not None

        read = expect(client.get("/decisions/1", headers=VIEWER), 200, proc)
        assert read["status"] == "succeeded"
        assert read["completed_at"] == done["completed_at"]
        assert read["observed"] == {"prefill": 3, "decode": 5}
        assert read["created_at"] == created["decision"]["created_at"]

        # Acknowledging again is harmless and changes nothing.
        again = acknowledge(client, 1, 3, 5, proc)
        assert again == read

        state = expect(client.get("/deployments/demo", headers=VIEWER), 200, proc)
        assert state["ready"] == {"prefill": 3, "decode": 5}
        assert state["desired"] == {"prefill": 3, "decode": 5}
        assert state["last_decision"] == read

        listed = expect(client.get("/decisions", headers=VIEWER, params={"deployment": "demo"}), 200, proc)
        assert listed == {"items": [read], "next_cursor": None}


def test_waiter_is_woken_by_a_pin_and_a_later_pin_supersedes(
    start_planner: Callable[[], PlannerProcess],
) -> None:
    proc = start_planner()
    with httpx.Client(base_url=proc.base_url, timeout=30) as client, ThreadPoolExecutor(1) as pool:
        pin(client, 3, 5, "first", proc)
        acknowledge(client, 1, 3, 5, proc)

        # An orchestrator that has seen decision 1 waits for the next one.
        held = held_wait(pool, proc, 1, 30)
        wait_for_waiters(client, 1, proc)
        assert not held.done()
        second = pin(client, 4, 6, "second", proc)
        woken = expect(held.result(timeout=60), 200, proc)
        assert woken["id"] == 2
        assert (woken["num_prefill"], woken["num_decode"]) == (4, 6)
        assert woken["status"] == "pending"
        assert woken["source"] == "override"
        assert woken["created_at"] == second["decision"]["created_at"]
        assert waiters(client) == 0

        # A third pin while decision 2 is unacknowledged supersedes it at once.
        third = pin(client, 5, 7, "third", proc)
        assert third["decision_outcome"] == "create: override supersedes unacknowledged decision 2"
        assert third["decision"]["id"] == 3

        two = expect(client.get("/decisions/2", headers=VIEWER), 200, proc)
        assert two["status"] == "superseded"
        assert two["status_reason"] == "replaced by decision 3: override supersedes unacknowledged decision 2"
        assert two["completed_at"] is None
        three = expect(client.get("/decisions/3", headers=VIEWER), 200, proc)
        assert three["status"] == "pending"
        assert (three["num_prefill"], three["num_decode"]) == (5, 7)

        latest = next_decision(client, 2, proc, timeout_s=30)
        assert latest == three
        # A stale orchestrator that saw nothing yet also gets the latest decision, not decision 1.
        from_zero = next_decision(client, 0, proc)
        assert from_zero == three

        # Acknowledging the superseded decision is refused (409) and leaves it superseded.
        expect(client.post("/decisions/2/complete", headers=ORCH, json={"status": "succeeded"}), 409, proc)
        assert expect(client.get("/decisions/2", headers=VIEWER), 200, proc)["status"] == "superseded"

        listed = expect(client.get("/decisions", headers=VIEWER, params={"deployment": "demo"}), 200, proc)
        assert [(d["id"], d["status"]) for d in listed["items"]] == [
            (1, "succeeded"),
            (2, "superseded"),
            (3, "pending"),
        ]
        overrides = expect(
            client.get("/override", headers=VIEWER, params={"deployment": "demo", "include_inactive": True}),
            200,
            proc,
        )
        assert [(o["id"], o["active"]) for o in overrides] == [(3, True), (2, False), (1, False)]


def test_waiter_times_out_with_204(start_planner: Callable[[], PlannerProcess]) -> None:
    proc = start_planner()
    with httpx.Client(base_url=proc.base_url, timeout=30) as client:
        # Nothing decided yet.
        r = client.get(
            "/decisions/wait", headers=ORCH, params={"deployment": "demo", "after": 0, "timeout_s": 0.3}
        )
        expect(r, 204, proc)
        assert r.content == b""

        # Nothing newer than the decision already seen.
        pin(client, 2, 2, "only one", proc)
        r = client.get(
            "/decisions/wait", headers=ORCH, params={"deployment": "demo", "after": 1, "timeout_s": 0.3}
        )
        expect(r, 204, proc)
        assert r.content == b""
        assert waiters(client) == 0
