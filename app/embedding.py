"""The planner's decisions on someone else's clock: one small interface for simulators.

`EmbeddedPlanner` translates an embedder's world into the core planner's tick input, calls
`Planner.on_tick` (app/core/planner.py, exactly what `planner serve` calls) and applies the
decision protocol of `app/core/protocol.py` in memory, without a database, HTTP or a wall clock.
The embedder calls `on_tick` at the times it is told, with what its world looks like then, and
applies the targets it gets. `planner replay` drives the planner this way; docs/embedding.md
shows how another simulator can.

Protocol, as the virtual connector's: a target is a decision that stays pending until the
embedder's ready counts reach it (the acknowledgement); while it is pending no new automatic
target is issued, until `connector.ack_timeout_s` (when it expires). Times are seconds on the
embedder's clock, from any origin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from app.config import DeploymentConfig
from app.core.cost.account import CostSample, CostTotals, advance, ordered_by, tick_sample
from app.core.perf.fpm import ForwardPassMetrics
from app.core.perf.interpolation import PerfModel
from app.core.planner import Planner
from app.core.planner import TickInput as CoreTickInput
from app.core.protocol import Verdict, judge
from app.core.types import (
    ActiveOverrides,
    DecisionStatus,
    DecisionView,
    EngineKey,
    Replicas,
    Role,
    TrafficObservation,
)
from app.planner_setup import build_planner

# The diagnostics' ISO time `at` reads embedder seconds from this origin (the core speaks seconds).
_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)

FpmByEngine = Mapping[EngineKey, ForwardPassMetrics]

# What the frontend served since the previous tick: the service's traffic observation itself.
# None fields are unknown, not zero.
TrafficWindow = TrafficObservation


@dataclass(frozen=True)
class TickInput:
    now_s: float
    traffic: TrafficWindow | None
    ready: Mapping[str, int]  # engines serving, per role
    # The targets the embedder is moving towards (its last applied target). The planner moves from
    # its own last decision, as the service does; this is kept for the embedders that send it.
    expected: Mapping[str, int]
    # role -> latest record per engine. A busy record still there, unchanged, at the next tick is
    # the last pass of an engine that has run none since (Dynamo's replay adapter keeps it until a
    # newer one arrives): the planner reads that engine as idle, not as still carrying that load.
    fpm: Mapping[str, FpmByEngine] = field(default_factory=dict)
    # role -> every forward pass since the previous tick, oldest first, for the roles the embedder
    # records them for: the planner learns from all of them and reads the engines' busy time.
    # Roles left out learn from the latest records only.
    fpm_records: Mapping[str, Sequence[ForwardPassMetrics]] = field(default_factory=dict)
    # The overrides in force, as an operator would set them; a fleet passes each deployment's
    # grant as bounds ({"decode": {"max": 4}}), so that the planner's decision is what may run.
    overrides: ActiveOverrides = field(default_factory=ActiveOverrides)


@dataclass(frozen=True)
class TickOutput:
    target: Replicas | None  # apply it; None: keep what you have
    next_tick_s: float  # call on_tick again at this time
    reasons: list[str]  # one line per stage of the decision chain, and the protocol's verdict
    diagnostics: dict[str, Any]  # what the service stores as the tick record
    # Per role the target lowers: the ready engines to remove, first choice first (a hint: the
    # cluster removes its starting engines before them, and may ignore it).
    remove: dict[str, list[str]] = field(default_factory=dict)


class EmbeddedPlanner:
    def __init__(self, deployment: DeploymentConfig, planner: Planner, *, start_s: float = 0.0) -> None:
        self.deployment = deployment
        self.planner = planner
        self.start_s = start_s
        self._latest: DecisionView | None = None
        self._next_id = 1
        self._traffic: TrafficWindow | None = None  # windows merged since the last throughput tick
        self._trained: dict[tuple[str, str, int], ForwardPassMetrics] = {}
        self._previous: dict[tuple[str, str, int], ForwardPassMetrics] = {}
        # The cost account the service keeps (app/workers/cost.py), in each tick's diagnostics.
        self.cost_totals = CostTotals()
        self._cost_sample: CostSample | None = None

    @classmethod
    def from_config(
        cls, deployment: DeploymentConfig, *, base_dir: Path, start_s: float = 0.0
    ) -> EmbeddedPlanner:
        """The planner as `planner serve` builds it (paths relative to `base_dir`)."""
        return cls(deployment, build_planner(deployment, base_dir=base_dir, start_s=start_s), start_s=start_s)

    @property
    def model(self) -> PerfModel | None:
        return self.planner.model

    def initial_tick_s(self) -> float:
        return self.planner.first_tick_s(self.start_s)

    def on_tick(self, inp: TickInput) -> TickOutput:
        self._settle(inp.ready)
        needs = self.planner.needs(inp.now_s)
        roles = self.deployment.roles
        if inp.traffic is not None:
            self._traffic = inp.traffic if self._traffic is None else self._traffic.then(inp.traffic)
        traffic = None
        if needs.traffic_window_s is not None:
            # The service reads the frontend over the interval the tick asks for; the embedder
            # reports each tick's window, merged here until that interval is due.
            traffic, self._traffic = self._traffic, None
        latest = {role: inp.fpm.get(role, {}) for role in roles} if needs.fpm else {}
        fresh = self._fresh(latest) if self.planner.settings.load is not None else {}
        current = self._current(inp.fpm)
        fpm = {role: current.get(role, {}) for role in roles} if needs.fpm else {}
        complete = {}
        if needs.fpm:
            for role, records in inp.fpm_records.items():
                fresh[role], complete[role] = list(records), True
        effects = self.planner.on_tick(
            CoreTickInput(
                now_s=inp.now_s,
                overrides=inp.overrides,
                latest_decision=self._latest,
                traffic=traffic,
                traffic_error=None if traffic is not None else "no traffic window given",
                fpm=fpm,
                fpm_new=fresh,
                fpm_complete=complete,
                ready={role: inp.ready.get(role, 0) for role in roles},
            )
        )
        self.planner.commit(effects)
        diagnostics = effects.diagnostics.model_copy(
            update={"at": (_ORIGIN + timedelta(seconds=inp.now_s)).isoformat(), "fpm": _fpm_summary(current)}
        )
        target, remove = None, {}
        if effects.target is not None and effects.source is not None:
            outcome = judge(
                latest=self._latest,
                target=effects.target,
                source=effects.source,
                now_s=inp.now_s,
                ack_timeout_s=self.deployment.connector.ack_timeout_s,
            )
            verdict = f"{outcome.verdict}: {outcome.reason}"
            if outcome.verdict == Verdict.CREATE:
                target, remove = dict(effects.target), dict(effects.remove)
                self._latest = DecisionView(
                    id=self._next_id,
                    replicas=target,
                    source=effects.source,
                    status=DecisionStatus.PENDING,
                    created_s=inp.now_s,
                )
                diagnostics = diagnostics.model_copy(update={"decision_id": self._next_id})
                self._next_id += 1
        else:
            verdict = "hold: no target"
        sample = tick_sample(
            inp.now_s,
            roles,
            ordered=ordered_by(self._latest),
            ready=inp.ready,
            fpm=fpm,
            gpus_per_engine=self.planner.settings.gpus_per_engine,
            cost_per_gpu_hour=self.deployment.cost_per_gpu_hour,
        )
        self.cost_totals, _ = advance(self.cost_totals, self._cost_sample, sample)
        self._cost_sample = sample
        cost = {**sample.as_json(), "totals": self.cost_totals.as_json()}
        diagnostics = diagnostics.model_copy(update={"verdict": verdict, "cost": cost})
        return TickOutput(
            target=target,
            next_tick_s=effects.next_tick.at_s,
            reasons=[*effects.reasons, f"protocol: {verdict}"],
            diagnostics=diagnostics.as_json(),
            remove=remove,
        )

    def _settle(self, ready: Mapping[str, int]) -> None:
        """A pending target is acknowledged once every role's ready count equals it."""
        latest = self._latest
        if latest is None or latest.status != DecisionStatus.PENDING:
            return
        if all(ready.get(role) == count for role, count in latest.replicas.items()):
            self._latest = DecisionView(
                latest.id, latest.replicas, latest.source, DecisionStatus.SUCCEEDED, latest.created_s
            )

    def _fresh(self, fpm: Mapping[Role, FpmByEngine]) -> dict[Role, list[ForwardPassMetrics]]:
        """The records the regressions have not trained on: the embedder gives the latest per
        engine, and a record is one iteration, trained on once."""
        fresh: dict[Role, list[ForwardPassMetrics]] = {}
        for role, records in fpm.items():
            for (worker, rank), record in records.items():
                key = (role, worker, rank)
                if self._trained.get(key) is not record:
                    self._trained[key] = record
                    fresh.setdefault(role, []).append(record)
        return fresh

    def _current(self, fpm: Mapping[str, FpmByEngine]) -> dict[str, dict[EngineKey, ForwardPassMetrics]]:
        """The engines' load now: a busy record equal to the one the previous tick saw for that
        engine is an engine that has run no pass since, read as its idle heartbeat."""
        previous, self._previous = self._previous, {}
        current: dict[str, dict[EngineKey, ForwardPassMetrics]] = {}
        for role, records in fpm.items():
            view: dict[EngineKey, ForwardPassMetrics] = {}
            for (worker, rank), record in records.items():
                self._previous[(role, worker, rank)] = record
                stale = not record.is_heartbeat and previous.get((role, worker, rank)) == record
                view[(worker, rank)] = ForwardPassMetrics.heartbeat(worker, rank) if stale else record
            current[role] = view
        return current


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
