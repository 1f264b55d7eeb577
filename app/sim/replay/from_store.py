"""`planner replay --from-store`: a deployment's own stored traffic, rebuilt as requests, and the
decisions it actually took, replayed as a policy on the same clock.

The store keeps no request, only what each tick observed over the interval that ended at it
(`duration_s`): the requests that arrived (`num_req`, a count of arrivals), the mean input and
output lengths and the histogram of input lengths (of the requests that completed in it). From
each tick the workload gets, deterministically for a given seed:

- **how many**: `num_req`, carried from tick to tick so that fractional counts (a Prometheus
  rate) add up to the stored total instead of being rounded away one tick at a time;
- **when**: arrival times drawn uniformly over the tick's interval and sorted: a Poisson process
  given its count, the arrivals the stored count says nothing more about;
- **ISL**: a bucket of the stored histogram drawn in proportion to its count, a length uniform
  inside it (from its lower bound to its upper bound; the open bucket up to twice its lower bound),
  then every length of the tick scaled so that their mean is the stored mean ISL;
- **OSL**: an exponential draw around the stored mean OSL (the widest distribution a mean alone
  allows), scaled likewise so that the tick's mean is the stored mean; at least one token.

A tick that observed arrivals but no lengths (none completed yet) takes the lengths of the
nearest tick before it that has them, or else after it. Time 0 of the replay is the start of the
window's first tick interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.core.traces import TraceRequest
from app.core.types import TrafficObservation
from app.sim.replay.policies import PolicyStep
from app.sim.world.cluster import ROLES, Cluster

# The open bucket of the ISL histogram ("+Inf") reaches this many times its lower bound.
OPEN_BUCKET_SPAN = 2.0


@dataclass(frozen=True)
class StoredTick:
    """One tick of the window: when its interval ended (seconds from the replay's 0) and what it
    observed (None: nothing; no requests come from it)."""

    end_s: float
    observation: TrafficObservation | None


@dataclass(frozen=True)
class _Lengths:
    isl: float
    osl: float
    # The ISL histogram as stored: (upper bound, requests) per bucket, in order, empty ones too.
    buckets: tuple[tuple[float, float], ...]


def _lengths_of(obs: TrafficObservation | None) -> _Lengths | None:
    if obs is None or obs.isl is None or obs.osl is None or obs.isl <= 0 or obs.osl <= 0:
        return None
    return _Lengths(obs.isl, obs.osl, tuple(sorted(obs.isl_buckets)))


def _filled_lengths(ticks: Sequence[StoredTick]) -> list[_Lengths | None]:
    """Each tick's lengths, those of a tick without them taken from the nearest tick before it
    that has them, else from the nearest after it."""
    own = [_lengths_of(t.observation) for t in ticks]
    filled: list[_Lengths | None] = []
    last = None
    for lengths in own:
        last = lengths or last
        filled.append(last)
    following = next((x for x in own if x is not None), None)
    return [x if x is not None else following for x in filled]


def _isl_draws(rng: np.random.Generator, n: int, lengths: _Lengths) -> np.ndarray:
    """`n` lengths from the histogram (uniform inside the drawn bucket); the mean alone when the
    histogram is empty."""
    bounds = np.array([b for b, _ in lengths.buckets], dtype=float)
    counts = np.array([max(c, 0.0) for _, c in lengths.buckets], dtype=float)
    if not bounds.size or counts.sum() <= 0:
        return np.full(n, lengths.isl)
    lower = np.concatenate(([0.0], bounds[:-1]))
    upper = np.where(np.isinf(bounds), np.maximum(lower, 1.0) * OPEN_BUCKET_SPAN, bounds)
    chosen = rng.choice(bounds.size, size=n, p=counts / counts.sum())
    return rng.uniform(lower[chosen], upper[chosen])


def _scaled_to_mean(values: np.ndarray, mean: float) -> np.ndarray:
    """Whole tokens, at least one, whose mean is `mean` to within the rounding."""
    current = float(values.mean())
    scaled = values * (mean / current) if current > 0 else np.full(values.shape, mean)
    return np.maximum(np.rint(scaled), 1.0)


def requests_from_ticks(ticks: Sequence[StoredTick], *, seed: int) -> list[TraceRequest]:
    """The window's workload, rebuilt from its ticks as the module says; arrival order."""
    rng = np.random.default_rng(seed)
    lengths = _filled_lengths(ticks)
    requests: list[TraceRequest] = []
    carried = 0.0
    for tick, tick_lengths in zip(ticks, lengths, strict=True):
        obs = tick.observation
        if obs is None or obs.num_req is None or obs.num_req <= 0 or tick_lengths is None:
            continue
        carried += obs.num_req
        n = math.floor(carried + 1e-9)
        carried -= n
        if n == 0:
            continue
        start_s = max(tick.end_s - obs.duration_s, 0.0)
        arrivals = np.sort(rng.uniform(start_s, tick.end_s, size=n))
        isl = _scaled_to_mean(_isl_draws(rng, n, tick_lengths), tick_lengths.isl)
        osl = _scaled_to_mean(rng.exponential(tick_lengths.osl, size=n), tick_lengths.osl)
        requests.extend(
            TraceRequest(float(a), int(i), int(o)) for a, i, o in zip(arrivals, isl, osl, strict=True)
        )
    requests.sort(key=lambda r: r.arrival_s)
    return requests


def engine_seconds(
    steps: Sequence[tuple[float, dict[str, int]]], *, start: dict[str, int], end_s: float
) -> dict[str, float]:
    """Per role, Σ count × time from 0 to `end_s` of a schedule that holds `start` until its first
    step and each step's counts until the next (a step naming only some roles keeps the others)."""
    counts = {role: start.get(role, 0) for role in ROLES}
    totals = dict.fromkeys(ROLES, 0.0)
    at_s = 0.0
    for step_s, target in (*steps, (end_s, {})):
        step_s = min(max(step_s, at_s), end_s)
        for role in ROLES:
            totals[role] += counts[role] * (step_s - at_s)
        counts.update({role: n for role, n in target.items() if role in counts})
        at_s = step_s
    return totals


class RecordedPolicy:
    """The decisions the deployment took, each ordered at the moment it was made (seconds from
    the replay's 0), from the counts in force at the window's start. In the simulator, as in the
    demo's orchestrator, an order goes out at once and its engines serve a start-up delay later."""

    name = "recorded"

    def __init__(self, initial: dict[str, int], steps: Sequence[tuple[float, dict[str, int]]]) -> None:
        self._initial = {role: initial.get(role, 0) for role in ROLES}
        self.steps = sorted(((max(at_s, 0.0), dict(t)) for at_s, t in steps), key=lambda s: s[0])
        self._next = 0

    def initial(self) -> dict[str, int]:
        return dict(self._initial)

    def first_tick_s(self) -> float:
        return self.steps[0][0] if self.steps else math.inf

    def tick(self, now_s: float, cluster: Cluster) -> PolicyStep:
        target = dict(cluster.targets)
        while self._next < len(self.steps) and self.steps[self._next][0] <= now_s:
            target.update(self.steps[self._next][1])
            self._next += 1
        next_s = self.steps[self._next][0] if self._next < len(self.steps) else math.inf
        # Two decisions at one instant would otherwise ask for a tick not after now.
        next_s = next_s if next_s > now_s else math.nextafter(now_s, math.inf)
        return PolicyStep(target, "recorded: the decision the deployment took", next_s)
