"""The planner's decisions on someone else's clock: one small interface for simulators.

`EmbeddedPlanner` runs the same decision code as `planner serve` (the tick chain of
`app/core/tick.py`, the throughput step, the predictors, the decision protocol of
`app/core/protocol.py`) without a database, HTTP or a wall clock. The embedder calls `on_tick`
at the times it is told, with what its world looks like then, and applies the targets it gets.
`planner replay` drives the planner this way; docs/embedding.md shows how another simulator can.

Protocol, as the virtual connector's: a target is a decision that stays pending until the
embedder's ready counts reach it (the acknowledgement); while it is pending no new automatic
target is issued, until `connector.ack_timeout_s` (when it expires). Times are seconds on the
embedder's clock, from any origin.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from app.config import DeploymentConfig
from app.core.cadence import Cadence
from app.core.fpm import ForwardPassMetrics
from app.core.interpolation import PerfModel
from app.core.load import LoadInput, LoadModels, LoadTick, PendingTarget
from app.core.predictors import TrafficPredictor
from app.core.protocol import Verdict, judge
from app.core.sla_scaling import SlaInput, SlaState, SlaTick, TrafficSample
from app.core.throughput import ThroughputInput
from app.core.tick import on_tick
from app.core.types import (
    ActiveOverrides,
    DecisionStatus,
    DecisionView,
    Replicas,
    Role,
    TickSnapshot,
    TrafficObservation,
)
from app.workers.resources import build_model_resources, make_load_settings, make_sla_settings

# Embedder seconds are mapped onto datetimes from this origin for the core, which speaks datetimes.
_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)

FpmByEngine = Mapping[tuple[str, int], ForwardPassMetrics]


@dataclass(frozen=True)
class TrafficWindow:
    """What the frontend served since the previous tick. None fields are unknown, not zero."""

    duration_s: float
    num_req: float | None
    isl: float | None  # mean input tokens
    osl: float | None  # mean output tokens
    ttft_ms: float | None = None  # mean
    itl_ms: float | None = None  # mean, token-weighted
    request_duration_s: float | None = None  # mean
    # (upper bound in tokens, requests) per ISL histogram bucket, not cumulative; () unknown.
    isl_buckets: tuple[tuple[float, float], ...] = ()

    def as_observation(self) -> TrafficObservation:
        return TrafficObservation(
            duration_s=self.duration_s,
            num_req=self.num_req,
            isl=self.isl,
            osl=self.osl,
            ttft_ms=self.ttft_ms,
            itl_ms=self.itl_ms,
            request_duration_s=self.request_duration_s,
            isl_buckets=self.isl_buckets,
        )


@dataclass(frozen=True)
class TickInput:
    now_s: float
    traffic: TrafficWindow | None
    ready: Mapping[str, int]  # engines serving, per role
    expected: Mapping[str, int]  # engines the embedder is moving towards (its last applied target)
    fpm: Mapping[str, FpmByEngine] = field(default_factory=dict)  # role -> latest record per engine


@dataclass(frozen=True)
class TickOutput:
    target: Replicas | None  # apply it; None: keep what you have
    next_tick_s: float  # call on_tick again at this time
    reasons: list[str]  # one line per stage of the decision chain, and the protocol's verdict
    diagnostics: dict[str, Any]  # what the service stores as the tick record


class EmbeddedPlanner:
    def __init__(
        self,
        deployment: DeploymentConfig,
        *,
        model: PerfModel | None,
        predictor: TrafficPredictor | None = None,
        model_error: str | None = None,
        load_models: LoadModels | None = None,
        start_s: float = 0.0,
    ) -> None:
        self.deployment = deployment
        self.model = model
        self.model_error = model_error if model is None else None
        self.predictor = predictor
        self.start_s = start_s
        self.gpus_per_engine: dict[Role, int] = {
            r: deployment.role(r).gpus_per_engine for r in deployment.roles
        }
        self.load_settings = make_load_settings(deployment, model) if deployment.load.enabled else None
        self.load_models = load_models
        if deployment.load.enabled and load_models is None:
            load = deployment.load
            self.load_models = LoadModels(
                deployment.mode, max_samples=load.window, min_observations=load.min_observations
            )
        self.cadence = Cadence.start(
            start_s,
            load_interval_s=deployment.load.interval_s if deployment.load.enabled else None,
            throughput_interval_s=deployment.throughput.interval_s if deployment.throughput.enabled else None,
        )
        self._latest: DecisionView | None = None
        self._next_id = 1
        self._floor: Replicas | None = None
        self._traffic: TrafficWindow | None = None  # windows merged since the last throughput tick
        self._trained: dict[tuple[str, str, int], ForwardPassMetrics] = {}
        self.sla_settings = (
            make_sla_settings(deployment, model) if deployment.scaling.algorithm == "sla" else None
        )
        self.sla_state = SlaState()

    @classmethod
    def from_config(
        cls, deployment: DeploymentConfig, *, base_dir: Path, start_s: float = 0.0
    ) -> EmbeddedPlanner:
        """Profile and predictors as `planner serve` builds them (paths relative to `base_dir`)."""
        resources = build_model_resources(deployment, base_dir=base_dir)
        return cls(
            deployment,
            model=resources.model,
            model_error=resources.model_error,
            predictor=resources.predictor,
            load_models=resources.load_models,
            start_s=start_s,
        )

    @property
    def interval_s(self) -> float:
        return self.deployment.tick_interval_s

    def _next_tick_s(self, now_s: float) -> float:
        if self.sla_settings is not None:
            return now_s + self.deployment.scaling.interval_s
        # With both modes off the planner still ticks (for the record) every interval.
        next_s = self.cadence.next_tick_s
        return next_s if next_s != float("inf") else now_s + self.interval_s

    def initial_tick_s(self) -> float:
        return self._next_tick_s(self.start_s)

    def _sla(self, inp: TickInput) -> SlaTick:
        traffic = None
        if inp.traffic is not None and inp.traffic.num_req is not None:
            w = inp.traffic
            traffic = TrafficSample(inp.now_s, w.duration_s, w.num_req, w.isl, w.osl, w.isl_buckets)
        sla_input = SlaInput(
            now_s=inp.now_s,
            traffic=traffic,
            fpm={role: inp.fpm.get(role, {}) for role in self.deployment.roles},  # type: ignore[misc]
            ready={role: inp.ready.get(role, 0) for role in self.deployment.roles},
            expected={role: inp.expected.get(role, inp.ready.get(role, 0)) for role in self.deployment.roles},
        )
        assert self.sla_settings is not None
        return SlaTick(self.model, self.sla_state, sla_input, self.sla_settings)

    def on_tick(self, inp: TickInput) -> TickOutput:
        now = _ORIGIN + timedelta(seconds=inp.now_s)
        self._settle(inp.ready, now)
        throughput = load = sla = None
        if self.sla_settings is not None:
            sla = self._sla(inp)
        else:
            due = self.cadence.due(inp.now_s)
            self.cadence = self.cadence.after(inp.now_s, due)
            if inp.traffic is not None:
                self._traffic = _merge(self._traffic, inp.traffic)
            if due.throughput:
                throughput = self._throughput(inp)
                self._traffic = None
            load = self._load(inp, now) if due.load else None
        snapshot = TickSnapshot(
            deployment=self.deployment.name,
            roles=self.deployment.roles,
            config_bounds=self.deployment.bounds(),
            overrides=ActiveOverrides(),
            latest_decision=self._latest,
            throughput=throughput,
            throughput_settings=(
                self.deployment.throughput_settings(self.gpus_per_engine) if throughput is not None else None
            ),
            gpus_per_engine=self.gpus_per_engine,
            budget_gpus=self.deployment.gpu_budget,
            load=load,
            load_enabled=self.deployment.load.enabled,
            sla=sla,
        )
        result = on_tick(snapshot, now)
        if result.throughput_floor is not None:
            self._floor = result.throughput_floor
        diagnostics = dict(result.diagnostics)
        diagnostics["at_s"] = inp.now_s
        diagnostics["fpm"] = _fpm_summary(inp.fpm)
        reasons = result.reasons
        target = None
        if result.target is not None and result.source is not None:
            outcome = judge(
                latest=self._latest,
                target=result.target,
                source=result.source,
                now=now,
                ack_timeout_s=self.deployment.connector.ack_timeout_s,
            )
            verdict = f"{outcome.verdict}: {outcome.reason}"
            if outcome.verdict == Verdict.CREATE:
                target = dict(result.target)
                self._latest = DecisionView(
                    id=self._next_id,
                    replicas=target,
                    source=result.source,
                    status=DecisionStatus.PENDING,
                    created_at=now,
                )
                self._next_id += 1
        else:
            verdict = "hold: no target"
        diagnostics["verdict"] = verdict
        return TickOutput(
            target=target,
            next_tick_s=self._next_tick_s(inp.now_s),
            reasons=[*reasons, f"protocol: {verdict}"],
            diagnostics=diagnostics,
        )

    def _settle(self, ready: Mapping[str, int], now: datetime) -> None:
        """A pending target is acknowledged once every role's ready count equals it."""
        latest = self._latest
        if latest is None or latest.status != DecisionStatus.PENDING:
            return
        if all(ready.get(role) == count for role, count in latest.replicas.items()):
            self._latest = DecisionView(
                latest.id, latest.replicas, latest.source, DecisionStatus.SUCCEEDED, latest.created_at
            )

    def _load(self, inp: TickInput, now: datetime) -> LoadTick:
        """Feed the regressions the records they have not seen (the latest per engine; a record
        is one iteration, trained on once), then load scaling's input for this tick."""
        assert self.load_models is not None and self.load_settings is not None
        fresh: dict[Role, list[ForwardPassMetrics]] = {}
        for role, records in inp.fpm.items():
            if role not in self.load_models.regressions:
                continue
            for (worker, rank), record in records.items():
                key = (role, worker, rank)
                if self._trained.get(key) is not record:
                    self._trained[key] = record
                    fresh.setdefault(role, []).append(record)  # type: ignore[arg-type]
        self.load_models.observe_many(fresh)
        latest = self._latest
        load_input = LoadInput(
            fpm={role: inp.fpm.get(role, {}) for role in self.deployment.roles},
            ready={role: inp.ready.get(role, 0) for role in self.deployment.roles},
            now=now,
            pending=PendingTarget(latest.replicas, latest.created_at) if latest is not None else None,
            throughput_floor=self._floor,
        )
        return LoadTick(self.load_models, load_input, self.load_settings)

    def _throughput(self, inp: TickInput) -> ThroughputInput:
        observation = self._traffic.as_observation() if self._traffic is not None else None
        forecast = None
        if observation is not None and self.predictor is not None:
            self.predictor.observe(observation)
            forecast = self.predictor.forecast()
        return ThroughputInput(
            observation=observation,
            observation_error=None if observation is not None else "no traffic window given",
            forecast=forecast,
            model=self.model,
            model_error=self.model_error,
            decode_engines=inp.ready.get("decode"),
        )


