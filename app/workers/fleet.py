"""The fleet loop of `planner serve`: every `fleet.interval_s`, the fleet step over all
deployments, its grants stored for their workers.

It reads each deployment's wish from its last stored tick (the proposal stage, within its
bounds: app/core/fleet/grants.py `wish_of`, as the replay does), calls `fleet_step` with `now`
from the injected clock, and stores the answer in the `fleet_state` row: the grants, the fleet
state the next step needs, the wishes and the last moves. Each deployment's worker reads its
grant from that row at its next tick and applies it as per-role maximum bounds
(`with_grant`), so grants cross processes through the database exactly like decisions do.

Leadership: the fleet step has its own lease in the `fleet_state` row, taken and renewed like
a deployment worker's lease (same TTL and renewal). With several `planner serve` processes on
one database, one of them runs the fleet step; the deployments' workers may lead in other
processes, since they only read the stored grants. A process that takes the lease over (or a
restart) resumes from the stored fleet state: the same grants, and the same hold times.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.config import DeploymentsFile, FleetConfig
from app.core.fleet.grants import present_of, wish_of
from app.core.fleet.step import FleetDecision, FleetMember, FleetSettings, FleetState, fleet_step
from app.core.types import Role
from app.reports.metrics import PlannerMetrics
from app.store import decisions as decision_store
from app.store import fleet as fleet_store
from app.store import settings as settings_store
from app.store import ticks as tick_store
from app.workers.clock import Clock
from app.workers.lease import stop_leased

log = logging.getLogger(__name__)

# The moves kept for GET /fleet ("who took from whom"), newest last.
RECENT_MOVES = 50


class FleetWorker:
    def __init__(
        self,
        *,
        deployments: DeploymentsFile,
        session_factory: sessionmaker[Session],
        metrics: PlannerMetrics,
        clock: Clock,
        holder: str,
        gpus_per_engine: Callable[[str], Mapping[Role, int]],
        lease_ttl_s: float,
        lease_renew_s: float,
    ) -> None:
        assert deployments.fleet is not None
        self.fleet: FleetConfig = deployments.fleet
        self.deployments = deployments
        self._sf = session_factory
        self._metrics = metrics
        self._clock = clock
        self._holder = holder
        # Read at every step: a Kubernetes connector declares its engines' GPUs at start-up.
        self._gpus_per_engine = gpus_per_engine
        self.lease_ttl_s = lease_ttl_s
        self.lease_renew_s = lease_renew_s
        self.is_leader = False
        self.state = FleetState()
        self.wishes: dict[str, dict[str, int]] = {}
        self.moves: list[dict[str, Any]] = []
        self.grant_changes: dict[str, int] = {}
        self.last_step_at: datetime | None = None
        self.last_error: str | None = None
        self.consecutive_failures = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def interval_s(self) -> float:
        return self.fleet.interval_s

    def settings(self) -> FleetSettings:
        f = self.fleet
        return FleetSettings(budget_gpus=dict(f.budget_gpus), margin=f.margin, hold_s=f.hold_s)

    def step(self, now: datetime) -> FleetDecision | None:
        """One fleet step at `now`, stored; None when another process holds the fleet lease."""
        with self._sf() as session, session.begin():
            was_leader = self.is_leader
            self.is_leader = fleet_store.acquire_fleet_lease(
                session, holder=self._holder, now=now, ttl_s=self.lease_ttl_s
            )
            if not self.is_leader:
                if was_leader:
                    self._metrics.clear_fleet()
                return None
            if not was_leader:
                self._resume(fleet_store.load_fleet(session))
            members = [self._member(session, d.name) for d in self.deployments.deployments]
            decision = fleet_step(members, self.settings(), self.state, now.timestamp())
            previous = self.state.grants
            changed = [n for n, g in decision.grants.items() if g.changed and n in previous]
            moves = self.moves + [{"at": now.isoformat(), **m.as_dict()} for m in decision.moves]
            moves = moves[-RECENT_MOVES:]
            counts = dict(self.grant_changes)
            for name in changed:
                counts[name] = counts.get(name, 0) + 1
            grants = {
                m.name: {
                    **decision.grants[m.name].as_dict(),
                    "gpus_per_engine": dict(m.gpus_per_engine),
                    "max_gpus": m.max_gpus,
                    "configured_guaranteed_gpus": m.guaranteed_gpus,
                }
                for m in members
            }
            record = {
                "at": now.isoformat(),
                "budget_gpus": dict(self.fleet.budget_gpus),
                "decision": {"grants": grants, "free_gpus": dict(decision.free_gpus)},
                "state": {
                    "grants": {n: dict(g) for n, g in decision.state.grants.items()},
                    "changed_s": {n: dict(c) for n, c in decision.state.changed_s.items()},
                },
                "wishes": {m.name: dict(m.wish) for m in members},
                "moves": moves,
                "grant_changes": counts,
            }
            if not fleet_store.save_fleet(session, holder=self._holder, at=now, record=record):
                self.is_leader = False
                self._metrics.clear_fleet()
                return None
        # Stored: the next step starts from it (a failed write above keeps the old state).
        self.state = decision.state
        self.wishes = record["wishes"]
        self.moves = moves
        self.grant_changes = counts
        self.last_step_at = now
        for name in changed:
            self._metrics.fleet_grant_changes.labels(name).inc()
        self._metrics.observe_fleet(self.fleet.budget_gpus, grants)
        cut = [n for n, g in grants.items() if any(r["engines"] < r["wish"] for r in g["roles"].values())]
        log.debug("fleet step at %s: cut %s", now.isoformat(), ", ".join(cut) or "nobody")
        for name in changed:
            g = grants[name]
            log.info(
                "[%s] fleet grant %s (wish %s): %s",
                name,
                g["engines"],
                {r: x["wish"] for r, x in g["roles"].items()},
                "; ".join(f"{r} {x['reason']}" for r, x in g["roles"].items()),
                extra={"deployment": name},
            )
        return decision

    def _member(self, session: Session, name: str) -> FleetMember:
        config = self.deployments.get(name)
        assert config is not None
        config = settings_store.effective(session, config)  # bounds and targets as they run
        entry = self.fleet.member(name)
        bounds = config.bounds()
        tick = tick_store.last_tick(session, name)
        stages = (tick.record or {}).get("stages") or [] if tick is not None else []
        wish = wish_of(stages[0].get("replicas"), bounds) if stages else None
        # The load now, read from the same tick as the wish (None without one: the old rule).
        present = (
            present_of((tick.record or {}).get("sla"), wish, bounds, itl_target_ms=config.sla.itl_ms)
            if wish is not None and tick is not None
            else None
        )
        if wish is None:
            wish = self.wishes.get(name)  # type: ignore[assignment]
        if wish is None:
            # Nothing proposed yet: what it runs (its latest decision), else its minimums.
            latest = decision_store.latest_decision(session, name)
            wish = wish_of(decision_store.replicas_of(latest) if latest else {}, bounds)
        assert wish is not None
        gpus = self._gpus_per_engine(name)
        return FleetMember(
            name=name,
            gpu_type=entry.gpu_type or next(iter(self.fleet.budget_gpus)),
            priority=entry.priority,
            guaranteed_gpus=entry.guaranteed_gpus,
            max_gpus=entry.max_gpus,
            gpus_per_engine={role: int(gpus.get(role, 1)) for role in config.roles},
            wish={role: int(wish[role]) for role in config.roles},  # type: ignore[index]
            present=present,
        )

    def _resume(self, row: Any) -> None:
        record = row.record if row is not None else None
        if not record:
            log.info("fleet: no stored grants; the first step grants the wishes up to the budget")
            return
        state = record.get("state") or {}
        self.state = FleetState(
            grants={n: dict(g) for n, g in (state.get("grants") or {}).items()},
            changed_s={
                n: {r: float(t) for r, t in c.items()} for n, c in (state.get("changed_s") or {}).items()
            },
        )
        self.wishes = {n: dict(w) for n, w in (record.get("wishes") or {}).items()}
        self.moves = list(record.get("moves") or [])
        self.grant_changes = dict(record.get("grant_changes") or {})
        log.info("fleet: resumed the grants stored at %s", record.get("at"))

    async def run(self) -> None:
        next_step = next_lease = self._clock.now()
        interval = timedelta(seconds=self.interval_s)
        while True:
            await self._clock.sleep_until(min(next_step, next_lease))
            now = self._clock.now()
            try:
                if now >= next_lease or now >= next_step:
                    # Every step renews the lease; between steps (a long interval) it is renewed alone.
                    next_lease = now + timedelta(seconds=self.lease_renew_s)
                    if now >= next_step:
                        next_step += interval
                        if next_step <= now:  # fell behind: skip the missed steps rather than burst
                            next_step = now + interval
                        await asyncio.to_thread(self.step, now)
                    else:
                        await asyncio.to_thread(self.renew_lease, now)
                self.last_error = None
                self.consecutive_failures = 0
            except Exception as exc:  # keep stepping; counted, and shown in GET /fleet
                self.consecutive_failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._metrics.fleet_step_failures.inc()
                log.exception("fleet step failed (%d in a row)", self.consecutive_failures)

    def renew_lease(self, now: datetime) -> bool:
        with self._sf() as session, session.begin():
            was_leader = self.is_leader
            self.is_leader = fleet_store.acquire_fleet_lease(
                session, holder=self._holder, now=now, ttl_s=self.lease_ttl_s
            )
            if self.is_leader and not was_leader:
                self._resume(fleet_store.load_fleet(session))
            if was_leader and not self.is_leader:
                self._metrics.clear_fleet()
        return self.is_leader

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="fleet")

    async def stop(self) -> None:
        await stop_leased(
            self._task,
            self._sf,
            lambda session: fleet_store.release_fleet_lease(session, holder=self._holder),
            what="fleet lease",
        )

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()
