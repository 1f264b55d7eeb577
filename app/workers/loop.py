"""One worker per deployment: every tick, gather -> `Planner.on_tick` -> persist -> actuate.

The decisions are the core planner's (app/core/planner.py); the worker owns the I/O around them,
one subject per module: gather.py reads what the tick at `now` needs (the traffic of an interval,
the engines' forward passes, the ready counts), tick.py runs the planner and stores its record,
learned state and decision, actuate.py hands a pending decision to the connector. This module
ties them into `DeploymentWorker`: `run_tick` gathers, ticks and actuates; `run` only schedules it
on the injected clock, after the deployment's source answers and its connector validates it (no
fixed sleep). Several planner processes may share a database: a lease in the deployment's state
row makes sure only one of them ticks a given deployment. The others stand by: they ask for the
lease at its expiry, keep their traffic baseline and forward passes current so a takeover counts
nothing twice, and resume the learned state the last leader stored (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from app.config import DeploymentConfig
from app.connectors.base import Connector
from app.connectors.virtual import DecisionHub
from app.core.cost.account import CostTotals
from app.core.errors import ConnectorError, SourceUnavailableError
from app.core.planner import Planner
from app.core.types import Role
from app.planner_setup import planner_settings
from app.reports.metrics import PlannerMetrics
from app.sources.fpm import FpmSubscriber
from app.sources.traffic import TrafficSource
from app.store import planner_state as state_store
from app.store import ticks as tick_store
from app.store.models import PlannerStateRow
from app.workers.actuate import ActuateMixin
from app.workers.clock import Clock
from app.workers.cost import CostMixin
from app.workers.gather import GatherMixin
from app.workers.lease import stop_leased
from app.workers.signals import SignalHealth
from app.workers.tick import TickMixin, TickReport

# The worker's lines go to this one logger from every module of it (gather, tick, actuate name it
# too), so that log settings and pipelines select a deployment worker's lines by one name.
log = logging.getLogger(__name__)


# The lease is renewed far more often than it expires, and independently of the tick interval;
# a standby asks as often and at the lease's expiry, so a planner that dies (even SIGKILLed)
# hands its deployments over within LEASE_TTL_S. The defaults of PLANNER_LEASE_TTL_S and
# PLANNER_LEASE_RENEW_S (app/config/settings.py).
LEASE_TTL_S = 30.0
LEASE_RENEW_S = 10.0
# While the source or the connector is not ready, ask again this often.
STARTUP_RETRY_S = 5.0


def process_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class DeploymentWorker(GatherMixin, TickMixin, ActuateMixin, CostMixin):
    def __init__(
        self,
        *,
        config: DeploymentConfig,
        session_factory: sessionmaker[Session],
        hub: DecisionHub,
        metrics: PlannerMetrics,
        clock: Clock,
        holder: str,
        planner: Planner | None = None,
        source: TrafficSource | None = None,
        connector: Connector | None = None,
        fpm: dict[Role, FpmSubscriber] | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
        lease_renew_s: float = LEASE_RENEW_S,
        in_fleet: bool = False,
    ) -> None:
        self.config = config
        # The deployments file's deployment; `config` is it with the live settings applied
        # (tick.py follows their revision, 0 while nothing was changed).
        self.file_config = config
        self.settings_revision = 0
        # Consecutive ticks without each signal, and those unavailable now (signals.py).
        self.signal_health = SignalHealth()
        # Under a fleet budget: every tick applies the grant the fleet step stored (app/workers/fleet.py).
        self.in_fleet = in_fleet
        self.planner = planner or Planner(
            planner_settings(config, None), model=None, model_error="no profile configured"
        )
        self.source = source
        self.connector = connector
        # One ForwardPassMetrics subscriber per role, started with the worker.
        self.fpm = fpm or {}
        self._overflow: dict[Role, int] = {}  # each subscriber's overflow count at the last tick
        # Empty once the source answers and the connector validated the deployment.
        self.startup_problems: list[str] = []
        # The last observation's failure, if it failed: /readyz shows it until one succeeds.
        self.source_error: str | None = None
        self._actuations: set[asyncio.Task[None]] = set()
        # Decision ids handed to the connector and not yet settled, so none goes out twice.
        self._actuating: set[int] = set()
        self._sf = session_factory
        self._hub = hub
        self._metrics = metrics
        self._clock = clock
        self._holder = holder
        self._task: asyncio.Task[None] | None = None
        self.lease_ttl_s = lease_ttl_s
        self.lease_renew_s = lease_renew_s
        self.is_leader = False
        self.lease_checked_at: datetime | None = None
        # Until when the holder's lease runs, as of the last check (ours when leading).
        self.lease_expires_at: datetime | None = None
        metrics.init_lease(config.name)
        self.last_tick_at: datetime | None = None
        self.last_error: str | None = None
        self.consecutive_failures = 0
        self._export_warned = False
        # The cost account, resumed from the last stored tick when this process takes the lease.
        self._cost_totals = CostTotals()
        self._cost_sample = None

    @property
    def interval_s(self) -> float:
        return self.config.tick_interval_s

    @property
    def gpus_per_engine(self) -> dict[Role, int]:
        return self.planner.settings.gpus_per_engine

    async def run_tick(self, now: datetime) -> TickReport | None:
        gathered = await self.gather(now)
        # The planner's steps (model fits, regressions) take CPU time: off the event loop.
        report = await asyncio.to_thread(self.tick, now, gathered)
        if report is not None and report.pending is not None:
            # Also a pending decision from an earlier tick or a pin (the cluster was not Ready).
            self.actuate(report.pending)
        return report

    async def wait_until_ready(self) -> None:
        """Block until the traffic source answers and the connector validates the deployment,
        asking again every STARTUP_RETRY_S; `startup_problems` says what is still missing."""
        while True:
            problems: list[str] = []
            if self.source is not None:
                try:
                    await self.source.check()
                except SourceUnavailableError as exc:
                    problems.append(f"traffic source not answering: {exc}")
            if self.connector is not None:
                try:
                    await self.connector.validate()
                    declared = await self.connector.gpus_per_engine()
                    self.planner.with_gpus_per_engine(declared or {})
                except ConnectorError as exc:
                    problems.append(f"connector: {exc}")
            self.startup_problems = problems
            if not problems:
                return
            log.warning(
                "[%s] waiting to start: %s",
                self.config.name,
                "; ".join(problems),
                extra={"deployment": self.config.name},
            )
            await self._clock.sleep_until(self._clock.now() + timedelta(seconds=STARTUP_RETRY_S))

    def renew_lease(self, now: datetime) -> bool:
        """Take or keep the right to tick this deployment; False while another process has it.
        Taking it (at start-up, or from a planner that stopped) resumes the learned state the
        last leader saved."""
        was_leader = self.is_leader
        name = self.config.name
        with self._sf() as session, session.begin():
            self.is_leader = tick_store.acquire_lease(
                session, deployment=name, holder=self._holder, now=now, ttl_s=self.lease_ttl_s
            )
            if self.is_leader:
                self.lease_expires_at = now + timedelta(seconds=self.lease_ttl_s)
            else:
                self.lease_expires_at = tick_store.lease_expires_at(session, name)
            if self.is_leader and not was_leader:
                self._resume(state_store.load_state(session, deployment=name))
                self.resume_cost(session)
        self.lease_checked_at = now
        self._metrics.observe_lease(
            name, was_leader=was_leader, is_leader=self.is_leader, expires_at=self.lease_expires_at
        )
        return self.is_leader

    def _next_lease_check(self, now: datetime) -> datetime:
        """Every `lease_renew_s`, and a standby also at the holder's expiry: a holder that
        stopped renewing is replaced the moment its lease runs out."""
        at = now + timedelta(seconds=self.lease_renew_s)
        expires = self.lease_expires_at
        if not self.is_leader and expires is not None and now < expires < at:
            return expires
        return at

    def _resume(self, saved: PlannerStateRow | None) -> None:
        name = self.config.name
        if saved is None:
            log.info("[%s] no learned state saved: learning from scratch", name, extra={"deployment": name})
            return
        try:
            self.planner.restore_state(saved.state)
        except ValueError as exc:
            log.warning(
                "[%s] learned state of %s not resumed: %s",
                name,
                saved.saved_at.isoformat(),
                exc,
                extra={"deployment": name},
            )
            return
        log.info(
            "[%s] resumed the learned state saved at %s",
            name,
            saved.saved_at.isoformat(),
            extra={"deployment": name},
        )

    async def run(self) -> None:
        await self.wait_until_ready()
        interval = timedelta(seconds=self.interval_s)
        next_tick = next_lease = self._clock.now()
        while True:
            await self._clock.sleep_until(min(next_tick, next_lease))
            now = self._clock.now()
            try:
                if now >= next_lease:
                    was_leader = self.is_leader
                    next_lease = now + timedelta(seconds=self.lease_renew_s)
                    leads = await asyncio.to_thread(self.renew_lease, now)
                    if leads and not was_leader:
                        next_tick = min(next_tick, now)  # just took over: tick at once
                    elif not leads:
                        await self._stand_by()
                    next_lease = self._next_lease_check(now)
                if now >= next_tick:
                    next_tick += interval
                    if next_tick <= now:  # fell behind: skip the missed ticks rather than burst
                        next_tick = now + interval
                    if self.is_leader:
                        await self.run_tick(now)
                        self.last_tick_at = now
                self.last_error = None
                self.consecutive_failures = 0
            except Exception as exc:  # keep ticking; the failure is counted and shown in /readyz
                self.consecutive_failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._metrics.tick_failures.labels(self.config.name).inc()
                log.exception(
                    "[%s] tick failed (%d in a row)",
                    self.config.name,
                    self.consecutive_failures,
                    extra={"deployment": self.config.name},
                )

    def start(self) -> None:
        for subscriber in self.fpm.values():
            subscriber.start()
        self._task = asyncio.create_task(self.run(), name=f"worker-{self.config.name}")

    async def stop(self) -> None:
        for subscriber in self.fpm.values():
            await asyncio.to_thread(subscriber.stop)
        name = self.config.name
        released = await stop_leased(
            self._task,
            self._sf,
            lambda session: tick_store.release_lease(session, deployment=name, holder=self._holder),
            what=f"worker lease of {name}",
            extra={"deployment": name},
        )
        if released:
            self._metrics.leader.labels(name).set(0)  # released, not lost

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()
