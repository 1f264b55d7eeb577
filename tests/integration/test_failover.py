"""Failover: two `planner serve` processes on one PostgreSQL database, the one leading the
deployment's worker is SIGKILLed, and the other takes over (PostgreSQL only).

SLA scaling decides from real traffic (a stand-in frontend's `/metrics`, scraped directly,
ramping up so that the wish keeps rising); the shipped example orchestrator, given both URLs,
applies and acknowledges every decision from the first it is handed. The test pins what failover
promises:
- the survivor takes the worker loop over within the lease's TTL of the kill (and not before
  the dead leader's lease ran out);
- decision ids continue without a gap or a duplicate, each decision applied exactly once;
- the survivor resumes the learned state the dead leader stored, not a cold start;
- an orchestrator long-polling the survivor sees every decision, the one that was polling the
  dead process moves over and goes on where it left.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from app.core.planner import PlannerState
from app.store.models import Decision, PlannerStateRow, Tick
from tests.support import (
    ORCH,
    REPO_ROOT,
    TOKENS,
    VIEWER,
    PlannerProcess,
    PostgresDatabases,
    demo_config,
    logs,
    start_or_fail,
    write_config,
)
from tests.support_frontend import RampingFrontend

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]

H200 = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")
TICK_S = 1.0
LEASE_TTL_S = 4.0
LEASE_RENEW_S = 1.0
# Scheduling slack on a loaded machine: the survivor asks for the lease at its expiry and
# ticks with the same `now`, so this is only the event loop's lateness.
SLACK_S = 1.0


# --- helpers ----------------------------------------------------------------------------------------


def deployments(frontend_url: str) -> dict[str, Any]:
    return demo_config(
        profile=H200,
        sla={"ttft_ms": 500, "itl_ms": 50},
        prefill={"min_replicas": 1, "max_replicas": 64},
        decode={"min_replicas": 1, "max_replicas": 64},
        # No forecast, 1 s ticks (windows of a few seconds): the decisions follow the ramp within
        # a few ticks, and the level history (kept once a trend window was watched) starts after 12 s.
        scaling={
            "algorithm": "sla",
            "interval_s": TICK_S,
            "trend": False,
        },
        sources={"frontend_url": frontend_url},
    )


def worker_state(proc: PlannerProcess) -> dict[str, Any] | None:
    try:
        r = httpx.get(f"{proc.base_url}/deployments/demo", headers=VIEWER, timeout=5)
    except httpx.HTTPError:
        return None
    return r.json()["worker"] if r.status_code == 200 else None


def wait_for(condition, what: str, *procs: PlannerProcess, timeout_s: float = 60.0, pause_s: float = 0.05):
    """The first truthy value of `condition()` (bounded; a wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(pause_s)
    raise AssertionError(f"never happened within {timeout_s:g} s: {what}\n" + logs(*procs))


def applied_ids(path: Path) -> list[int]:
    """The decision ids the orchestrator's command ran for, in order."""
    if not path.exists():
        return []
    return [int(line.split()[0]) for line in path.read_text().splitlines() if line.strip()]


def learned(blob: bytes) -> PlannerState:
    _version, deployment, _fingerprint, state = pickle.loads(blob)  # noqa: S301 (our own store's bytes)
    assert deployment == "demo"
    return state


class Watcher:
    """A second orchestrator-role client that only long-polls one planner and records every
    decision id it is handed (it never acknowledges)."""

    def __init__(self, proc: PlannerProcess) -> None:
        self.proc = proc
        self.seen: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        after = 0
        with httpx.Client(base_url=self.proc.base_url, headers=ORCH, timeout=30) as client:
            while not self._stop.is_set():
                try:
                    r = client.get(
                        "/decisions/wait", params={"deployment": "demo", "after": after, "timeout_s": 2}
                    )
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))
                    time.sleep(0.2)
                    continue
                if r.status_code == 200:
                    after = r.json()["id"]
                    self.seen.append(after)
                elif r.status_code != 204:
                    self.errors.append(f"{r.status_code} {r.text}")

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture
def database(pg_dbs: PostgresDatabases) -> Iterator[str]:
    url = pg_dbs.fresh()
    yield url
    pg_dbs.drop(url)


# --- the test -----------------------------------------------------------------------------------------


