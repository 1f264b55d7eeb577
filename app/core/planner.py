"""The planner core: one object per deployment that owns everything it learns, and one tick entry.

`Planner(settings, ...).on_tick(TickInput) -> Effects`, the shape of Dynamo's planner state
machine (`on_tick(tick, input) -> effects`) and Knative's decider (`Scale(ctx, now)`):

- the input is one observation: the time (`now_s`, seconds on the caller's clock), the traffic,
  the engines' forward passes, the ready counts (or None: unknown), the latest decision and the
  overrides in force;
- the output is the target (or none) with the reason of every stage, typed diagnostics, and the
  next tick: when it is due and what it needs (`ScheduledTick`);
- the predictors, the FPM regressions, SLA scaling's state, the cadence of the seed's two modes
  and the throughput floor live inside (`PlannerState`).

A tick never changes the planner: `on_tick` works on a copy of what the tick touches and returns
it in `Effects.state`; the caller adopts it with `commit(effects)` once the result is persisted.
A tick whose result could not be stored is simply not committed, and the same input then gives
the same effects again (nothing is counted twice). `export_state` / `restore_state` carry the
learned state across a restart or a failover.

`planner serve` (app/workers/loop.py), `planner replay` and every embedder (app/embedding.py) call
this and nothing else, so a benchmark measures exactly what the service runs.
"""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from app.core.cadence import Cadence
from app.core.chain import effective_bounds, normalise
from app.core.diagnostics import (
    DIAGNOSTICS_VERSION,
    LoadDiagnostics,
    SlaDiagnostics,
    ThroughputDiagnostics,
    TickDiagnostics,
)
from app.core.perf.fpm import ForwardPassMetrics
from app.core.perf.interpolation import PerfModel
from app.core.seed.load import load_step
from app.core.seed.load_models import LoadModels
from app.core.seed.load_types import LoadInput, LoadSettings, PendingTarget
from app.core.seed.predictors import TrafficPredictor
from app.core.seed.throughput import ThroughputInput, ThroughputReason, ThroughputSettings, throughput_step
from app.core.signals import hold_on_missing
from app.core.sla.settings import SlaSettings
from app.core.sla.state import SlaState
from app.core.sla.step import sla_step
from app.core.sla.types import SlaInput, TrafficSample
from app.core.types import (
    ActiveOverrides,
    DecisionSource,
    DecisionStatus,
    DecisionView,
    EngineKey,
    Replicas,
    Role,
    RoleBounds,
    Stage,
    TrafficObservation,
)
from app.core.victims import choose_removals

NO_POLICY_REASON = "no automatic scaling enabled; targets come only from operator pins"
# Bumped whenever PlannerState changes shape: an export from another version is refused.
STATE_VERSION = 11  # 2: SLA scaling learns iteration costs and quiet periods; 3: scale to zero;
# 4: decode's floor scale (SlaState.decode_floor_sums); 5: the history keeps each tick's forecast;
# 6: the decode context held over the trend window (SlaState.held); 7: the prefill engines' latest
# passes at the last tick (SlaState.prefill_passes); 8: the levels attainment sizing learns from
# (SlaState.levels); 9: SlaState's records are named tuples (state.py); 10: each level point keeps
# its keep forecast's quote, which calibration scores (forecast.py); 11: the learned iteration
# costs keep no residuals (latency.py: a prediction is the fit's mean)

FpmByEngine = Mapping[EngineKey, ForwardPassMetrics]


@dataclass(frozen=True)
class PlannerSettings:
    """Everything fixed about one deployment's decisions (app/planner_setup.py builds it from the
    deployments file). `sla` set: SLA scaling decides alone; else the seed's modes, each None when
    off."""

    deployment: str
    roles: tuple[Role, ...]
    bounds: dict[Role, RoleBounds]
    gpus_per_engine: dict[Role, int]
    tick_interval_s: float
    budget_gpus: int | None = None
    sla: SlaSettings | None = None
    throughput: ThroughputSettings | None = None
    load: LoadSettings | None = None
    load_interval_s: float | None = None


