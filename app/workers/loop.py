"""One worker loop per deployment: every tick, gather -> `Planner.on_tick` -> persist -> actuate.

The decisions are the core planner's (app/core/planner.py); the worker owns the I/O around them.
`run_tick` asks the planner what the tick at `now` needs (the traffic of an interval, the
engines' forward passes), gathers only that, and calls `tick`, a plain synchronous function of
`now` and what was gathered, so tests call it directly; `run` only schedules it on the injected
clock, after the deployment's source answers and its connector validates it (no fixed sleep).
What the planner learned in a tick is adopted only once the tick's record and decision are
stored, so a failed write loses that tick and counts nothing twice. Several planner processes
may share a database: a lease in the deployment's state row makes sure only one of them ticks a
given deployment. The others stand by: they ask for the lease at its expiry, keep their traffic
baseline and forward passes current so a takeover counts nothing twice either, and resume the
learned state the last leader stored (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.config import DeploymentConfig
from app.connectors.base import Connector
from app.connectors.virtual import DecisionHub
from app.core.diagnostics import TickDiagnostics
from app.core.errors import ConnectorError, ConnectorNotReadyError, SourceUnavailableError
from app.core.fleet.grants import asked_of, grant_record, with_grant
from app.core.perf.fpm import ForwardPassMetrics
from app.core.planner import Effects, Planner, TickInput
from app.core.types import DecisionStatus, Role, TrafficObservation
from app.planner_setup import planner_settings
from app.reports.metrics import PlannerMetrics
from app.sources.fpm import FpmSubscriber
from app.sources.fpm import as_json as fpm_as_json
from app.sources.traffic import TrafficSource
from app.store import decisions as decision_store
from app.store import fleet as fleet_store
from app.store import planner_state as state_store
from app.store import ticks as tick_store
from app.store.models import Decision, PlannerStateRow
from app.store.overrides import active_overrides
from app.workers.clock import Clock
from app.workers.lease import stop_leased

log = logging.getLogger(__name__)

# The lease is renewed far more often than it expires, and independently of the tick interval;
# a standby asks as often and at the lease's expiry, so a planner that dies (even SIGKILLed)
# hands its deployments over within LEASE_TTL_S. The defaults of PLANNER_LEASE_TTL_S and
# PLANNER_LEASE_RENEW_S (app/config.py).
LEASE_TTL_S = 30.0
LEASE_RENEW_S = 10.0
# While the source or the connector is not ready, ask again this often.
STARTUP_RETRY_S = 5.0


def process_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Gathered:
    """What the worker read for one tick, as the planner asked for it: the traffic (or why it is
    unknown), the engines' latest forward passes and the records since the last tick, the ready
    counts (None: no inventory says), and the FPM subscribers' counters for the tick record."""

    traffic: TrafficObservation | None = None
    traffic_error: str | None = None
    fpm: dict[Role, dict] = field(default_factory=dict)
    fpm_new: dict[Role, list[ForwardPassMetrics]] = field(default_factory=dict)
    # Per role: no record was dropped since the previous tick, so `fpm_new` is the engines' busy time.
    fpm_complete: dict[Role, bool] = field(default_factory=dict)
    ready: dict[Role, int] | None = None
    fpm_sources: dict[str, Any] | None = None

    def traffic_json(self) -> dict[str, Any]:
        observed = None
        if self.traffic is not None:
            observed = asdict(self.traffic)
            # JSON has no infinity (PostgreSQL refuses it): the open bucket is "+Inf", as in the
            # Prometheus exposition.
            observed["isl_buckets"] = [
                [bound if math.isfinite(bound) else "+Inf", count]
                for bound, count in self.traffic.isl_buckets
            ]
        return {"observed": observed, "error": self.traffic_error}


@dataclass(frozen=True)
class TickReport:
    tick_id: int
    decision: Decision | None  # created by this tick
    pending: Decision | None  # the latest decision if it still awaits its outcome (new or older)
    summary: str


