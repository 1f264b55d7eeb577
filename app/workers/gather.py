"""What a deployment worker reads for one tick, and only what the planner asks for: the traffic of
the window `Planner.needs` names (or why it is unknown), each role's forward passes since the last
tick and whether none was dropped, and the ready engines per role (the connector's report, else
the last acknowledged decision's observed replicas). A standby keeps the same baselines current,
so that the first tick after it takes the lease reads nothing the previous leader counted.

`GatherMixin` is this part of `DeploymentWorker` (loop.py), which sets the attributes it names.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.config import DeploymentConfig
from app.connectors.base import Connector
from app.core.errors import ConnectorError, SourceUnavailableError, WindowTooShortError
from app.core.perf.fpm import ForwardPassMetrics
from app.core.planner import Planner
from app.core.types import Replicas, Role, TrafficObservation
from app.core.victims import choose_removals
from app.sources.fpm import FpmSubscriber
from app.sources.fpm_snapshot import as_json as fpm_as_json
from app.sources.traffic import TrafficSource
from app.store import decisions as decision_store

# The worker's logger, whichever of its modules logs (loop.py says why).
log = logging.getLogger("app.workers.loop")


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
    # Per signal this tick assessed, whether it was read (signals.py counts the misses).
    signals: dict[str, bool] = field(default_factory=dict)
    ready_source: str | None = None  # where `ready` comes from
    # Shadow mode: per role what the incumbent autoscaler runs (the DGD's replicas, or the
    # orchestrator's reported counts); None: unknown, or not in shadow mode.
    incumbent: dict[Role, int] | None = None

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


class GatherMixin:
    """Reading a tick's inputs, and keeping their baselines current while standing by."""

    config: DeploymentConfig
    planner: Planner
    source: TrafficSource | None
    connector: Connector | None
    fpm: dict[Role, FpmSubscriber]
    source_error: str | None
    # The connector's last inventory read failure (None: it answered).
    inventory_error: str | None = None
    # Where the last ready counts came from (the tick record's `ready_source`).
    ready_source: str | None = None
    _overflow: dict[Role, int]
    _sf: sessionmaker[Session]

    async def _observe_traffic(self, interval_s: float) -> tuple[TrafficObservation | None, str | None]:
        """The traffic of the last `interval_s`, or why it is unknown (also kept in
        `source_error` for /readyz until an observation succeeds; a window too short to read is
        not a failing source)."""
        if self.source is None:
            return None, "no traffic source configured (sources.prometheus or sources.frontend_url)"
        try:
            observation = await self.source.observe(interval_s)
        except WindowTooShortError as exc:
            return None, str(exc)
        except SourceUnavailableError as exc:
            self.source_error = str(exc)
            return None, self.source_error
        self.source_error = None
        return observation, None

    async def _ready_counts(self) -> dict[Role, int] | None:
        """Ready engines per role: the connector's report (the DGD's status), else the freshest
        report of an orchestrator (observed counts on any acknowledgement or progress report,
        also of a superseded decision); None when neither is known. `ready_source` says which."""
        if self.connector is not None:
            self.ready_source = "connector"
            self.inventory_error = None
            try:
                return await self.connector.ready_counts()  # type: ignore[return-value]
            except ConnectorError as exc:
                self.inventory_error = str(exc)
                log.warning(
                    "[%s] ready counts unavailable: %s",
                    self.config.name,
                    exc,
                    extra={"deployment": self.config.name},
                )
                return None

        def read() -> dict[Role, int] | None:
            with self._sf() as session:
                observed = decision_store.freshest_observed(session, self.config.name)
            self.ready_source = observed.source if observed else None
            return dict(observed.replicas) if observed else None  # type: ignore[arg-type]

        return await asyncio.to_thread(read)

    def removals(self, previous: Replicas, target: Replicas) -> dict[Role, list[str]]:
        """The ready engines a change from `previous` to `target` would rather remove, from
        the engines' latest forward passes (for a decision made outside the tick: a pin).
        Thread-safe."""
        engines = {role: subscriber.snapshot().records() for role, subscriber in self.fpm.items()}
        return choose_removals(previous=previous, target=target, fpm=engines)

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
        # In shadow mode what runs is read at every tick: it is what the tick records beside the
        # planner's count.
        shadow = self.config.shadow
        asked = needs.fpm or needs.traffic_window_s is not None
        ready = await self._ready_counts() if asked or shadow else None
        incumbent = await self._incumbent(ready) if shadow else None
        signals = self._signals_read(needs.traffic_window_s is not None, traffic, error, fpm_new)
        return Gathered(
            traffic, error, fpm, fpm_new, complete, ready, sources, signals, self.ready_source, incumbent
        )

    async def _incumbent(self, ready: dict[Role, int] | None) -> dict[Role, int] | None:
        """Shadow mode: what the incumbent runs. Behind Kubernetes, the replicas the DGD's
        services are set to (whoever set them; `ready` lags them by the engines' start-up);
        behind the virtual connector, the orchestrator's reported counts, which are `ready`."""
        read = getattr(self.connector, "incumbent_replicas", None)
        if read is None:
            return ready
        try:
            return await read()  # type: ignore[no-any-return]
        except ConnectorError as exc:
            log.warning(
                "[%s] the incumbent's replicas unavailable: %s",
                self.config.name,
                exc,
                extra={"deployment": self.config.name},
            )
            return None

    def _signals_read(
        self,
        traffic_asked: bool,
        traffic: TrafficObservation | None,
        traffic_error: str | None,
        fpm_new: dict[Role, list[ForwardPassMetrics]],
    ) -> dict[str, bool]:
        """Which of the signals this tick asked for were read. The traffic: the source answered.
        A role's forward passes: assessed only when the frontend served requests in the window
        (engines serving them publish one per iteration; an idle engine may publish nothing).
        The inventory: the connector answered, whatever it said (a DGD not Ready is an answer; a
        virtual connector's inventory is the store's)."""
        read: dict[str, bool] = {}
        if traffic_asked and self.source is not None:
            read["traffic"] = traffic_error is None
        served = traffic is not None and (traffic.num_req or 0) > 0
        for role in self.fpm:
            if served and role in fpm_new:
                read[f"fpm_{role}"] = bool(fpm_new[role])
        if self.connector is not None and traffic_asked:
            read["inventory"] = self.inventory_error is None
        return read

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