@dataclass(frozen=True)
class TickInput:
    """One observation of the deployment at `now_s`. What a tick did not ask for may be left out."""

    now_s: float
    overrides: ActiveOverrides = field(default_factory=ActiveOverrides)
    latest_decision: DecisionView | None = None
    # The frontend's traffic: since the previous tick (SLA scaling) or over the throughput
    # interval (throughput scaling); None with `traffic_error` saying why it is unknown.
    traffic: TrafficObservation | None = None
    traffic_error: str | None = None
    # The latest forward pass per engine, per role; and every record since the last tick that
    # the regressions have not trained on (load scaling).
    fpm: Mapping[Role, FpmByEngine] = field(default_factory=dict)
    fpm_new: Mapping[Role, Sequence[ForwardPassMetrics]] = field(default_factory=dict)
    # Per role: whether `fpm_new` holds every record since the previous tick (none was dropped),
    # so that their wall times are the engines' busy time.
    fpm_complete: Mapping[Role, bool] = field(default_factory=dict)
    # Ready engines per role from an inventory (the connector's report, the last acknowledged
    # decision, the embedder); None: no inventory says, the engines reporting FPM count.
    ready: Mapping[Role, int] | None = None
    # The signals missing for several ticks in a row (app/workers/signals.py): no count is lowered.
    unavailable_signals: frozenset[str] = frozenset()


@dataclass(frozen=True)
class TickNeeds:
    """What the tick at a given time reads: the traffic over `traffic_window_s` (None: none), and
    the engines' forward passes."""

    traffic_window_s: float | None
    fpm: bool


@dataclass(frozen=True)
class ScheduledTick:
    at_s: float
    needs: TickNeeds


@dataclass
class PlannerState:
    """What the planner has learned; one per deployment, copied by every tick that changes it."""

    cadence: Cadence | None = None  # the seed's two modes; None until the first tick
    floor: Replicas | None = None  # the last throughput step's replicas, with load scaling on
    sla: SlaState = field(default_factory=SlaState)
    predictor: TrafficPredictor | None = None
    load_models: LoadModels | None = None


@dataclass(frozen=True)
class Effects:
    """The core's answer for one tick."""

    target: Replicas | None
    source: DecisionSource | None
    stages: tuple[Stage, ...]
    # Per role the target lowers: the ready engines to remove, first choice first.
    remove: dict[Role, list[str]]
    diagnostics: TickDiagnostics
    next_tick: ScheduledTick
    state: PlannerState  # adopt it with Planner.commit once the tick is persisted

    @property
    def reasons(self) -> list[str]:
        return [f"{s.name}: {s.reason}" for s in self.stages]


