"""End to end over real HTTP: a `planner serve` subprocess on a free port, on SQLite and PostgreSQL.

An operator pins replicas, an orchestrator long-polls `GET /decisions/wait`, applies the decision
and acknowledges it; a later pin wakes a held waiter, and a pin made while a decision is still
unacknowledged supersedes it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import PlannerProcess, demo_config, write_config

TOKENS = "viewer:viewer-token-1,orchestrator:orch-token-1,operator:oper-token-1"
VIEWER = {"Authorization": "Bearer viewer-token-1"}
ORCH = {"Authorization": "Bearer orch-token-1"}
OPER = {"Authorization": "Bearer oper-token-1"}
# How the audit log and the pin reasons name the operator token (a fingerprint, not the token).
OPER_NAME = "token:" + hashlib.sha256(b"oper-token-1").hexdigest()[:10]


# --- helpers ---------------------------------------------------------------------------------------


def log_tail(proc: PlannerProcess, lines: int = 60) -> str:
    if proc.log_path is None or not Path(proc.log_path).exists():
        return "(no log)"
    text = Path(proc.log_path).read_text(errors="replace").splitlines()
    return f"--- {proc.log_path} (last {lines} lines) ---\n" + "\n".join(text[-lines:])


def expect(resp: httpx.Response, status: int, proc: PlannerProcess) -> Any:
    """The JSON body of a response that must have `status`; otherwise fail with the server log."""
    assert resp.status_code == status, (
        f"{resp.request.method} {resp.request.url} -> {resp.status_code}, expected {status}: {resp.text}\n"
        + log_tail(proc)
    )
    return resp.json() if resp.content else None


def waiters(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    for line in text.splitlines():
        if line.startswith("dynamo_planner_decision_waiters "):
            return float(line.split()[1])
    raise AssertionError("dynamo_planner_decision_waiters missing from /metrics:\n" + text)


def wait_for_waiters(client: httpx.Client, count: int, proc: PlannerProcess) -> None:
    """Poll /metrics until `count` long-poll requests are held (bounded; a wait, not a timing check)."""
    for _ in range(400):
        if waiters(client) == count:
            return
        time.sleep(0.025)
    raise AssertionError(f"/metrics never showed {count} held waiter(s)\n" + log_tail(proc))


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


@pytest.fixture
def start_planner(db_url: str, tmp_path: Path) -> Iterator[Callable[[], PlannerProcess]]:
    """Start `planner serve` on this test's database; every process is stopped at teardown."""
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

        decision = expect(
            client.get("/decisions/wait", headers=ORCH, params={"deployment": "demo", "after": 0}), 200, proc
        )
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
            "tick_id": None,
            "override_id": 1,
        }

        ack = {"status": "succeeded", "observed": {"prefill": 3, "decode": 5}}
        done = expect(client.post("/decisions/1/complete", headers=ORCH, json=ack), 200, proc)
        assert done["status"] == "succeeded"
        assert done["observed"] == {"prefill": 3, "decode": 5}
        assert done["completed_at"] is not None

        read = expect(client.get("/decisions/1", headers=VIEWER), 200, proc)
        assert read["status"] == "succeeded"
        assert read["completed_at"] == done["completed_at"]
        assert read["observed"] == {"prefill": 3, "decode": 5}
        assert read["created_at"] == created["decision"]["created_at"]

        # Acknowledging again is harmless and changes nothing.
        again = expect(client.post("/decisions/1/complete", headers=ORCH, json=ack), 200, proc)
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
        expect(
            client.post(
                "/decisions/1/complete",
                headers=ORCH,
                json={"status": "succeeded", "observed": {"prefill": 3, "decode": 5}},
            ),
            200,
            proc,
        )

        # An orchestrator that has seen decision 1 waits for the next one.
        held = pool.submit(
            httpx.get,
            f"{proc.base_url}/decisions/wait",
            headers=ORCH,
            params={"deployment": "demo", "after": 1, "timeout_s": 30},
            timeout=60,
        )
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
        assert two["status_reason"] == "override supersedes unacknowledged decision 2"
        assert two["completed_at"] is None
        three = expect(client.get("/decisions/3", headers=VIEWER), 200, proc)
        assert three["status"] == "pending"
        assert (three["num_prefill"], three["num_decode"]) == (5, 7)

        latest = expect(
            client.get(
                "/decisions/wait", headers=ORCH, params={"deployment": "demo", "after": 2, "timeout_s": 30}
            ),
            200,
            proc,
        )
        assert latest == three
        # A stale orchestrator that saw nothing yet also gets the latest decision, not decision 1.
        from_zero = expect(
            client.get("/decisions/wait", headers=ORCH, params={"deployment": "demo", "after": 0}), 200, proc
        )
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
