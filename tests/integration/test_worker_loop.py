"""The worker's `run()` loop on a manual clock, on SQLite and PostgreSQL.

The loop is started as a real asyncio task; time moves only when the test advances the clock.
After each advance the test waits (a bounded number of short sleeps) until the tick shows up in
the database; nothing here asserts how long anything took.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from app.api.convert import encode_decision
from app.api.schemas import DecisionOut
from app.config import DeploymentConfig, DeploymentsFile
from app.connectors.virtual import DecisionHub
from app.core.perf.fpm import ForwardPassMetrics, ScheduledRequestMetrics
from app.core.types import DecisionSource, DecisionStatus, OverrideAction, TrafficObservation
from app.reports.metrics import PlannerMetrics
from app.sources.fpm import FpmSubscriber
from app.store import decisions as decision_store
from app.store import overrides as override_store
from app.store.db import make_engine, make_session_factory
from app.store.decisions import ensure_deployments
from app.store.models import DeploymentState, Tick
from app.store.overrides import Actor
from app.workers.clock import ManualClock
from app.workers.gather import Gathered
from app.workers.loop import LEASE_RENEW_S, LEASE_TTL_S, DeploymentWorker, process_identity
from tests.support import demo_config

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
INTERVAL_S = 180.0  # the demo deployment's throughput interval (the only enabled cadence)


@dataclass
class Rig:
    engine: Engine
    sf: sessionmaker[Session]
    clock: ManualClock
    metrics: PlannerMetrics
    worker: DeploymentWorker

    def tick_times(self) -> list[datetime]:
        with self.sf() as session:
            return list(session.scalars(select(Tick.at).where(Tick.deployment == "demo").order_by(Tick.id)))

    def sample(self, name: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, {"deployment": "demo"})

    def execute(self, sql: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(text(sql))


@asynccontextmanager
async def running_worker(
    db_url: str, config: DeploymentConfig | None = None, **worker: Any
) -> AsyncIterator[Rig]:
    """A DeploymentWorker built as the app's lifespan builds it, its loop running as a task."""
    if config is None:
        config = DeploymentsFile.model_validate(demo_config()).deployments[0]
        assert config.tick_interval_s == INTERVAL_S
    engine = make_engine(db_url)
    sf = make_session_factory(engine)
    with sf() as session, session.begin():
        ensure_deployments(session, [config.name])
    metrics = PlannerMetrics()
    hub = DecisionHub(sf, metrics, encode=encode_decision)
    hub.bind(asyncio.get_running_loop())
    clock = ManualClock(T0)
    worker = DeploymentWorker(
        config=config,
        session_factory=sf,
        hub=hub,
        metrics=metrics,
        clock=clock,
        holder=process_identity(),
        **worker,
    )
    worker.start()
    try:
        yield Rig(engine=engine, sf=sf, clock=clock, metrics=metrics, worker=worker)
    finally:
        await worker.stop()
        engine.dispose()


async def eventually(condition: Callable[[], bool], what: str, rig: Rig) -> None:
    """Wait until `condition` holds: a bounded number of short sleeps (a wait, not a timing check)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(
        f"never happened: {what}; ticks at {rig.tick_times()}, last_error={rig.worker.last_error!r}, "
        f"running={rig.worker.running}"
    )


async def ticked(rig: Rig, count: int, what: str) -> None:
    """Wait until the loop has finished its tick at the clock's current time and `count` records exist."""
    await eventually(
        lambda: len(rig.tick_times()) == count and rig.worker.last_tick_at == rig.clock.now(), what, rig
    )


def at(*offsets_s: float) -> list[datetime]:
    return [T0 + timedelta(seconds=s) for s in offsets_s]


async def test_one_tick_record_per_interval_at_the_clock_times(db_url: str) -> None:
    async with running_worker(db_url) as rig:
        # The loop ticks once at start-up, at the clock's time.
        await ticked(rig, 1, "the first tick")
        assert rig.tick_times() == at(0)

        for n in range(1, 5):
            rig.clock.advance(INTERVAL_S)
            await ticked(rig, n + 1, f"tick {n + 1}")
            assert rig.worker.last_tick_at == rig.clock.now()
        assert rig.tick_times() == at(0, 180, 360, 540, 720)

        # Half an interval twice: one tick, when the interval is complete.
        rig.clock.advance(INTERVAL_S / 2)
        rig.clock.advance(INTERVAL_S / 2)
        await ticked(rig, 6, "tick after two half intervals")

        # Falling three intervals behind gives one tick now, not a burst of the missed ones ...
        rig.clock.advance(3 * INTERVAL_S)
        await ticked(rig, 7, "tick after a jump")
        # ... and the schedule continues one interval after it.
        rig.clock.advance(INTERVAL_S)
        await ticked(rig, 8, "tick after the jump")
        assert rig.tick_times() == at(0, 180, 360, 540, 720, 900, 1440, 1620)

        assert rig.sample("dynamo_planner_ticks_total") == 8.0
        assert rig.sample("dynamo_planner_tick_failures_total") is None
        assert rig.worker.is_leader is True
        assert rig.worker.last_error is None
        assert rig.worker.running

        # Each record explains the tick: no policy yet, no pin, so no target and no decision.
        with rig.sf() as session:
            ticks = list(session.scalars(select(Tick).order_by(Tick.id)))
        for tick in ticks:
            assert tick.decision_id is None
            assert tick.record["at"] == tick.at.isoformat()
            assert tick.record["target"] is None
            assert tick.record["verdict"] == "hold: no target"
            assert tick.record["decision_id"] is None


