"""Scaling policies the replay compares, all behind one small interface.

- `planner`: the planner itself, through `EmbeddedPlanner` (the configured modes);
- `static`: fixed replicas sized by the profile for the trace's busiest minute;
- `fixed`: given counts, ordered at the first tick from the replay's start and held all run;
- `reactive`: an HPA-like baseline on queue depth (prefill) and KV use (decode);
- `oracle`: the clairvoyant schedule of `app/sim/replay/oracle.py`, applied on time.

A policy sees the cluster only through what a real controller could read (frontend counters,
engine queues and FPM, ready counts); the oracle alone reads the future, by definition.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Protocol

from app.core.perf.interpolation import PerfModel
from app.core.seed.replicas import plan_replicas
from app.core.traces import TraceRequest, bucket_requests
from app.embedding import EmbeddedPlanner, TickInput, TrafficWindow
from app.sim.replay.config import ReactiveConfig
from app.sim.world.cluster import ROLES, Cluster
from app.sim.world.engines import DecodeEngine, PrefillEngine
from app.sim.world.frontend import FrontendCounters


@dataclass(frozen=True)
class PolicyStep:
    target: dict[str, int] | None  # None: no change
    reason: str
    next_tick_s: float
    # Per role the target lowers, the ready engines the policy would rather lose first.
    remove: dict[str, list[str]] = field(default_factory=dict)


class Policy(Protocol):
    name: str

    def initial(self) -> dict[str, int]:
        """Engines of each role ready at t = 0."""
        ...

    def first_tick_s(self) -> float: ...

    def tick(self, now_s: float, cluster: Cluster) -> PolicyStep: ...


class PlannerPolicy:
    name = "planner"

    def __init__(
        self, planner: EmbeddedPlanner, initial: dict[str, int], *, with_fpm: bool, name: str = "planner"
    ) -> None:
        self.name = name
        self.planner = planner
        self._initial = initial
        self._with_fpm = with_fpm
        self._last_counters = None
        self.ticks: list[dict] = []  # the tick records, as the service would store them
        # Prefill's every forward pass, as the service's FPM subscriber receives them (decode's
        # one per iteration would cost the simulator more than the planner learns from them).
        self.record_fpm_roles: tuple[str, ...] = ("prefill",) if with_fpm else ()

    def initial(self) -> dict[str, int]:
        return dict(self._initial)

    def first_tick_s(self) -> float:
        return self.planner.initial_tick_s()

    def tick(self, now_s: float, cluster: Cluster) -> PolicyStep:
        counters = cluster.frontend.snapshot(now_s)
        # Before the first tick, the counters of a frontend that has served nothing yet.
        before = self._last_counters or FrontendCounters().snapshot(self.planner.start_s)
        self._last_counters = counters
        # The frontend's window has exactly the fields of the embedding's traffic window.
        window = TrafficWindow(**asdict(FrontendCounters.window(before, counters)))
        out = self.planner.on_tick(
            TickInput(
                now_s=now_s,
                traffic=window,
                ready=cluster.ready_counts(),
                expected=dict(cluster.targets),
                fpm=cluster.fpm_snapshot() if self._with_fpm else {},
                fpm_records=cluster.take_fpm_records() if self._with_fpm else {},
            )
        )
        self.ticks.append(out.diagnostics)
        return PolicyStep(out.target, "; ".join(out.reasons), out.next_tick_s, out.remove)


class StaticPolicy:
    """Sized once, by the planner's own formulas, for the busiest minute of the whole trace."""

    name = "static"

    def __init__(self, replicas: dict[str, int], reason: str, *, name: str = "static") -> None:
        self.replicas = replicas
        self.reason = reason
        self.name = name

    @classmethod
    def for_peak(
        cls, requests: list[TraceRequest], model: PerfModel, *, itl_target_ms: float, gpus: dict[str, int]
    ) -> StaticPolicy:
        best = {"prefill": 1, "decode": 1}
        for window in bucket_requests(requests, 60.0):
            if not window.num_req:
                continue
            plan = plan_replicas(
                model=model,
                num_req=window.num_req,
                interval_s=60.0,
                isl_tokens=max(window.isl or 1.0, 1.0),
                osl_tokens=max(window.osl or 1.0, 1.0),
                itl_target_ms=itl_target_ms,
                prefill_gpus=gpus.get("prefill", 1),
                decode_gpus=gpus.get("decode", 1),
            )
            best["prefill"] = max(best["prefill"], plan.num_prefill)
            best["decode"] = max(best["decode"], plan.num_decode)
        reason = f"static: the profile's replicas for the busiest minute: {best}"
        return cls(best, reason)

    def initial(self) -> dict[str, int]:
        return dict(self.replicas)

    def first_tick_s(self) -> float:
        return math.inf

    def tick(self, now_s: float, cluster: Cluster) -> PolicyStep:
        return PolicyStep(None, self.reason, math.inf)