class Planner:
    def __init__(
        self,
        settings: PlannerSettings,
        *,
        model: PerfModel | None,
        model_error: str | None = None,
        predictor: TrafficPredictor | None = None,
        load_models: LoadModels | None = None,
        start_s: float | None = None,
        fingerprint: str = "",
    ) -> None:
        """`start_s`: the seed's modes first run one interval after it; None (the service): both
        run at the first tick, whenever it comes. `fingerprint` names the configuration the
        planner was built from: a saved state is only restored under the same one."""
        self.settings = settings
        self.fingerprint = fingerprint
        self.model = model
        self.model_error = None if model is not None else model_error or "no profile"
        cadence = None
        if start_s is not None:
            cadence = Cadence.start(
                start_s,
                load_interval_s=self._load_interval_s,
                throughput_interval_s=self._throughput_interval_s,
            )
        self._state = PlannerState(cadence=cadence, predictor=predictor, load_models=load_models)

    # --- what the next tick needs ----------------------------------------------------------------

    @property
    def _load_interval_s(self) -> float | None:
        return self.settings.load_interval_s if self.settings.load is not None else None

    @property
    def _throughput_interval_s(self) -> float | None:
        return self.settings.throughput.interval_s if self.settings.throughput is not None else None

    def _cadence(self, state: PlannerState, now_s: float) -> Cadence:
        if state.cadence is not None:
            return state.cadence
        load_s, throughput_s = self._load_interval_s, self._throughput_interval_s
        return Cadence(
            load_s,
            throughput_s,
            next_load_s=now_s if load_s else math.inf,
            next_throughput_s=now_s if throughput_s else math.inf,
        )

    def needs(self, now_s: float) -> TickNeeds:
        """What a tick at `now_s` will read, so that the caller gathers only that."""
        return self._needs(self._state, now_s)

    def _needs(self, state: PlannerState, now_s: float) -> TickNeeds:
        if self.settings.sla is not None:
            return TickNeeds(traffic_window_s=self.settings.tick_interval_s, fpm=True)
        due = self._cadence(state, now_s).due(now_s)
        return TickNeeds(
            traffic_window_s=self._throughput_interval_s if due.throughput else None,
            fpm=due.load and self.settings.load is not None,
        )

    def first_tick_s(self, start_s: float) -> float:
        """When to tick first, for a caller that starts at `start_s`."""
        return self._scheduled(self._state, start_s).at_s

    def _scheduled(self, state: PlannerState, now_s: float) -> ScheduledTick:
        if self.settings.sla is not None:
            at_s = now_s + self.settings.tick_interval_s
        else:
            next_s = state.cadence.next_tick_s if state.cadence is not None else math.inf
            # With both modes off the planner still ticks (for overrides and the record).
            at_s = next_s if next_s != math.inf else now_s + self.settings.tick_interval_s
        return ScheduledTick(at_s, self._needs(state, at_s))

    def with_gpus_per_engine(self, gpus: Mapping[Role, int]) -> None:
        """What the cluster declares per engine (the connector, at start-up) replaces the file's."""
        merged = {
            **self.settings.gpus_per_engine,
            **{r: g for r, g in gpus.items() if r in self.settings.roles and g},
        }
        throughput = self.settings.throughput
        if throughput is not None:
            throughput = replace(throughput, gpus_per_engine=merged)
        self.settings = replace(self.settings, gpus_per_engine=merged, throughput=throughput)

    def reconfigure(self, settings: PlannerSettings) -> None:
        """Decide under `settings` from the next tick on (settings changed live): what was
        learned stays, and so do the GPUs per engine the cluster declared."""
        declared = self.settings.gpus_per_engine
        self.settings = settings
        self.with_gpus_per_engine(declared)

    # --- one tick --------------------------------------------------------------------------------

    def on_tick(self, inp: TickInput) -> Effects:
        settings, committed = self.settings, self._state
        now_s = inp.now_s
        ready, inventory_known = self._inventory(inp)
        in_force = _in_force(inp.latest_decision)
        state = replace(committed)  # a shallow copy; each step below copies what it changes
        throughput_diag = load_diag = sla_diag = None
        proposal, source = Stage("proposal", None, NO_POLICY_REASON), None
        if settings.sla is not None:
            state.sla = committed.sla.copy()
            proposal, sla_diag = self._sla(inp, state.sla, ready, inventory_known, in_force)
            source = DecisionSource.SLA
        else:
            cadence = self._cadence(committed, now_s)
            due = cadence.due(now_s)
            state.cadence = cadence.after(now_s, due)
            if due.throughput and settings.throughput is not None:
                proposal, throughput_diag, floor = self._throughput(inp, state, ready)
                source = DecisionSource.THROUGHPUT
                if floor is not None:
                    state.floor = floor
            if due.load and settings.load is not None and state.load_models is not None:
                proposal, load_diag = self._load(inp, state, ready, in_force)
                source = DecisionSource.LOAD
        # What runs as far as the planner knows (the decision in force, else the ready engines):
        # while a signal is missing, no role goes below it.
        running = dict(inp.latest_decision.replicas) if in_force and inp.latest_decision else None
        running = running or (ready if inventory_known else None)
        proposal = hold_on_missing(proposal, inp.unavailable_signals, running)
        bounds = effective_bounds(settings.bounds, inp.overrides)
        stages, source = normalise(
            proposal,
            source,
            overrides=inp.overrides,
            bounds=bounds,
            budget_gpus=settings.budget_gpus,
            gpus_per_engine=settings.gpus_per_engine,
        )
        target = stages[-1].replicas
        latest = inp.latest_decision
        # Lowered from what the cluster was last asked for (else from what is ready).
        previous = dict(latest.replicas) if latest else (ready if inventory_known else {})
        remove = choose_removals(previous=previous, target=target, fpm=inp.fpm) if target else {}
        diagnostics = TickDiagnostics(
            version=DIAGNOSTICS_VERSION,
            at_s=now_s,
            deployment=settings.deployment,
            latest_decision_id=latest.id if latest else None,
            latest_decision_status=str(latest.status) if latest else None,
            overrides={
                "pin_id": inp.overrides.pin_id,
                "bounds_id": inp.overrides.bounds_id,
                "pause_id": inp.overrides.pause_id,
            },
            bounds={r: {"min": b.min_replicas, "max": b.max_replicas} for r, b in bounds.items()},
            stages=[s.as_dict() for s in stages],
            target=target,
            remove=remove or None,
            throughput=throughput_diag,
            load=load_diag,
            sla=sla_diag,
        )
        return Effects(
            target=target,
            source=source,
            stages=stages,
            remove=remove,
            diagnostics=diagnostics,
            next_tick=self._scheduled(state, now_s),
            state=state,
        )

    def commit(self, effects: Effects) -> None:
        """Adopt what a tick learned, once its result is persisted."""
        self._state = effects.state

    # --- the steps -------------------------------------------------------------------------------

    def _inventory(self, inp: TickInput) -> tuple[dict[Role, int], bool]:
        """Ready engines per role, and whether any inventory says so: without one (no connector
        report, no acknowledged decision yet), the engines that report FPM are the inventory,
        once every role has one reporting."""
        roles = self.settings.roles
        fpm = {role: inp.fpm.get(role, {}) for role in roles}
        if inp.ready is not None:
            return {role: inp.ready.get(role, len({w for w, _ in fpm[role]})) for role in roles}, True
        return {role: len({w for w, _ in fpm[role]}) for role in roles}, all(fpm[r] for r in roles)

    def _sla(
        self,
        inp: TickInput,
        state: SlaState,
        ready: dict[Role, int],
        inventory_known: bool,
        in_force: bool,
    ) -> tuple[Stage, SlaDiagnostics]:
        settings = self.settings.sla
        assert settings is not None
        roles = self.settings.roles
        traffic = None
        obs = inp.traffic
        if obs is not None and obs.num_req is not None:
            traffic = TrafficSample(
                inp.now_s,
                obs.duration_s,
                obs.num_req,
                obs.isl,
                obs.osl,
                obs.isl_buckets,
                queued_requests=obs.queued_requests,
                inflight_requests=obs.inflight_requests,
            )
        latest = inp.latest_decision
        # What was last ordered, engines still starting included: SLA scaling compares its wish
        # with it, and measures its scaling latency by how long the ready counts take to reach it.
        expected = (
            {role: latest.replicas.get(role, ready[role]) for role in roles}  # type: ignore[union-attr]
            if in_force
            else dict(ready)
        )
        sla_input = SlaInput(
            now_s=inp.now_s,
            traffic=traffic,
            fpm={role: inp.fpm.get(role, {}) for role in roles},
            ready=ready,
            expected=expected,
            # A decision in force is an inventory of its own: it says what the planner ordered. A
            # deployment never decided for, that nothing reports on, runs nothing the planner
            # knows of: its first decision orders what the demand needs.
            inventory_known=in_force
            or inventory_known
            or (inp.latest_decision is None and inp.ready is None),
            fpm_new={role: inp.fpm_new.get(role, ()) for role in roles},
            fpm_complete={role: inp.fpm_complete.get(role, False) for role in roles},
        )
        outcome = sla_step(self.model, state, sla_input, settings)
        diag = SlaDiagnostics.model_validate(
            {"reason": str(outcome.reason), "detail": outcome.detail, **outcome.diagnostics}
        )
        return Stage("proposal", outcome.replicas, f"sla {outcome.reason}: {outcome.detail}"), diag

    def _throughput(
        self, inp: TickInput, state: PlannerState, ready: dict[Role, int]
    ) -> tuple[Stage, ThroughputDiagnostics, Replicas | None]:
        settings = self.settings.throughput
        assert settings is not None
        obs = inp.traffic
        forecast = None
        if obs is not None and state.predictor is not None:
            state.predictor = copy.deepcopy(state.predictor)
            state.predictor.observe(obs)
            forecast = state.predictor.forecast()
        error = inp.traffic_error
        if obs is None and error is None:
            error = "no traffic observation given"
        step = throughput_step(
            ThroughputInput(
                observation=obs,
                observation_error=error,
                forecast=forecast,
                model=self.model,
                model_error=self.model_error,
                decode_engines=ready.get("decode") if inp.ready is not None else None,
            ),
            settings,
            self.settings.roles,
        )
        reason, floor = step.reason, None
        load_on = self.settings.load is not None
        if load_on and reason == ThroughputReason.SCALE:
            # With load scaling on, throughput only sets the floor the load decisions stay above.
            reason, floor = ThroughputReason.SET_LOWER_BOUND, step.replicas
        diag = ThroughputDiagnostics.model_validate(
            {"reason": str(reason), "detail": step.detail, **step.diagnostics}
        )
        replicas = None if load_on else step.replicas
        return Stage("proposal", replicas, f"throughput {reason}: {step.detail}"), diag, floor

    def _load(
        self, inp: TickInput, state: PlannerState, ready: dict[Role, int], in_force: bool
    ) -> tuple[Stage, LoadDiagnostics]:
        settings = self.settings.load
        assert settings is not None and state.load_models is not None
        fresh = {role: list(records) for role, records in inp.fpm_new.items() if records}
        if fresh:
            state.load_models = state.load_models.copy()
            state.load_models.observe_many(fresh)
        latest = inp.latest_decision
        load_input = LoadInput(
            fpm={role: inp.fpm.get(role, {}) for role in self.settings.roles},
            ready=ready,
            now_s=inp.now_s,
            # The last target stays "pending" for the load step until the ready counts reach it.
            pending=PendingTarget(latest.replicas, latest.created_s) if in_force else None,  # type: ignore[union-attr]
            throughput_floor=state.floor,
        )
        result = load_step(state.load_models, load_input, settings)
        return Stage(
            "proposal", result.replicas, f"load {result.reason}: {result.detail}"
        ), result.diagnostics

    # --- learned state across restarts -----------------------------------------------------------

    def export_state(self, effects: Effects | None = None) -> bytes:
        """The learned state as bytes: the committed one, or the one `effects` would commit (so a
        shell can store it with the tick it belongs to). Pickle, because the predictors' fitted
        models are arbitrary objects: restore only what this planner's own store wrote."""
        state = effects.state if effects is not None else self._state
        return pickle.dumps((STATE_VERSION, self.settings.deployment, self.fingerprint, state))

    def restore_state(self, blob: bytes) -> None:
        """Resume from `export_state`'s bytes. ValueError, the planner unchanged, for bytes that
        are not an export, another version, another deployment or other settings (a changed
        deployments file starts learning afresh: a predictor of another kind, other windows)."""
        try:
            version, deployment, fingerprint, state = pickle.loads(blob)  # noqa: S301 (our store's bytes)
        except Exception as exc:
            raise ValueError(f"not a planner state export ({type(exc).__name__})") from None
        if deployment != self.settings.deployment:
            raise ValueError(f"the state of deployment {deployment!r}, not {self.settings.deployment!r}")
        if version != STATE_VERSION:
            raise ValueError(f"state format {version}, this planner reads {STATE_VERSION}")
        if fingerprint != self.fingerprint:
            raise ValueError("saved under other settings (the deployments file changed)")
        if not isinstance(state, PlannerState):
            raise ValueError("not a planner state export")
        self._state = state

    @property
    def state(self) -> PlannerState:
        """The committed state (read only: a tick never changes it in place)."""
        return self._state


def _in_force(latest: DecisionView | None) -> bool:
    return latest is not None and latest.status in (DecisionStatus.PENDING, DecisionStatus.SUCCEEDED)