async def test_a_failing_tick_is_counted_and_the_loop_keeps_going(db_url: str, backend: str) -> None:
    async with running_worker(db_url) as rig:
        await ticked(rig, 1, "the first tick")

        # Break the store under the worker: its diagnostics table disappears.
        rig.execute("ALTER TABLE ticks RENAME TO ticks_away")
        try:
            rig.clock.advance(INTERVAL_S)
            await eventually(lambda: rig.worker.consecutive_failures == 1, "the first failure", rig)
            assert rig.sample("dynamo_planner_tick_failures_total") == 1.0
            error = rig.worker.last_error
            assert error is not None
            expected = (
                "OperationalError: (sqlite3.OperationalError) no such table: ticks"
                if backend == "sqlite"
                else 'ProgrammingError: (psycopg.errors.UndefinedTable) relation "ticks" does not exist'
            )
            assert error.startswith(expected), error
            assert rig.worker.last_tick_at == T0  # the last tick that succeeded
            assert rig.worker.running

            rig.clock.advance(INTERVAL_S)
            await eventually(lambda: rig.worker.consecutive_failures == 2, "the second failure", rig)
            assert rig.sample("dynamo_planner_tick_failures_total") == 2.0
            assert rig.worker.running
        finally:
            rig.execute("ALTER TABLE ticks_away RENAME TO ticks")  # repair

        rig.clock.advance(INTERVAL_S)
        await ticked(rig, 2, "a tick after the repair")
        assert rig.tick_times() == at(0, 540)  # the failed ticks at 180 and 360 left no record
        assert rig.worker.last_error is None
        assert rig.worker.consecutive_failures == 0
        assert rig.worker.last_tick_at == T0 + timedelta(seconds=540)
        assert rig.sample("dynamo_planner_tick_failures_total") == 2.0
        assert rig.sample("dynamo_planner_ticks_total") == 2.0

        rig.clock.advance(INTERVAL_S)
        await ticked(rig, 3, "the next tick")
        assert rig.tick_times() == at(0, 540, 720)


async def test_stop_releases_the_lease_for_the_next_worker(db_url: str) -> None:
    async with running_worker(db_url) as rig:
        await ticked(rig, 1, "the first tick")
        holder = rig.worker._holder
        with rig.sf() as session:
            assert session.get(DeploymentState, "demo").lease_holder == holder  # type: ignore[union-attr]
        await rig.worker.stop()
        assert not rig.worker.running
        with rig.sf() as session:
            state = session.get(DeploymentState, "demo")
            assert state is not None
            assert (state.lease_holder, state.lease_expires_at) == (None, None)

    # A worker of another process (another holder) takes over at once and ticks.
    async with running_worker(db_url) as rig:
        await ticked(rig, 2, "the new worker's first tick")
        assert rig.worker.is_leader is True