class FixedPolicy:
    """Fixed counts ordered from the same start as the other policies: the run starts from
    `initial` (the replay's start), the first tick at `first_tick_s` orders `target` and every
    later tick holds it. Engines above the start are ordered then and serve a start-up delay
    later; engines beyond the target go at once (starting ones stopped, serving ones drained).
    Named `fixed P/D`, prefill/decode."""

    def __init__(self, initial: dict[str, int], target: dict[str, int], *, first_tick_s: float) -> None:
        self._initial = dict(initial)
        self.target = {role: target[role] for role in ROLES}
        self._first_tick_s = first_tick_s
        self.name = f"fixed {self.target['prefill']}/{self.target['decode']}"

    def initial(self) -> dict[str, int]:
        return dict(self._initial)

    def first_tick_s(self) -> float:
        return self._first_tick_s

    def tick(self, now_s: float, cluster: Cluster) -> PolicyStep:
        return PolicyStep(dict(self.target), f"{self.name}: ordered once, held all run", math.inf)


class ReactivePolicy:
    """HPA's algorithm per role: desired = ceil(current × metric ÷ target), unchanged within the
    tolerance, and a scale-down only to the highest desired count of the stabilisation window.
    Metrics: prefill, requests queued or running per serving engine; decode, the share of KV
    cache reserved or waiting per serving engine. As HPA's default scale-up policy, one tick
    adds at most max(100%, 4 engines). The window starts filled with the initial count, as if the
    autoscaler had been running before the trace began."""

    name = "reactive"

    def __init__(
        self, config: ReactiveConfig, initial: dict[str, int], bounds: dict[str, tuple[int, int]]
    ) -> None:
        self.config = config
        self._initial = initial
        self.bounds = bounds
        self._history = {role: deque([(0.0, initial.get(role, 0))]) for role in ROLES}

    def initial(self) -> dict[str, int]:
        return dict(self._initial)

    def first_tick_s(self) -> float:
        return self.config.interval_s

    def _metric(self, role: str, cluster: Cluster) -> float | None:
        engines = cluster.serving_engines(role)
        if not engines:
            return None
        if role == "prefill":
            loads = [
                len(e.queue) + (1 if e.busy_until is not None else 0)
                for e in engines
                if isinstance(e, PrefillEngine)
            ]
            return sum(loads) / len(engines) / self.config.prefill_queue_target
        kv = [e.load / e.max_kv_tokens for e in engines if isinstance(e, DecodeEngine)]
        return sum(kv) / len(engines) / self.config.decode_kv_target

    def tick(self, now_s: float, cluster: Cluster) -> PolicyStep:
        cfg = self.config
        target: dict[str, int] = {}
        notes = []
        for role in ROLES:
            current = cluster.targets[role]
            ratio = self._metric(role, cluster)
            if ratio is None:
                desired = max(current, 1)
                notes.append(f"{role}: no serving engine, desired {desired}")
            elif abs(ratio - 1) <= cfg.tolerance:
                desired = current
                notes.append(f"{role}: ratio {ratio:.2f} within tolerance")
            else:
                desired = math.ceil(max(cluster.ready_counts()[role], 1) * ratio)
                notes.append(f"{role}: ratio {ratio:.2f}, desired {desired}")
            low, high = self.bounds[role]
            desired = max(low, min(high, desired, max(2 * current, current + 4)))
            history = self._history[role]
            history.append((now_s, desired))
            while history and history[0][0] < now_s - cfg.scale_down_window_s:
                history.popleft()
            stabilised = max(d for _, d in history)
            target[role] = desired if desired >= current else min(current, stabilised)
        changed = any(target[r] != cluster.targets[r] for r in ROLES)
        return PolicyStep(
            target if changed else None, "reactive: " + "; ".join(notes), now_s + cfg.interval_s
        )


class OraclePolicy:
    """Applies the oracle's schedule at its change points (orders go out start-up delay ahead)."""

    name = "oracle"

    def __init__(self, plan) -> None:  # app.sim.oracle.OraclePlan
        self.plan = plan
        times = sorted({t for role in ROLES for t, _ in plan.schedule[role].steps if t > 0})
        self._times = deque(times)

    def initial(self) -> dict[str, int]:
        return {role: self.plan.schedule[role].initial for role in ROLES}

    def first_tick_s(self) -> float:
        return self._times[0] if self._times else math.inf

    def tick(self, now_s: float, cluster: Cluster) -> PolicyStep:
        while self._times and self._times[0] <= now_s:
            self._times.popleft()
        target = {role: self.plan.schedule[role].count_at(now_s) for role in ROLES}
        next_s = self._times[0] if self._times else math.inf
        return PolicyStep(target, "oracle: the clairvoyant schedule", next_s)