def _merge(before: TrafficWindow | None, window: TrafficWindow) -> TrafficWindow:
    """Two consecutive windows as one: durations and counts add, means are weighted by their
    request counts (an unknown count makes the merged means unknown)."""
    if before is None:
        return window
    na, nb = before.num_req, window.num_req

    def mean(a: float | None, b: float | None) -> float | None:
        if na is None or nb is None:
            return None
        if not na:
            return b
        if not nb:
            return a
        if a is None or b is None:
            return None
        return (a * na + b * nb) / (na + nb)

    return TrafficWindow(
        duration_s=before.duration_s + window.duration_s,
        num_req=None if na is None or nb is None else na + nb,
        isl=mean(before.isl, window.isl),
        osl=mean(before.osl, window.osl),
        ttft_ms=mean(before.ttft_ms, window.ttft_ms),
        itl_ms=mean(before.itl_ms, window.itl_ms),
        request_duration_s=mean(before.request_duration_s, window.request_duration_s),
        isl_buckets=_add_buckets(before.isl_buckets, window.isl_buckets),
    )


def _add_buckets(a: tuple[tuple[float, float], ...], b: tuple[tuple[float, float], ...]):
    counts: dict[float, float] = {}
    for bound, n in (*a, *b):
        counts[bound] = counts.get(bound, 0.0) + n
    return tuple(sorted(counts.items()))


def _fpm_summary(fpm: Mapping[str, FpmByEngine]) -> dict[str, Any]:
    """Per role: engines reporting, queued prefill tokens, decode requests and KV tokens."""
    summary: dict[str, Any] = {}
    for role, records in fpm.items():
        values = list(records.values())
        summary[role] = {
            "engines": len(values),
            "queued_prefill_tokens": sum(r.queued.sum_prefill_tokens for r in values),
            "decode_requests": sum(r.scheduled.num_decode_requests for r in values),
            "decode_kv_tokens": sum(r.scheduled.sum_decode_kv_tokens for r in values),
        }
    return summary


def seconds_of(at: datetime) -> float:
    """An embedder time back from a datetime in the diagnostics."""
    return (at - _ORIGIN).total_seconds()
