"""The store's traffic history on both backends: the retention's pruning, the read-only engine,
the stored configuration, and the observations read back as `planner replay --from-store` reads
them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from app.core.types import DecisionSource
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config
from app.store import decisions as dstore
from app.store import history
from app.store import ticks as tstore
from app.store.db import make_engine, make_session_factory
from app.store.models import DeploymentState, Tick
from app.workers.clock import ManualClock
from app.workers.retention import TrafficPruner
from tests.conftest import T0
from tests.support import REPO_ROOT

DAY = timedelta(days=1)


def observed(num_req: float) -> dict[str, Any]:
    return {
        "observed": {
            "duration_s": 5.0,
            "num_req": num_req,
            "isl": 100.0,
            "osl": 10.0,
            "isl_buckets": [[64.0, 1.0], [128.0, num_req - 1], ["+Inf", 0.0]],
        },
        "error": None,
    }


@pytest.fixture
def sf(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url)
    factory = make_session_factory(engine)
    with factory() as s, s.begin():
        dstore.ensure_deployments(s, ["demo", "other"])
    yield factory
    engine.dispose()


def add(sf: sessionmaker[Session], deployment: str, at_days: float, traffic: dict[str, Any] | None) -> None:
    with sf() as s, s.begin():
        tstore.add_tick(
            s, deployment=deployment, at=T0 + at_days * DAY, record={"version": 2, "traffic": traffic, "k": 1}
        )


def records(sf: sessionmaker[Session]) -> list[tuple[str, float, dict[str, Any]]]:
    with sf() as s:
        rows = s.execute(select(Tick.deployment, Tick.at, Tick.record).order_by(Tick.id)).all()
    return [(d, round((at - T0) / DAY, 3), r) for d, at, r in rows]


class PruneCase(NamedTuple):
    name: str
    ticks: list[tuple[str, float, bool]]  # deployment, day, with traffic
    now_days: float
    retention_days: float
    cleared: list[int]  # indices of the ticks whose traffic goes
    why: str


PRUNE_CASES = [
    PruneCase(
        "older_than_retention_only",
        [("demo", 0, True), ("demo", 5, True), ("demo", 10, True)],
        now_days=16,
        retention_days=14,
        cleared=[0],
        why="day 0 is 16 days old, days 5 and 10 are within the 14 days kept",
    ),
    PruneCase(
        "every_deployment",
        [("demo", 0, True), ("other", 1, True), ("other", 20, True)],
        now_days=21,
        retention_days=14,
        cleared=[0, 1],
        why="the retention is the store's, not one deployment's",
    ),
    PruneCase(
        "tick_without_traffic_untouched",
        [("demo", 0, False), ("demo", 1, True)],
        now_days=30,
        retention_days=14,
        cleared=[1],
        why="a tick that observed nothing (seed algorithm) has nothing to clear and is not rewritten",
    ),
    PruneCase(
        "nothing_old_enough",
        [("demo", 3, True)],
        now_days=4,
        retention_days=2,
        cleared=[],
        why="one day old against two kept",
    ),
]


@pytest.mark.parametrize("case", PRUNE_CASES, ids=lambda c: c.name)
def test_the_pruner_clears_only_old_traffic(sf: sessionmaker[Session], case: PruneCase) -> None:
    for deployment, day, with_traffic in case.ticks:
        add(sf, deployment, day, observed(10.0) if with_traffic else None)
    before = records(sf)
    pruner = TrafficPruner(session_factory=sf, clock=ManualClock(T0), retention_days=case.retention_days)
    assert pruner.prune(T0 + case.now_days * DAY) == len(case.cleared), case.why
    after = records(sf)
    for i, ((d0, at0, r0), (d1, at1, r1)) in enumerate(zip(before, after, strict=True)):
        assert (d0, at0) == (d1, at1)
        if i in case.cleared:
            assert r1 == {**r0, "traffic": None}, case.why  # the rest of the record stays
        else:
            assert r1 == r0, case.why
    # A second round finds nothing more.
    assert pruner.prune(T0 + case.now_days * DAY) == 0


def test_the_pruner_goes_through_more_than_one_batch(sf: sessionmaker[Session]) -> None:
    n = history.PRUNE_BATCH + 7
    with sf() as s, s.begin():
        for i in range(n):
            tstore.add_tick(
                s, deployment="demo", at=T0 + timedelta(seconds=i), record={"traffic": observed(2.0)}
            )
    pruner = TrafficPruner(session_factory=sf, clock=ManualClock(T0), retention_days=1)
    assert pruner.prune(T0 + 2 * DAY) == n
    with sf() as s:
        left = [r for r in s.scalars(select(Tick.record)) if r["traffic"] is not None]
    assert left == []


def test_the_pruner_runs_in_the_background_on_the_service_clock(sf: sessionmaker[Session]) -> None:
    add(sf, "demo", 0, observed(10.0))
    add(sf, "demo", 20, observed(10.0))
    clock = ManualClock(T0 + 21 * DAY)

    async def run() -> None:
        pruner = TrafficPruner(session_factory=sf, clock=clock, retention_days=14)
        pruner.start()
        for _ in range(200):
            await asyncio.sleep(0.01)
            if pruner.pruned:
                break
        await pruner.stop()
        assert pruner.pruned == 1 and pruner.last_error is None

    asyncio.run(run())
    assert [r["traffic"] is None for _, _, r in records(sf)] == [True, False]


def test_read_only_engine_refuses_writes_and_reads_the_history(
    db_url: str, sf: sessionmaker[Session]
) -> None:
    add(sf, "demo", 0, observed(10.0))
    add(sf, "demo", 0.5, None)
    with sf() as s, s.begin():
        history.save_configs(s, {"demo": {"name": "demo", "profile": "/p"}}, T0)
    engine = history.open_read_only(db_url)
    try:
        with Session(engine) as s:
            ticks = history.observed_traffic(s, "demo", T0, T0 + DAY)
            assert [t.at for t in ticks] == [T0, T0 + DAY / 2]
            first = ticks[0].observation
            assert first is not None and ticks[1].observation is None
            assert (first.duration_s, first.num_req, first.isl, first.osl) == (5.0, 10.0, 100.0, 10.0)
            # The open bucket, stored "+Inf", is infinite again.
            assert first.isl_buckets == ((64.0, 1.0), (128.0, 9.0), (float("inf"), 0.0))
            assert history.stored_config(s, "demo") == ({"name": "demo", "profile": "/p"}, {})
            assert history.deployment_names(s) == ["demo", "other"]
            assert history.schema_revision(s) == "0006_deployment_config"
            with pytest.raises(DBAPIError):
                s.execute(text("DELETE FROM ticks"))
            s.rollback()
            with pytest.raises(DBAPIError):
                s.execute(text("UPDATE deployment_state SET last_decision_id = 99"))
    finally:
        engine.dispose()
    with sf() as s:
        assert s.scalar(select(func.count()).select_from(Tick)) == 2
        assert s.scalar(select(func.max(DeploymentState.last_decision_id))) == 0


def test_an_unchanged_config_is_not_rewritten(sf: sessionmaker[Session]) -> None:
    config = {"name": "demo", "sla": {"ttft_ms": 500}}
    with sf() as s, s.begin():
        history.save_configs(s, {"demo": config}, T0)
    with sf() as s, s.begin():
        history.save_configs(s, {"demo": dict(config)}, T0 + DAY)
    with sf() as s:
        state = s.get(DeploymentState, "demo")
        assert state is not None and state.config == config and state.config_saved_at == T0
    with sf() as s, s.begin():
        history.save_configs(s, {"demo": {**config, "sla": {"ttft_ms": 400}}}, T0 + DAY)
    with sf() as s:
        state = s.get(DeploymentState, "demo")
        assert (
            state is not None
            and state.config["sla"] == {"ttft_ms": 400}
            and state.config_saved_at == T0 + DAY
        )


def table_rows(sf: sessionmaker[Session]) -> dict[str, list[str]]:
    """Every row of every table, as text, sorted: what a read-only replay must leave as it was."""
    from app.store.models import Base

    out = {}
    with sf() as s:
        for table in Base.metadata.sorted_tables:
            out[table.name] = sorted(repr(tuple(row)) for row in s.execute(table.select()))
    return out


def test_a_replay_from_the_store_leaves_every_row_as_it_was(
    db_url: str, sf: sessionmaker[Session], tmp_path: Path
) -> None:
    """Five minutes of steady traffic and two decisions, on each backend, replayed by the command."""
    deployment = load_replay_config(DEFAULT_REPLAY_CONFIG).deployment.model_copy(update={"name": "demo"})
    config = deployment.with_absolute_paths(DEFAULT_REPLAY_CONFIG.parent)
    with sf() as s, s.begin():
        history.save_configs(s, {"demo": config}, T0)
        for i in range(60):
            at = T0 + timedelta(seconds=5 * (i + 1))
            tstore.add_tick(s, deployment="demo", at=at, record={"traffic": observed(25.0)})
    for at_s, target in ((2.0, {"prefill": 1, "decode": 1}), (150.0, {"prefill": 2, "decode": 2})):
        with sf() as s, s.begin():
            dstore.propose_decision(
                s,
                deployment="demo",
                target=target,
                source=DecisionSource.SLA,
                reasons=["test"],
                now=T0 + timedelta(seconds=at_s),
                ack_timeout_s=60.0,
                await_ack=False,
            )
    before = table_rows(sf)
    run = subprocess.run(
        [sys.executable, "-m", "app.cli", "replay", "--from-store", db_url, "--deployment", "demo"]
        + ["--out", str(tmp_path / "out"), "--quiet"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert table_rows(sf) == before
    comparison = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert comparison["requests"] == 60 * 25
    # The window runs from the first tick's interval start (T0) to the last tick (T0 + 300 s):
    # 1 + 1 engines until the decision at 150 s, then 2 + 2: 150 × 2 + 150 × 4 engine-seconds.
    assert comparison["stored"]["engine_hours"] == pytest.approx((150 * 2 + 150 * 4) / 3600.0)