async def test_a_tick_decides_when_new_bounds_clamp_the_pin(db_url: str) -> None:
    """The loop's own decisions: a pin is in force, then the operator lowers a bound below it; the
    next tick issues the clamped target, records it in its diagnostics and wakes waiters."""
    async with running_worker(db_url) as rig:
        await ticked(rig, 1, "the first tick")
        operator = Actor(role="operator", name="test-operator")
        # What POST /override does for a pin, then the orchestrator's acknowledgement.
        with rig.sf() as session, session.begin():
            pin = override_store.create_override(
                session,
                deployment="demo",
                action=OverrideAction.PIN,
                params={"prefill": 3, "decode": 5},
                reason="pin",
                expires_at=None,
                actor=operator,
                now=rig.clock.now(),
            )
            decision_store.propose_decision(
                session,
                deployment="demo",
                target={"prefill": 3, "decode": 5},
                source=DecisionSource.OVERRIDE,
                reasons=["pinned"],
                now=rig.clock.now(),
                ack_timeout_s=1800,
                override_id=pin.id,
            )
        with rig.sf() as session, session.begin():
            decision_store.complete_decision(
                session,
                deployment="demo",
                decision_id=1,
                status=DecisionStatus.SUCCEEDED,
                observed={"prefill": 3, "decode": 5},
                message=None,
                actor_role="orchestrator",
                now=rig.clock.now(),
            )
        # POST /override bounds creates no decision by itself.
        with rig.sf() as session, session.begin():
            bounds = override_store.create_override(
                session,
                deployment="demo",
                action=OverrideAction.BOUNDS,
                params={"max_prefill": 2},
                reason="fewer prefill GPUs",
                expires_at=None,
                actor=operator,
                now=rig.clock.now(),
            )

        waiter = asyncio.create_task(rig.worker._hub.wait("demo", 1, 30))
        rig.clock.advance(INTERVAL_S)
        await ticked(rig, 2, "the tick after the bounds")
        body = await asyncio.wait_for(waiter, 30)
        assert body is not None
        decision = DecisionOut.model_validate_json(body)
        assert (decision.id, decision.num_prefill, decision.num_decode) == (2, 2, 5)
        assert (decision.source, decision.status) == ("override", "pending")
        assert decision.created_at == T0 + timedelta(seconds=INTERVAL_S)
        assert decision.override_id == pin.id
        assert decision.reasons == [
            # The demo deployment has throughput scaling on but no profile: the loop says so.
            "proposal: throughput model_not_ready: no profile configured",
            "pause: not paused",
            f"pin: pinned by override #{pin.id}",
            "bounds: prefill 3 -> 2 (min 1, max 2)",
            "budget: no GPU budget",
            "protocol: no decision awaits acknowledgement",
        ]

        with rig.sf() as session:
            tick = session.scalars(select(Tick).order_by(Tick.id.desc()).limit(1)).one()
        assert decision.tick_id == tick.id
        assert tick.decision_id == 2
        assert tick.record["target"] == {"prefill": 2, "decode": 5}
        assert tick.record["overrides"] == {"pin_id": pin.id, "bounds_id": bounds.id, "pause_id": None}
        assert tick.record["latest_decision_id"] == 1
        assert tick.record["decision_id"] == 2
        assert tick.record["verdict"] == "create: no decision awaits acknowledgement"

        # An unchanged target on the next tick creates nothing.
        rig.clock.advance(INTERVAL_S)
        await ticked(rig, 3, "the next tick")
        with rig.sf() as session:
            tick = session.scalars(select(Tick).order_by(Tick.id.desc()).limit(1)).one()
            assert decision_store.latest_decision(session, "demo").decision_id == 2  # type: ignore[union-attr]
        assert tick.decision_id is None
        assert tick.record["decision_id"] is None
        assert tick.record["verdict"] == "unchanged: target equals decision 2 (pending)"


async def test_a_crashed_leader_is_replaced_when_its_lease_runs_out(db_url: str) -> None:
    """A planner that dies without releasing its lease (SIGKILL) hands the deployment to another
    process the moment the lease expires, LEASE_TTL_S after its last renewal: the standby asks
    every LEASE_RENEW_S and also at the expiry it read, not only at its own cadence."""
    async with running_worker(db_url) as a:
        await ticked(a, 1, "A's first tick")  # T0: A holds the lease until T0+30
        a.clock.advance(5)
        # A crashes at T0+5: its loop stops, its lease is left in the database.
        a.worker._task.cancel()
        await asyncio.gather(a.worker._task, return_exceptions=True)
        b = DeploymentWorker(
            config=a.worker.config,
            session_factory=a.sf,
            hub=a.worker._hub,
            metrics=a.metrics,
            clock=a.clock,
            holder=process_identity(),
        )
        b.start()
        await eventually(lambda: b.lease_checked_at == a.clock.now(), "B's first lease check", a)
        assert (b.is_leader, b.lease_expires_at) == (False, T0 + timedelta(seconds=LEASE_TTL_S))

        for step in range(1, 3):  # T0+15, +25: A's lease still holds
            a.clock.advance(LEASE_RENEW_S)
            await eventually(lambda: b.lease_checked_at == a.clock.now(), f"B's lease check {step}", a)
            assert b.is_leader is False
        a.clock.advance(5)  # T0+30, the expiry (not B's T0+35): B takes over and ticks at once
        await eventually(lambda: b.last_tick_at == a.clock.now(), "B's first tick", a)
        assert b.is_leader is True
        assert a.tick_times() == at(0, 30)
        await b.stop()


