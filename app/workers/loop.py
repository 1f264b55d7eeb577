"""One worker loop per deployment: every tick, snapshot -> core -> persist -> announce.

A tick is a plain synchronous function of `now`, so tests call it directly; `run` only schedules
it on the injected clock. Several planner processes may share a database: a lease in the
deployment's state row makes sure only one of them ticks a given deployment.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.attributes import flag_modified

from app.config import DeploymentConfig
from app.connectors.virtual import DecisionHub
from app.core.tick import on_tick
from app.core.types import TickSnapshot
from app.metrics import PlannerMetrics
from app.store import decisions as decision_store
from app.store import ticks as tick_store
from app.store.models import Decision
from app.store.overrides import active_overrides
from app.workers.clock import Clock

log = logging.getLogger(__name__)

# The lease is renewed far more often than it expires, and independently of the tick interval,
# so a planner that dies (even SIGKILLed) hands its deployments over within LEASE_TTL_S.
LEASE_TTL_S = 30.0
LEASE_RENEW_S = 10.0


def process_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class TickReport:
    tick_id: int
    decision: Decision | None
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
    ) -> None:
        self.config = config
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

    def tick(self, now: datetime) -> TickReport | None:
        """Run one tick at `now`; None when another process holds this deployment's lease."""
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
            snapshot = TickSnapshot(
                deployment=name,
                roles=self.config.roles,
                config_bounds=self.config.bounds(),
                overrides=overrides,
                latest_decision=decision_store.view_of(latest) if latest else None,
            )
            result = on_tick(snapshot, now)
            record = dict(result.diagnostics)
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
        summary = f"[{name}] tick {tick.id}: {verdict}"
        log.info(summary)
        return TickReport(tick.id, decision, summary)

    def renew_lease(self, now: datetime) -> bool:
        """Take or keep the right to tick this deployment; False while another process has it."""
        with self._sf() as session, session.begin():
            self.is_leader = tick_store.acquire_lease(
                session, deployment=self.config.name, holder=self._holder, now=now, ttl_s=LEASE_TTL_S
            )
        self.lease_checked_at = now
        return self.is_leader

    async def run(self) -> None:
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
                        await asyncio.to_thread(self.tick, now)
                        self.last_tick_at = now
                self.last_error = None
                self.consecutive_failures = 0
            except Exception as exc:  # keep ticking; the failure is counted and shown in /readyz
                self.consecutive_failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._metrics.tick_failures.labels(self.config.name).inc()
                log.exception("[%s] tick failed (%d in a row)", self.config.name, self.consecutive_failures)

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=f"worker-{self.config.name}")

    async def stop(self) -> None:
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
