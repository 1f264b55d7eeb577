"""One tick of a deployment worker, a plain synchronous function of `now` and what was gathered
(tests call it directly): the planner's `on_tick` in one transaction with what it reads (expired
decisions, the latest decision, overrides, the fleet's grant) and what it writes (the tick record,
the learned state, the proposed decision). What the planner learned in a tick is adopted only once
the tick's record and decision are stored, so a failed write loses that tick and counts nothing
twice. Then the decision is announced and the tick's metrics and log line are emitted.

`TickMixin` is this part of `DeploymentWorker` (loop.py), which sets the attributes it names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from app.config import DeploymentConfig
from app.config.live import running_config
from app.connectors.virtual import DecisionHub
from app.core.cost.account import ordered_by
from app.core.diagnostics import TickDiagnostics
from app.core.fleet.grants import asked_of, grant_record, with_grant
from app.core.planner import Effects, Planner, TickInput
from app.core.types import DecisionStatus
from app.planner_setup import planner_settings
from app.reports.metrics import PlannerMetrics
from app.reports.shadow import DEFAULT_WINDOW_S, read_shadow_report
from app.store import decisions as decision_store
from app.store import fleet as fleet_store
from app.store import planner_state as state_store
from app.store import settings as settings_store
from app.store import ticks as tick_store
from app.store.models import Decision
from app.store.overrides import active_overrides
from app.store.settings import StoredSettings
from app.workers.cost import CostStep
from app.workers.gather import Gathered
from app.workers.shadow import tick_shadow
from app.workers.signals import SignalHealth

# The worker's logger, whichever of its modules logs (loop.py says why).
log = logging.getLogger("app.workers.loop")


@dataclass(frozen=True)
class TickReport:
    tick_id: int
    decision: Decision | None  # created by this tick
    pending: Decision | None  # the latest decision if it still awaits its outcome (new or older)
    summary: str


class TickMixin:
    """Deciding and storing one tick."""

    config: DeploymentConfig  # as it runs: the file's values with the live settings applied
    file_config: DeploymentConfig
    settings_revision: int
    signal_health: SignalHealth
    planner: Planner
    in_fleet: bool
    _sf: sessionmaker[Session]
    _hub: DecisionHub
    _metrics: PlannerMetrics
    _export_warned: bool
    # The lease check every tick starts with (loop.py).
    renew_lease: Callable[[datetime], bool]
    # The cost account (cost.py).
    cost_step: Callable[..., CostStep]
    commit_cost: Callable[[CostStep], None]

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
            self.follow_settings(settings_store.load(session, name))
            latest = decision_store.latest_decision(session, name)
            overrides = active_overrides(session, name, now)
            grant = fleet_store.stored_grant(session, name) if self.in_fleet else None
            # The grant binds as per-role maximum bounds, exactly as `planner replay` applies it.
            overrides = with_grant(overrides, grant, self.planner.settings.bounds)
            unavailable = self._follow_signals(gathered.signals)
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
                    unavailable_signals=unavailable,
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
                    "settings_revision": self.settings_revision,
                    "signals": {"read": gathered.signals, "unavailable": sorted(unavailable)},
                    "ready_source": gathered.ready_source,
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
                    remove=effects.remove,
                    shadow=self.config.shadow,
                )
                decision = proposal.decision
                verdict = f"{proposal.outcome.verdict}: {proposal.outcome.reason}"
            else:
                verdict = "hold: no target"
            # Billed from this tick on: what the decision in force after it orders, and what runs.
            in_force = decision or latest
            cost = self.cost_step(
                now,
                ordered=ordered_by(decision_store.view_of(in_force)) if in_force else None,
                ready=gathered.ready,
                fpm=gathered.fpm,
            )
            shadow = None
            if self.config.shadow:
                last = decision_store.replicas_of(latest) if latest is not None else None
                shadow = tick_shadow(self.planner, effects, gathered, last, now.timestamp())
            record = record.model_copy(
                update={
                    "verdict": verdict,
                    "decision_id": decision.decision_id if decision else None,
                    "cost": cost.section,
                    "shadow": shadow,
                }
            )
            tick.record = record.as_json()
            tick.decision_id = record.decision_id
        # Stored: what the tick learned is the planner's now (a failed write above keeps the old).
        self.planner.commit(effects)
        self.commit_cost(cost)

        if decision is not None:
            self._hub.announce(decision)
        self._metrics.paused.labels(name).set(1 if overrides.paused else 0)
        self._metrics.ticks.labels(name).inc()
        self._metrics.observe_throughput(name, record.throughput)
        self._metrics.observe_load(name, record.load, load_enabled=self.config.load.enabled)
        self._metrics.observe_sla(name, record.sla)
        if record.shadow is not None:
            self._metrics.shadow.observe_tick(name, record.shadow)
            with self._sf() as session:
                window = read_shadow_report(session, name, self.config.roles, now, DEFAULT_WINDOW_S)
            self._metrics.shadow.observe_window(name, window)
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

    def follow_settings(self, stored: StoredSettings) -> None:
        """Run on the live settings the store holds, from this tick on, when their revision
        changed. Overrides that the deployments file no longer accepts (the file changed under
        them) are not applied: the file's values run, and the log says why."""
        if stored.revision == self.settings_revision:
            return
        name = self.config.name
        config, error = running_config(self.file_config, stored.overrides)
        if error is not None:
            log.warning(
                "[%s] live settings of revision %d not applied, the deployments file's run: %s",
                name,
                stored.revision,
                error,
                extra={"deployment": name},
            )
        self.config = config
        self.planner.reconfigure(planner_settings(config, self.planner.model))
        self.settings_revision = stored.revision
        log.info(
            "[%s] live settings at revision %d: %s",
            name,
            stored.revision,
            stored.overrides or "the deployments file's",
            extra={"deployment": name},
        )

    def _follow_signals(self, read: dict[str, bool]) -> frozenset[str]:
        """Count this tick's reads (signals.py); export and log what changed; the signals
        unavailable now."""
        name = self.config.name
        became, recovered = self.signal_health.observe(read)
        for signal in sorted(became):
            log.warning(
                "[%s] signal %s unavailable (%d ticks without it): no count is lowered until it returns",
                name,
                signal,
                self.signal_health.misses[signal],
                extra={"deployment": name},
            )
        for signal in sorted(recovered):
            log.info("[%s] signal %s is back", name, signal, extra={"deployment": name})
        self._metrics.observe_signals(name, read, became, self.signal_health.unavailable)
        return frozenset(self.signal_health.unavailable)

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
