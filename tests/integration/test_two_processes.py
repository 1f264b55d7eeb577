"""Two `planner serve` processes on one PostgreSQL database (PostgreSQL only).

A pin made through one process wakes a long-poll waiter held by the other (LISTEN/NOTIFY), only
one of them runs the deployment's worker (the lease), and both may start at once on a database
that is not migrated yet.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text

from app.store.db import alembic_config
from tests.support import (
    TOKENS,
    VIEWER,
    PlannerProcess,
    PostgresDatabases,
    acknowledge,
    demo_config,
    expect,
    held_wait,
    logs,
    metric,
    next_decision,
    pin,
    poll,
    start_or_fail,
    write_config,
)

pytestmark = pytest.mark.postgres


@pytest.fixture
def planners(pg_dbs: PostgresDatabases, tmp_path: Path) -> Iterator[Callable[..., list[PlannerProcess]]]:
    """Make PlannerProcess objects (not started) on one fresh database; all are stopped at teardown."""
    config = write_config(tmp_path / "planner.yaml", demo_config())
    procs: list[PlannerProcess] = []
    urls: list[str] = []

    def make(count: int, *, migrated: bool = True) -> list[PlannerProcess]:
        url = pg_dbs.fresh(migrated=migrated)
        urls.append(url)
        made = [
            PlannerProcess(url, config, tokens=TOKENS, log_path=tmp_path / f"planner-{len(procs) + i}.log")
            for i in range(count)
        ]
        procs.extend(made)
        return made

    try:
        yield make
    finally:
        for proc in procs:
            proc.stop()
        for url in urls:
            pg_dbs.drop(url)


def test_pin_through_one_process_wakes_a_waiter_held_by_the_other(
    planners: Callable[..., list[PlannerProcess]],
) -> None:
    a, b = planners(2)
    start_or_fail(a)
    start_or_fail(b)
    with (
        httpx.Client(base_url=a.base_url, timeout=30) as client_a,
        httpx.Client(base_url=b.base_url, timeout=30) as client_b,
        ThreadPoolExecutor(1) as pool,
    ):
        # B's LISTEN connection is up, so a decision stored by A reaches it.
        poll(lambda: metric(client_b, "dynamo_planner_notify_listener_up") == 1.0, "B listening", a, b)
        held = held_wait(pool, b, 0, 20)
        poll(lambda: metric(client_b, "dynamo_planner_decision_waiters") == 1.0, "B holds one waiter", a, b)
        assert metric(client_a, "dynamo_planner_decision_waiters") == 0.0
        assert not held.done()

        created = pin(client_a, 3, 5, "via A", a, b)
        woken = expect(held.result(timeout=60), 200, a, b)
        assert woken == created["decision"]
        assert woken["id"] == 1
        assert (woken["num_prefill"], woken["num_decode"], woken["status"]) == (3, 5, "pending")
        assert metric(client_b, "dynamo_planner_decision_waiters") == 0.0

        # B acknowledges; A reads the acknowledgement from the shared database.
        acknowledge(client_b, 1, 3, 5, a, b)
        assert expect(client_a.get("/decisions/1", headers=VIEWER), 200, a, b)["status"] == "succeeded"

        # And the other way round: a pin through B reaches a waiter held by A.
        held = held_wait(pool, a, 1, 20)
        poll(lambda: metric(client_a, "dynamo_planner_decision_waiters") == 1.0, "A holds one waiter", a, b)
        pin(client_b, 4, 6, "via B", a, b)
        woken = expect(held.result(timeout=60), 200, a, b)
        assert (woken["id"], woken["num_prefill"], woken["num_decode"]) == (2, 4, 6)


def test_exactly_one_process_leads_the_worker(planners: Callable[..., list[PlannerProcess]]) -> None:
    a, b = planners(2)
    start_or_fail(a)
    start_or_fail(b)
    with (
        httpx.Client(base_url=a.base_url, timeout=30) as client_a,
        httpx.Client(base_url=b.base_url, timeout=30) as client_b,
    ):

        def worker(client: httpx.Client) -> dict[str, Any]:
            return expect(client.get("/deployments/demo", headers=VIEWER), 200, a, b)["worker"]

        # Both loops have asked for the lease (at start-up); only the holder ticks.
        poll(lambda: worker(client_a)["lease_checked_at"] is not None, "A's lease check", a, b)
        poll(lambda: worker(client_b)["lease_checked_at"] is not None, "B's lease check", a, b)
        states = [worker(client_a), worker(client_b)]
        assert [s["running"] for s in states] == [True, True]
        assert sorted(s["leader"] for s in states) == [False, True], states
        assert [s["last_tick_at"] is not None for s in states] == [s["leader"] for s in states]

        # One diagnostics record, written by the leader: not one per process.
        ticks = expect(client_a.get("/diagnostics", headers=VIEWER, params={"deployment": "demo"}), 200, a, b)
        assert len(ticks["items"]) == 1
        assert metric(client_a, 'dynamo_planner_ticks_total{deployment="demo"}') == (
            1.0 if states[0]["leader"] else None
        )


def test_two_processes_start_at_once_on_an_unmigrated_database(
    planners: Callable[..., list[PlannerProcess]],
) -> None:
    a, b = planners(2, migrated=False)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(proc: PlannerProcess) -> None:
        barrier.wait()
        try:
            proc.start()
        except BaseException as exc:  # reported below with the logs
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert not errors, f"{errors}\n" + logs(a, b)
    for proc in (a, b):
        assert proc.proc is not None and proc.proc.poll() is None, logs(a, b)
        with httpx.Client(base_url=proc.base_url, timeout=30) as client:
            expect(client.get("/healthz"), 200, a, b)
            poll(lambda c=client: c.get("/readyz").status_code == 200, f"{proc.base_url}/readyz", a, b)

    # The schema was created once and is at head; the deployment has one state row.
    engine = create_engine(a.database_url)
    try:
        with engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
            states = conn.execute(text("SELECT name FROM deployment_state")).scalars().all()
    finally:
        engine.dispose()
    head = ScriptDirectory.from_config(alembic_config(a.database_url)).get_current_head()
    assert versions == [head]
    assert states == ["demo"]

    # And the pair works: a pin through A is read through B.
    with (
        httpx.Client(base_url=a.base_url, timeout=30) as client_a,
        httpx.Client(base_url=b.base_url) as client_b,
    ):
        pin(client_a, 1, 1, "up", a, b)
        got = next_decision(client_b, 0, a, b, timeout_s=5)
        assert got["id"] == 1