def test_sigkilled_leader_is_replaced_and_nothing_is_lost(database: str, tmp_path: Path) -> None:
    engine = create_engine(database)
    applied = tmp_path / "applied.txt"
    state_file = tmp_path / "orchestrator.state.json"
    env = {"PLANNER_LEASE_TTL_S": str(LEASE_TTL_S), "PLANNER_LEASE_RENEW_S": str(LEASE_RENEW_S)}
    procs: list[PlannerProcess] = []
    orchestrator: subprocess.Popen[str] | None = None
    try:
        with RampingFrontend(start_rps=20, growth=0.025) as frontend:
            config = write_config(tmp_path / "planner.yaml", deployments(frontend.url))
            for name in ("a", "b"):
                proc = PlannerProcess(
                    database, config, tokens=TOKENS, extra_env=env, log_path=tmp_path / f"planner-{name}.log"
                )
                procs.append(start_or_fail(proc))

            # Exactly one of them leads; the other is the standby that survives.
            states = wait_for(
                lambda: (
                    (s := [worker_state(p) for p in procs])
                    and all(x and x["lease_checked_at"] for x in s)
                    and s
                ),
                "both workers asked for the lease",
                *procs,
            )
            assert sorted(s["leader"] for s in states) == [False, True], states
            leader, survivor = procs if states[0]["leader"] else procs[::-1]

            with Watcher(survivor) as watcher:
                orchestrator = subprocess.Popen(
                    [
                        sys.executable,
                        str(REPO_ROOT / "examples" / "orchestrator.py"),
                        "--url",
                        f"{leader.base_url},{survivor.base_url}",
                        "--deployment",
                        "demo",
                        "--token",
                        ORCH["Authorization"].removeprefix("Bearer "),
                        "--state-file",
                        str(state_file),
                        "--command",
                        f"sh -c 'echo {{id}} {{prefill}} {{decode}} >> {applied}'",
                        "--wait-s",
                        "5",
                        "--max-backoff-s",
                        "1",
                    ],
                    stdout=open(tmp_path / "orchestrator.out", "w"),
                    stderr=open(tmp_path / "orchestrator.err", "w"),
                    text=True,
                )
                # The leader's SLA scaling decides (its first decision from the demand alone: nothing
                # ran before it) and the orchestrator applies.
                wait_for(lambda: len(applied_ids(applied)) >= 3, "three SLA decisions applied", *procs)

                def history_stored() -> bool:
                    with Session(engine) as session:
                        row = session.get(PlannerStateRow, "demo")
                    return row is not None and bool(learned(row.state).sla.history)

                # The state to resume holds a level history: a trend window was watched.
                wait_for(history_stored, "the leader's level history stored", *procs)
                with Session(engine) as session:
                    before = list(session.scalars(select(Decision).order_by(Decision.decision_id)))
                wait_for(lambda: len(applied_ids(applied)) > len(before), "the next decision applied", *procs)

                leader.kill()
                killed_at = datetime.now(UTC)
                assert leader.proc is not None and leader.proc.returncode == -9
                with Session(engine) as session:
                    dead_ticks = list(session.scalars(select(Tick).order_by(Tick.id)))
                    dead_state = session.get(PlannerStateRow, "demo")
                    dead_decisions = list(session.scalars(select(Decision).order_by(Decision.decision_id)))
                assert dead_state is not None
                dead_learned = learned(dead_state.state)
                last_dead = dead_ticks[-1]
                # The dead leader's last tick is the state it stored (saved with the tick).
                assert dead_state.saved_at == last_dead.at

                # The survivor takes over and ticks at once.
                def survivor_tick() -> Tick | None:
                    with Session(engine) as session:
                        return session.scalars(
                            select(Tick).where(Tick.id > last_dead.id).order_by(Tick.id).limit(1)
                        ).first()

                first = wait_for(survivor_tick, "the survivor's first tick", survivor)
                assert (worker_state(survivor) or {}).get("leader") is True
                takeover_s = (first.at - killed_at).total_seconds()
                print(f"\ntakeover: the survivor's first tick {takeover_s:.2f} s after the SIGKILL")
                assert takeover_s <= LEASE_TTL_S + SLACK_S, takeover_s
                # Not before the dead leader's lease ran out (its last renewal was at most
                # LEASE_RENEW_S before the kill): never two leaders.
                assert takeover_s >= LEASE_TTL_S - LEASE_RENEW_S - SLACK_S, takeover_s

                # The survivor decides on, and the orchestrator follows it there.
                count = len(dead_decisions)
                wait_for(
                    lambda: len(applied_ids(applied)) >= count + 2,
                    "two decisions of the survivor applied",
                    survivor,
                )
                frontend._stop.set()  # no more traffic growth: the decisions settle
                with Session(engine) as session:
                    latest = session.scalars(
                        select(Decision).order_by(Decision.decision_id.desc()).limit(1)
                    ).one()
                wait_for(
                    lambda: (
                        applied_ids(applied)[-1:] == [latest.decision_id]
                        and len(watcher.seen) > 0
                        and watcher.seen[-1] >= latest.decision_id
                    ),
                    "the latest decision applied and seen",
                    survivor,
                )
            orchestrator.terminate()
            orchestrator.wait(timeout=10)

        with Session(engine) as session:
            decisions = list(session.scalars(select(Decision).order_by(Decision.decision_id)))
            ticks = {t.id: t for t in session.scalars(select(Tick))}
            state_now = session.get(PlannerStateRow, "demo")
        ids = [d.decision_id for d in decisions]
        out = (tmp_path / "orchestrator.out").read_text()
        err = (tmp_path / "orchestrator.err").read_text()
        report = f"\ndecisions {ids}\napplied {applied_ids(applied)}\nseen {watcher.seen}\n{out}\n{err}\n"
        report += logs(survivor)

        # Ids continue across the failover: no gap, no duplicate; both processes decided.
        assert ids == list(range(1, len(ids) + 1)), report
        dead_ids = [d.decision_id for d in dead_decisions]
        assert dead_ids == ids[: len(dead_ids)], report
        by_survivor = [d for d in decisions if d.tick_id is not None and ticks[d.tick_id].at >= first.at]
        by_leader = [d for d in decisions if d.tick_id is not None and ticks[d.tick_id].at <= last_dead.at]
        assert len(by_leader) >= 3 and len(by_survivor) >= 2, report
        assert {d.source for d in by_leader + by_survivor} == {"sla"}, report
        # The first decisions may come before the orchestrator's first long-poll (SLA scaling
        # decides from the first tick); those are superseded, never applied. From the first one it
        # was handed, every decision was applied exactly once, in order, and acknowledged
        # succeeded (each one was the latest when it was handed out: nothing superseded or expired).
        done = applied_ids(applied)
        assert done and done[0] in ids, report
        before_orchestrator = ids.index(done[0])
        assert [d.status for d in decisions[:before_orchestrator]] == ["superseded"] * before_orchestrator
        assert done == ids[before_orchestrator:], report
        assert [d.status for d in decisions[before_orchestrator:]] == ["succeeded"] * len(done), report
        assert out.splitlines() == [f"decision {i}: succeeded (exit status 0)" for i in done], report
        # The orchestrator that polled the dead process moved to the survivor.
        assert f"planner {leader.base_url} unreachable" in err, report
        # The watcher long-polling the survivor all along saw every decision from its first, in
        # order, the failover included.
        assert watcher.seen and watcher.seen == ids[ids.index(watcher.seen[0]) :], report
        assert watcher.seen[0] <= done[0], report
        assert watcher.errors == [], report

        # The survivor resumed what the dead leader learned and stored, not a cold start: its
        # log says so, and the stored state still starts at the dead leader's first tick, with
        # the dead leader's traffic samples and level history in it.
        saved_at = dead_state.saved_at.isoformat()
        log_text = Path(survivor.log_path or "").read_text()
        resumed_line = rf"\[demo\] resumed the learned state saved at {re.escape(saved_at)}"
        assert re.search(resumed_line, log_text), report
        assert first.record["latest_decision_id"] == dead_ids[-1], report
        # Its first observation starts after the dead leader's last one ended (at the standby's
        # last lease check, not at its start-up scrape): no request is counted twice. A takeover
        # at the holder's expiry may come moments after that check; then the first tick's window
        # is too short to read a rate from, it says so, and the next tick's window covers it.
        survivor_ticks = sorted((t for t in ticks.values() if t.at >= first.at), key=lambda t: t.id)
        reading = next(t for t in survivor_ticks if t.record["traffic"]["observed"] is not None)
        for unread in survivor_ticks[: survivor_ticks.index(reading)]:
            assert "too short to read a rate" in (unread.record["traffic"]["error"] or ""), report
        assert reading.id <= first.id + 1, report
        observed = reading.record["traffic"]["observed"]
        longest_s = (reading.at - first.at).total_seconds() + LEASE_RENEW_S + SLACK_S
        assert 0 < observed["duration_s"] <= longest_s, report
        window_start = reading.at.timestamp() - observed["duration_s"]
        assert window_start >= last_dead.at.timestamp(), report
        assert state_now is not None
        resumed = learned(state_now.state)
        first_tick = min(ticks.values(), key=lambda t: t.id)
        assert dead_learned.sla.first_s == first_tick.at.timestamp()
        assert resumed.sla.first_s == dead_learned.sla.first_s, report
        dead_samples = [s for s in dead_learned.sla.samples if s.end_s <= last_dead.at.timestamp()]
        assert dead_samples and all(s in resumed.sla.samples for s in dead_samples), report
        dead_history = list(dead_learned.sla.history)
        assert dead_history and list(resumed.sla.history)[: len(dead_history)] == dead_history, report
    finally:
        if orchestrator is not None and orchestrator.poll() is None:
            orchestrator.kill()
        for proc in procs:
            proc.stop()
        engine.dispose()
