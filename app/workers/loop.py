"""One worker loop per deployment: every tick, observe -> predict -> decide -> persist -> actuate.

`run_tick` gathers what the core needs (the traffic of the last interval, the forecast, ready
counts, the engines' forward passes) and calls `tick`, a plain synchronous function of `now` and
those inputs, so tests call it directly; `run` only schedules it on the injected clock, after the
deployment's source answers and its connector validates it (no fixed sleep). Several planner
processes may share a database: a lease in the deployment's state row makes sure only one of
them ticks a given deployment.

With `scaling.algorithm: sla`, SLA scaling (app/core/sla_scaling.py) decides alone at every tick
(`scaling.interval_s`) and the seed's throughput and load steps do not run: two algorithms
proposing in turn would undo each other's targets.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.attributes import flag_modified

from app.config import DeploymentConfig
from app.connectors.base import Connector
from app.connectors.virtual import DecisionHub
from app.core.cadence import Cadence, Due
from app.core.errors import ConnectorError, ConnectorNotReadyError, SourceUnavailableError
from app.core.fpm import ForwardPassMetrics
from app.core.load import LoadInput, LoadTick, PendingTarget
from app.core.sla_scaling import SlaInput, SlaState, SlaTick, TrafficSample
from app.core.throughput import ThroughputInput
from app.core.tick import on_tick
from app.core.types import DecisionStatus, DecisionView, Replicas, Role, TickSnapshot, TrafficObservation
from app.metrics import PlannerMetrics
from app.sources.fpm import FpmSubscriber
from app.sources.fpm import as_json as fpm_as_json
from app.sources.traffic import TrafficSource
from app.store import decisions as decision_store
from app.store import ticks as tick_store
from app.store.models import Decision
from app.store.overrides import active_overrides
from app.workers.clock import Clock
from app.workers.resources import ModelResources, make_sla_settings

log = logging.getLogger(__name__)

# The lease is renewed far more often than it expires, and independently of the tick interval,
# so a planner that dies (even SIGKILLed) hands its deployments over within LEASE_TTL_S.
LEASE_TTL_S = 30.0
LEASE_RENEW_S = 10.0
# While the source or the connector is not ready, ask again this often.
STARTUP_RETRY_S = 5.0


def process_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class EngineObservation:
    """What the engines looked like this tick (load and SLA scaling read it): the latest FPM per
    engine per role, the ready counts, and the subscribers' counters (malformed, dropped, expired
    engines) for the tick record."""

    fpm: dict[Role, dict]
    ready: dict[Role, int]
    sources: dict[str, Any]
    # False while neither the connector, an acknowledged decision nor every role's FPM says how
    # many engines run: the ready counts are then zeros that mean "unknown".
    inventory_known: bool = True


@dataclass(frozen=True)
class SlaObservation:
    """What SLA scaling saw this tick: the frontend's traffic since the previous tick (None when
    the source could not say, with its reason) and the engines."""

    traffic: TrafficSample | None
    observation: TrafficObservation | None
    traffic_error: str | None
    engines: EngineObservation

    def as_json(self) -> dict[str, Any]:
        observed = None
        if self.observation is not None:
            observed = asdict(self.observation)
            # JSON has no infinity (PostgreSQL refuses it): the open bucket is "+Inf", as in the
            # Prometheus exposition.
            observed["isl_buckets"] = [
                [bound if math.isfinite(bound) else "+Inf", count]
                for bound, count in self.observation.isl_buckets
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
        resources: ModelResources | None = None,
        source: TrafficSource | None = None,
        connector: Connector | None = None,
        fpm: dict[Role, FpmSubscriber] | None = None,
    ) -> None:
        self.config = config
        self.resources = resources or ModelResources(None, "no profile configured", None, 0)
        self.source = source
        self.connector = connector
        # Load scaling: one ForwardPassMetrics subscriber per role, started with the worker.
        self.fpm = fpm or {}
        self._cadence: Cadence | None = None
        # Both modes on: the floor of the last throughput step, for the load ticks in between.
        self._floor: Replicas | None = None
        # SLA scaling (None: the seed's modes decide) and its memory between ticks: the traffic
        # samples, wishes, measured scales and scaling latency it learns from. One per worker.
        self._sla_settings = (
            make_sla_settings(config, self.resources.model) if config.scaling.algorithm == "sla" else None
        )
        self.sla_state = SlaState()
        self.gpus_per_engine: dict[Role, int] = {r: config.role(r).gpus_per_engine for r in config.roles}
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
        self.is_leader = False
        self.lease_checked_at: datetime | None = None
        self.last_tick_at: datetime | None = None
        self.last_error: str | None = None
        self.consecutive_failures = 0

    @property
    def interval_s(self) -> float:
        return self.config.tick_interval_s

    def tick(
        self,
        now: datetime,
        throughput: ThroughputInput | None = None,
        load: EngineObservation | None = None,
        sla: SlaObservation | None = None,
    ) -> TickReport | None:
        """Decide and persist one tick at `now` from inputs already gathered; None when another
        process holds this deployment's lease."""
        name = self.config.name
        if not self.renew_lease(now):
            return None

        with self._sf() as session, session.begin():
            expired = None
            if self.config.awaits_ack:
                expired = decision_store.expire_overdue(
                    session, deployment=name, now=now, ack_timeout_s=self.config.connector.ack_timeout_s
                )
            latest = decision_store.latest_decision(session, name)
            overrides = active_overrides(session, name, now)
            latest_view = decision_store.view_of(latest) if latest else None
            snapshot = TickSnapshot(
                deployment=name,
                roles=self.config.roles,
                config_bounds=self.config.bounds(),
                overrides=overrides,
                latest_decision=latest_view,
                throughput=throughput,
                throughput_settings=(
                    self.config.throughput_settings(self.gpus_per_engine) if throughput is not None else None
                ),
                gpus_per_engine=self.gpus_per_engine,
                budget_gpus=self.config.gpu_budget,
                load=self._load_tick(load, latest_view, now) if load is not None else None,
                load_enabled=self.config.load.enabled,
                sla=self._sla_tick(sla, latest_view, now) if sla is not None else None,
            )
            result = on_tick(snapshot, now)
            if result.throughput_floor is not None:
                self._floor = result.throughput_floor
            record = dict(result.diagnostics)
            engines = load if load is not None else sla.engines if sla is not None else None
            if engines is not None:
                record["fpm"] = engines.sources
            if sla is not None:
                # The throughput step records what it observed; SLA scaling's diagnostics do not.
                record["traffic"] = sla.as_json()
            record["expired_decision_id"] = expired.decision_id if expired else None
            tick = tick_store.add_tick(session, deployment=name, at=now, record=record)

            decision = None
            if result.target is not None and result.source is not None:
                proposal = decision_store.propose_decision(
                    session,
                    deployment=name,
                    target=result.target,
                    source=result.source,
                    reasons=result.reasons,
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
            record["verdict"] = verdict
            record["decision_id"] = decision.decision_id if decision else None
            tick.record = record
            flag_modified(tick, "record")  # the same dict object: SQLAlchemy cannot see the change
            tick.decision_id = record["decision_id"]

        if decision is not None:
            self._hub.announce(decision)
        self._metrics.paused.labels(name).set(1 if overrides.paused else 0)
        self._metrics.ticks.labels(name).inc()
        self._metrics.observe_throughput(name, record.get("throughput"))
        self._metrics.observe_load(name, record.get("load"), load_enabled=self.config.load.enabled)
        self._metrics.observe_sla(name, record.get("sla"))
        sla_state = record.get("sla")
        if sla_state:
            notes = f"sla {sla_state['reason']}: {sla_state['detail']}"
        else:
            throughput_state = record.get("throughput")
            throughput_note = (
                f"throughput {throughput_state['reason']}: {throughput_state['detail']}"
                if throughput_state
                else "throughput off"
            )
            load_state = record.get("load")
            load_note = f"load {load_state['reason']}: {load_state['detail']}" if load_state else "load off"
            notes = f"{throughput_note}; {load_note}"
        summary = f"[{name}] tick {tick.id}: target {result.target}; {notes}; {verdict}"
        log.info(summary)
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

    async def gather_throughput(self) -> ThroughputInput:
        """Observe the last interval, feed the predictors, forecast the next one."""
        observation, error = await self._observe_traffic(self.config.throughput.interval_s)
        predictor = self.resources.predictor
        forecast = None
        if observation is not None and predictor is not None:
            # Model fits (ARIMA, Prophet) take CPU time: keep them off the event loop.
            await asyncio.to_thread(predictor.observe, observation)
            forecast = await asyncio.to_thread(predictor.forecast)
        return ThroughputInput(
            observation=observation,
            observation_error=error,
            forecast=forecast,
            model=self.resources.model,
            model_error=self.resources.model_error,
            decode_engines=await self._decode_engines(),
        )

    async def _decode_engines(self) -> int | None:
        counts = await self._ready_counts()
        return counts.get("decode") if counts else None

    async def _ready_counts(self) -> dict[str, int] | None:
        """Ready engines per role: the connector's report, else the last acknowledged decision's
        observed replicas; None when neither is known."""
        if self.connector is not None:
            try:
                return await self.connector.ready_counts()
            except ConnectorError as exc:
                log.warning("[%s] ready counts unavailable: %s", self.config.name, exc)
                return None

        def read() -> dict[str, int] | None:
            with self._sf() as session:
                confirmed = decision_store.last_acknowledged(session, self.config.name)
            if confirmed is None:
                return None
            return dict(confirmed.observed or decision_store.replicas_of(confirmed))

        return await asyncio.to_thread(read)

    def _load_tick(self, load: EngineObservation, latest: DecisionView | None, now: datetime) -> LoadTick:
        models, settings = self.resources.load_models, self.resources.load_settings
        assert models is not None and settings is not None, "load scaling without its models"
        in_force = latest is not None and latest.status in (DecisionStatus.PENDING, DecisionStatus.SUCCEEDED)
        load_input = LoadInput(
            fpm=load.fpm,
            ready=load.ready,
            now=now,
            # The last target stays "pending" for the load step until the ready counts reach it.
            pending=PendingTarget(latest.replicas, latest.created_at) if in_force else None,  # type: ignore[union-attr]
            throughput_floor=self._floor,
        )
        return LoadTick(models, load_input, settings)

    async def gather_load(self) -> EngineObservation:
        """Train the regressions on every iteration record since the last load tick; the latest
        record per engine, and the ready counts to reconcile them with."""
        return await self._gather_engines(train=True)

    async def gather_sla(self, now: datetime) -> SlaObservation:
        """SLA scaling's input: the traffic since the previous tick (a sample ending `now`; None
        when the source failed or does not know the request count), the latest forward pass per
        engine (nothing is trained: SLA scaling reads iterations, it fits no regression) and the
        ready counts."""
        observation, error = await self._observe_traffic(self.interval_s)
        traffic = None
        if observation is not None and observation.num_req is not None:
            traffic = TrafficSample(
                end_s=now.timestamp(),
                duration_s=observation.duration_s,
                num_req=observation.num_req,
                isl=observation.isl,
                osl=observation.osl,
                isl_buckets=observation.isl_buckets,
            )
        elif observation is not None:
            error = "the source does not know the request count"
        return SlaObservation(traffic, observation, error, await self._gather_engines(train=False))

    def _sla_tick(self, sla: SlaObservation, latest: DecisionView | None, now: datetime) -> SlaTick:
        assert self._sla_settings is not None, "SLA scaling without its settings"
        ready = sla.engines.ready
        in_force = latest is not None and latest.status in (DecisionStatus.PENDING, DecisionStatus.SUCCEEDED)
        # What was last ordered, engines still starting included: SLA scaling compares its wish
        # with it, and measures its scaling latency by how long the ready counts take to reach it.
        expected = (
            {role: latest.replicas.get(role, ready[role]) for role in self.config.roles}  # type: ignore[union-attr]
            if in_force
            else dict(ready)
        )
        sla_input = SlaInput(
            now_s=now.timestamp(),
            traffic=sla.traffic,
            fpm=sla.engines.fpm,
            ready=ready,
            expected=expected,
            # A decision in force is an inventory of its own: it says what the planner ordered.
            inventory_known=in_force or sla.engines.inventory_known,
        )
        return SlaTick(self.resources.model, self.sla_state, sla_input, self._sla_settings)

    async def _gather_engines(self, *, train: bool) -> EngineObservation:
        trained: dict[Role, list[ForwardPassMetrics]] = {}
        fpm: dict[Role, dict] = {}
        sources: dict[str, Any] = {}
        for role in self.config.roles:
            subscriber = self.fpm.get(role)
            if subscriber is None:
                fpm[role] = {}
                continue
            # Taken even when nothing trains on them (SLA scaling), so the subscriber's buffer
            # does not fill up and count them as overflow.
            trained[role] = subscriber.new_trainable_records()
            snapshot = subscriber.snapshot()
            fpm[role] = snapshot.records()
            sources[role] = fpm_as_json(snapshot)
        models = self.resources.load_models
        if train and models is not None:
            await asyncio.to_thread(models.observe_many, trained)
        counts = await self._ready_counts()
        # Without an inventory (no connector report, no acknowledged decision yet), the engines
        # that report FPM are the inventory, once every role has one reporting.
        ready = {role: (counts or {}).get(role, len({w for w, _ in fpm[role]})) for role in self.config.roles}
        known = counts is not None or all(fpm[role] for role in self.config.roles)
        return EngineObservation(fpm=fpm, ready=ready, sources=sources, inventory_known=known)

    def _due(self, now: datetime) -> Due:
        """Which modes run at `now`: both at the first tick, then each on its own interval."""
        now_s = now.timestamp()
        if self._cadence is None:
            load_s = self.config.load.interval_s if self.config.load.enabled else None
            throughput_s = self.config.throughput.interval_s if self.config.throughput.enabled else None
            self._cadence = Cadence(
                load_s,
                throughput_s,
                next_load_s=now_s if load_s else math.inf,
                next_throughput_s=now_s if throughput_s else math.inf,
            )
        due = self._cadence.due(now_s)
        self._cadence = self._cadence.after(now_s, due)
        return due

    async def run_tick(self, now: datetime) -> TickReport | None:
        if self._sla_settings is not None:
            # SLA scaling decides alone, every tick: the seed's steps must not run beside it.
            sla = await self.gather_sla(now)
            report = await asyncio.to_thread(self.tick, now, None, None, sla)
        else:
            due = self._due(now)
            throughput = await self.gather_throughput() if due.throughput else None
            load = await self.gather_load() if due.load and self.resources.load_models is not None else None
            report = await asyncio.to_thread(self.tick, now, throughput, load)
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
            log.info("[%s] decision %d waits: %s", self.config.name, decision.decision_id, exc)
            self._actuating.discard(decision.decision_id)
            return
        except ConnectorError as exc:
            status, message = DecisionStatus.FAILED, f"{self.config.connector.type}: {exc}"
        log.info("[%s] decision %d %s: %s", self.config.name, decision.decision_id, status, message)
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
                    for role, gpus in (declared or {}).items():
                        if gpus and role in self.gpus_per_engine:
                            self.gpus_per_engine[role] = gpus
                except ConnectorError as exc:
                    problems.append(f"connector: {exc}")
            self.startup_problems = problems
            if not problems:
                return
            log.warning("[%s] waiting to start: %s", self.config.name, "; ".join(problems))
            await self._clock.sleep_until(self._clock.now() + timedelta(seconds=STARTUP_RETRY_S))

    def renew_lease(self, now: datetime) -> bool:
        """Take or keep the right to tick this deployment; False while another process has it."""
        with self._sf() as session, session.begin():
            self.is_leader = tick_store.acquire_lease(
                session, deployment=self.config.name, holder=self._holder, now=now, ttl_s=LEASE_TTL_S
            )
        self.lease_checked_at = now
        return self.is_leader

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
                    next_lease = now + timedelta(seconds=LEASE_RENEW_S)
                    if await asyncio.to_thread(self.renew_lease, now) and not was_leader:
                        next_tick = min(next_tick, now)  # just took over: tick at once
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
                log.exception("[%s] tick failed (%d in a row)", self.config.name, self.consecutive_failures)

    def start(self) -> None:
        for subscriber in self.fpm.values():
            subscriber.start()
        self._task = asyncio.create_task(self.run(), name=f"worker-{self.config.name}")

    async def stop(self) -> None:
        for subscriber in self.fpm.values():
            await asyncio.to_thread(subscriber.stop)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        try:
            with self._sf() as session, session.begin():
                tick_store.release_lease(session, deployment=self.config.name, holder=self._holder)
        except Exception:  # shutting down; the lease expires on its own
            log.warning("[%s] could not release the worker lease", self.config.name, exc_info=True)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()