class DeploymentWorker:
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

    @property
    def interval_s(self) -> float:
        return self.config.tick_interval_s

    @property
    def gpus_per_engine(self) -> dict[Role, int]:
        return self.planner.settings.gpus_per_engine

    def tick(self, now: datetime, gathered: Gathered | None = None) -> TickReport | None:
        """Decide and persist one tick at `now` from what was gathered; None when another
        process holds this deployment's lease."""
        name = self.config.name
        if not self.renew_lease(now):
            return None
        gathered = gathered or Gathered()
        with self._sf() as session, session.begin():
            expired = None
            if self.config.awaits_ack:
                expired = decision_store.expire_overdue(
                    session, deployment=name, now=now, ack_timeout_s=self.config.connector.ack_timeout_s
                )
            latest = decision_store.latest_decision(session, name)
            overrides = active_overrides(session, name, now)
            grant = fleet_store.stored_grant(session, name) if self.in_fleet else None
            # The grant binds as per-role maximum bounds, exactly as `planner replay` applies it.
            overrides = with_grant(overrides, grant, self.planner.settings.bounds)
            effects = self.planner.on_tick(
                TickInput(
                    now_s=now.timestamp(),
                    overrides=overrides,
                    latest_decision=decision_store.view_of(latest) if latest else None,
                    traffic=gathered.traffic,
                    traffic_error=gathered.traffic_error,
                    fpm=gathered.fpm,
                    fpm_new=gathered.fpm_new,
                    fpm_complete=gathered.fpm_complete,
                    ready=gathered.ready,
                )
            )
            stages = [st.as_dict() for st in effects.stages]
            fleet = grant_record(
                grant,
                asked=asked_of(stages),
                target=effects.target,
                at=grant.get("at") if grant else None,
            )
            reasons = effects.reasons
            if fleet is not None and fleet["note"]:
                # The decision says when the fleet, not its own planner, set its numbers.
                reasons = [*reasons, f"fleet: {fleet['note']}"]
            record = effects.diagnostics.model_copy(
                update={
                    "at": now.isoformat(),
                    "fleet": fleet,
                    "fpm": gathered.fpm_sources,
                    # The throughput step records what it observed; SLA scaling's diagnostics do not.
                    "traffic": gathered.traffic_json() if self.planner.settings.sla else None,
                    "expired_decision_id": expired.decision_id if expired else None,
                }
            )
            tick = tick_store.add_tick(session, deployment=name, at=now, record=record.as_json())
            saved = self._export(effects)
            if saved is not None:
                # With the tick it belongs to: a restart resumes from the last stored tick.
                state_store.save_state(session, deployment=name, state=saved, at=now)

            decision = None
            if effects.target is not None and effects.source is not None:
                proposal = decision_store.propose_decision(
                    session,
                    deployment=name,
                    target=effects.target,
                    source=effects.source,
                    reasons=reasons,
                    now=now,
                    ack_timeout_s=self.config.connector.ack_timeout_s,
                    await_ack=self.config.awaits_ack,
                    tick_id=tick.id,
                    override_id=overrides.pin_id,
                )
                decision = proposal.decision
                verdict = f"{proposal.outcome.verdict}: {proposal.outcome.reason}"
            else:
                verdict = "hold: no target"
            record = record.model_copy(
                update={"verdict": verdict, "decision_id": decision.decision_id if decision else None}
            )
            tick.record = record.as_json()
            tick.decision_id = record.decision_id
        # Stored: what the tick learned is the planner's now (a failed write above keeps the old).
        self.planner.commit(effects)

        if decision is not None:
            self._hub.announce(decision)
        self._metrics.paused.labels(name).set(1 if overrides.paused else 0)
        self._metrics.ticks.labels(name).inc()
        self._metrics.observe_throughput(name, record.throughput)
        self._metrics.observe_load(name, record.load, load_enabled=self.config.load.enabled)
        self._metrics.observe_sla(name, record.sla)
        summary = f"[{name}] tick {tick.id}: target {effects.target}; {_notes(record)}; {verdict}"
        log.info(
            summary,
            extra={
                "deployment": name,
                "tick_id": tick.id,
                "decision_id": decision.decision_id if decision else None,
            },
        )
        pending = decision or (
            latest if latest is not None and latest.status == DecisionStatus.PENDING else None
        )
        return TickReport(tick.id, decision, pending, summary)

    async def _observe_traffic(self, interval_s: float) -> tuple[TrafficObservation | None, str | None]:
        """The traffic of the last `interval_s`, or why it is unknown (also kept in
        `source_error` for /readyz until an observation succeeds)."""
        if self.source is None:
            return None, "no traffic source configured (sources.prometheus or sources.frontend_url)"
        observation, error = None, None
        try:
            observation = await self.source.observe(interval_s)
        except SourceUnavailableError as exc:
            error = str(exc)
        self.source_error = error
        return observation, error

    async def _ready_counts(self) -> dict[Role, int] | None:
        """Ready engines per role: the connector's report, else the last acknowledged decision's
        observed replicas; None when neither is known."""
        if self.connector is not None:
            try:
                return await self.connector.ready_counts()  # type: ignore[return-value]
            except ConnectorError as exc:
                log.warning(
                    "[%s] ready counts unavailable: %s",
                    self.config.name,
                    exc,
                    extra={"deployment": self.config.name},
                )
                return None

        def read() -> dict[Role, int] | None:
            with self._sf() as session:
                confirmed = decision_store.last_acknowledged(session, self.config.name)
            if confirmed is None:
                return None
            return dict(confirmed.observed or decision_store.replicas_of(confirmed))  # type: ignore[arg-type]

        return await asyncio.to_thread(read)

    async def gather(self, now: datetime) -> Gathered:
        """What the planner's tick at `now` needs, and only that."""
        needs = self.planner.needs(now.timestamp())
        traffic, error = None, None
        if needs.traffic_window_s is not None:
            traffic, error = await self._observe_traffic(needs.traffic_window_s)
        fpm: dict[Role, dict] = {}
        fpm_new: dict[Role, list[ForwardPassMetrics]] = {}
        complete: dict[Role, bool] = {}
        sources: dict[str, Any] | None = None
        if needs.fpm:
            sources = {}
            for role in self.config.roles:
                subscriber = self.fpm.get(role)
                if subscriber is None:
                    fpm[role] = {}
                    continue
                # Taken even when nothing trains on them (SLA scaling), so the subscriber's buffer
                # does not fill up and count them as overflow.
                fpm_new[role] = subscriber.new_trainable_records()
                snapshot = subscriber.snapshot()
                # Complete only from the second tick on, and only when nothing overflowed since.
                before = self._overflow.get(role)
                complete[role] = before is not None and snapshot.trainable_overflow == before
                self._overflow[role] = snapshot.trainable_overflow
                fpm[role] = snapshot.records()
                sources[role] = fpm_as_json(snapshot)
        ready = await self._ready_counts() if needs.fpm or needs.traffic_window_s is not None else None
        return Gathered(traffic, error, fpm, fpm_new, complete, ready, sources)

    async def run_tick(self, now: datetime) -> TickReport | None:
        gathered = await self.gather(now)
        # The planner's steps (model fits, regressions) take CPU time: off the event loop.
        report = await asyncio.to_thread(self.tick, now, gathered)
        if report is not None and report.pending is not None:
            # Also a pending decision from an earlier tick or a pin (the cluster was not Ready).
            self.actuate(report.pending)
        return report

    def actuate(self, decision: Decision) -> None:
        """Hand a pending decision to the connector in the background, once; virtual and none
        deployments have no connector (the orchestrator, or nobody, acknowledges)."""
        if self.connector is None or not self.is_leader or decision.decision_id in self._actuating:
            return
        self._actuating.add(decision.decision_id)
        task = asyncio.create_task(self._actuate(decision))
        self._actuations.add(task)
        task.add_done_callback(self._actuations.discard)

    async def on_decision_stored(self, decision_id: int) -> None:
        """A decision was stored outside the tick (an operator pin): actuate it now, not at
        the next tick."""
        if self.connector is None or not self.is_leader:
            return

        def load() -> Decision:
            with self._sf() as session:
                return decision_store.get_decision_or_raise(session, self.config.name, decision_id)

        decision = await asyncio.to_thread(load)
        if decision.status == DecisionStatus.PENDING:
            self.actuate(decision)

    async def _actuate(self, decision: Decision) -> None:
        """Hand a decision to the cluster; its outcome is the decision's acknowledgement."""
        replicas = decision_store.replicas_of(decision)
        try:
            await self.connector.set_replicas(replicas)  # type: ignore[union-attr]
            status, message = (
                DecisionStatus.SUCCEEDED,
                f"{self.config.connector.type}: replicas set to {replicas}",
            )
        except ConnectorNotReadyError as exc:
            # Stays pending; the next tick hands it over again.
            log.info(
                "[%s] decision %d waits: %s",
                self.config.name,
                decision.decision_id,
                exc,
                extra={"deployment": self.config.name, "decision_id": decision.decision_id},
            )
            self._actuating.discard(decision.decision_id)
            return
        except ConnectorError as exc:
            status, message = DecisionStatus.FAILED, f"{self.config.connector.type}: {exc}"
        log.info(
            "[%s] decision %d %s: %s",
            self.config.name,
            decision.decision_id,
            status,
            message,
            extra={"deployment": self.config.name, "decision_id": decision.decision_id},
        )
        now = self._clock.now()

        def record() -> None:
            with self._sf() as session, session.begin():
                decision_store.complete_decision(
                    session,
                    deployment=self.config.name,
                    decision_id=decision.decision_id,
                    status=status,
                    observed=replicas if status == DecisionStatus.SUCCEEDED else None,
                    message=message,
                    actor_role="connector",
                    now=now,
                )

        await asyncio.to_thread(record)
        self._actuating.discard(decision.decision_id)

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

    async def _stand_by(self) -> None:
        """At every lease check that another process wins: start what the first tick after a takeover
        reads from now, so that it holds nothing the leader already counted. The leader's last
        tick renewed its lease, so it was at least `lease_ttl_s - lease_renew_s` before the
        takeover, and this check is later. The traffic source takes a new baseline (a direct
        scrape would otherwise difference against its start-up scrape, a window overlapping every
        observation of the leader) and says whether it answers (/readyz); the forward passes
        received so far are dropped (the leader trained on them, up to its last tick), and the
        first tick's are not taken as complete (they start at this check, not at the last tick)."""
        if self.source is not None:
            try:
                await self.source.check()
                self.source_error = None
            except SourceUnavailableError as exc:
                self.source_error = str(exc)
        for subscriber in self.fpm.values():
            subscriber.new_trainable_records()
        self._overflow.clear()

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

    def _export(self, effects: Effects) -> bytes | None:
        """The state this tick would commit, or None (and one warning) where it cannot be saved:
        a predictor whose fitted model does not pickle keeps learning, but not across restarts."""
        try:
            return self.planner.export_state(effects)
        except Exception as exc:  # pickling arbitrary fitted models
            if not self._export_warned:
                kind = type(exc).__name__
                log.warning(
                    "[%s] learned state not saved (%s: %s)",
                    self.config.name,
                    kind,
                    exc,
                    extra={"deployment": self.config.name},
                )
                self._export_warned = True
            return None

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


def _notes(record: TickDiagnostics) -> str:
    """The log line's account of the step that proposed."""
    if record.sla is not None:
        return f"sla {record.sla.reason}: {record.sla.detail}"
    throughput, load = record.throughput, record.load
    throughput_note = (
        f"throughput {throughput.reason}: {throughput.detail}" if throughput else "throughput off"
    )
    load_note = f"load {load.reason}: {load.detail}" if load else "load off"
    return f"{throughput_note}; {load_note}"