class InjectedFpm(FpmSubscriber):
    """An FPM subscriber without sockets: the test hands it the engines' records."""

    def start(self) -> InjectedFpm:
        return self

    def receive(self, record: ForwardPassMetrics) -> None:
        self._publish({record.key: (record, "inproc://engine", self._monotonic())}, [record], [])


class ScrapeLike:
    """A traffic source that, like the direct scrape, observes from its previous scrape (its
    start-up check, a standby's check, or its previous observation) to now."""

    name = "scrape-like"

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.baseline: datetime | None = None
        self.windows: list[tuple[datetime, datetime]] = []

    async def check(self) -> None:
        self.baseline = self.clock.now()

    async def observe(self, interval_s: float) -> TrafficObservation:
        now = self.clock.now()
        assert self.baseline is not None
        self.windows.append((self.baseline, now))
        duration_s = (now - self.baseline).total_seconds()
        self.baseline = now
        return TrafficObservation(duration_s=duration_s, num_req=0.0, isl=None, osl=None)


def fpm_record(index: int) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id="prefill-a",
        dp_rank=0,
        wall_time_s=0.01,
        scheduled=ScheduledRequestMetrics(num_prefill_requests=1, sum_prefill_tokens=1000 + index),
    )


async def test_a_standby_takes_over_without_counting_what_the_leader_counted(db_url: str) -> None:
    """What the first tick after a takeover reads starts at the standby's previous lease check,
    after the dead leader's last tick (which renewed its lease): the traffic window does not
    reach back to the standby's start-up, and the forward passes the leader trained on are not
    trained on again."""
    config = DeploymentsFile.model_validate(
        demo_config(scaling={"algorithm": "sla", "interval_s": 5.0})
    ).deployments[0]
    fpm_a = {role: InjectedFpm(["tcp://127.0.0.1:1"], engine_timeout_s=600) for role in config.roles}
    fpm_b = {role: InjectedFpm(["tcp://127.0.0.1:1"], engine_timeout_s=600) for role in config.roles}

    def publish(index: int) -> None:  # an engine's record reaches both planners
        fpm_a["prefill"].receive(fpm_record(index))
        fpm_b["prefill"].receive(fpm_record(index))

    async with running_worker(db_url, config, fpm=fpm_a) as a:
        a.worker.source = source_a = ScrapeLike(a.clock)
        source_b = ScrapeLike(a.clock)
        # A ticks at T0, renewing its lease until T0+30; B starts as its standby.
        await ticked(a, 1, "A's first tick")
        b = DeploymentWorker(
            config=config,
            session_factory=a.sf,
            hub=a.worker._hub,
            metrics=a.metrics,
            clock=a.clock,
            holder=process_identity(),
            source=source_b,
            fpm=fpm_b,
        )
        seen: list[tuple[datetime, Gathered]] = []
        tick = b.tick

        def recording_tick(now: datetime, gathered: Gathered | None = None) -> Any:
            seen.append((now, gathered))  # type: ignore[arg-type]
            return tick(now, gathered)

        b.tick = recording_tick  # type: ignore[method-assign]
        b.start()
        await eventually(lambda: b.lease_checked_at == a.clock.now(), "B's first lease check", a)
        assert b.is_leader is False

        publish(1)
        a.clock.advance(5)  # T0+5: A ticks and trains on record 1, renewing until T0+35
        await ticked(a, 2, "A's second tick")
        assert source_a.windows[-1] == (T0, T0 + timedelta(seconds=5))
        a.worker._task.cancel()  # A crashes
        await asyncio.gather(a.worker._task, return_exceptions=True)

        for offset_s, index in ((10, 2), (20, 3), (30, 4)):  # B's lease checks; records in between
            publish(index)
            a.clock.advance(offset_s - (a.clock.now() - T0).total_seconds())
            await eventually(lambda: b.lease_checked_at == a.clock.now(), f"B's check at +{offset_s}", a)
            assert b.is_leader is False
        publish(5)
        a.clock.advance(5)  # T0+35: A's lease ran out; B takes over and ticks at once
        await eventually(lambda: b.last_tick_at == a.clock.now(), "B's first tick", a)
        await b.stop()

    assert [now for now, _ in seen] == [T0 + timedelta(seconds=35)]
    gathered = seen[0][1]
    # Only what came after B's last standby check (T0+30): record 5, not the leader's record 1
    # nor the buffer since B started; and not taken as every record since the last tick.
    assert [r.scheduled.sum_prefill_tokens for r in gathered.fpm_new["prefill"]] == [1005]
    assert gathered.fpm_complete == {"prefill": False, "decode": False}
    assert source_b.windows == [(T0 + timedelta(seconds=30), T0 + timedelta(seconds=35))]
