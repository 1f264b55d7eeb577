"""`planner replay --from-store`: a deployment's own stored traffic, rebuilt as requests, and the
decisions it actually took, replayed as a policy on the same clock.

The store keeps no request, only what each tick observed over the interval that ended at it
(`duration_s`): the requests that arrived (`num_req`, a count of arrivals), the mean input and
output lengths and the histogram of input lengths (of the requests that completed in it). From
each tick the workload gets, deterministically for a given seed:

- **how many**: `num_req`, carried from tick to tick so that fractional counts (a Prometheus
  rate) add up to the stored total instead of being rounded away one tick at a time;
- **in bursts**: the tick's requests arrive in bursts of k, k the index of dispersion of the
  per-tick counts around the tick (`burst_sizes`, as SLA scaling reads burstiness); k = 1 for
  Poisson traffic;
- **when**: each burst at a time drawn uniformly over the tick's interval (a Poisson process given
  its count), its requests within ±BURST_SPREAD_S of it;
- **ISL**: per request, a bucket of the stored histogram drawn in proportion to its count and a
  length uniform inside it (from its lower to its upper bound; the open bucket up to
  OPEN_BUCKET_SPAN times its lower bound), then the tick's lengths scaled so that their mean is
  the stored mean ISL;
- **OSL**: per request, a gamma draw of shape OSL_GAMMA_SHAPE around the stored mean OSL, scaled
  likewise to the stored mean; at least one token.

A burst's requests are distinct requests that arrived together: the counts show that they came
at once, not that they were the same. Read as copies of one request, a burst of k carries k times
one prompt's length, and the index the counts give (clusters of different requests as well as
repeats) makes such bursts larger than the traffic's own repeats.

A tick that observed arrivals but no lengths (none completed yet) takes the lengths of the
nearest tick before it that has them, or else after it. Time 0 of the replay is the start of the
window's first tick interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.core.sla.demand import dispersion_index
from app.core.sla.types import TrafficSample
from app.core.traces import TraceRequest
from app.core.types import TrafficObservation
from app.sim.replay.policies import PolicyStep
from app.sim.world.cluster import ROLES, Cluster

# The open bucket of the ISL histogram ("+Inf") reaches this many times its lower bound.
OPEN_BUCKET_SPAN = 2.0
# The spread of output lengths, which the store does not keep (only their mean): a gamma of shape
# 2, coefficient of variation 0.71, near the bundled Azure conversation trace's 0.77. An exponential
# (shape 1) reaches five times the mean one request in 150, a tail that held decode batches and put
# the replay's ITL attainment 4.6 points below the same decisions on the real trace.
OSL_GAMMA_SHAPE = 2.0
# Ticks whose request counts give a tick's burstiness: ten minutes at the default 5 s tick, long
# enough for a variance, short enough to follow a day's changes.
DISPERSION_WINDOW_TICKS = 120
# A burst's requests arrive within ± this of its instant: under the 5 s tick, so the counts it
# was read from cannot tell; the bundled benchmark's scaled traces cluster copies as tightly.
BURST_SPREAD_S = 0.5


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
    current = float(np.mean(values))
    scaled = values * (mean / current) if current > 0 else np.full(values.shape, mean)
    return np.maximum(np.rint(scaled), 1.0)


def _osl_draws(rng: np.random.Generator, n: int, mean: float) -> np.ndarray:
    """`n` output lengths around `mean`: a gamma of shape OSL_GAMMA_SHAPE (see it)."""
    return rng.gamma(OSL_GAMMA_SHAPE, mean / OSL_GAMMA_SHAPE, size=n)


def burst_sizes(ticks: Sequence[StoredTick]) -> list[int]:
    """Per tick, the size of the bursts its requests arrive in: the index of dispersion of the
    per-tick request counts (Var ÷ mean, read as SLA scaling reads it: `dispersion_index`) over
    the DISPERSION_WINDOW_TICKS around it, rounded; 1 for Poisson arrivals. Arrivals in bursts
    of k requests have exactly that index, k, at any tick length above the burst's."""
    samples = [
        TrafficSample(t.end_s, t.observation.duration_s, t.observation.num_req, None, None)
        if t.observation is not None and t.observation.num_req is not None
        else None
        for t in ticks
    ]
    half = DISPERSION_WINDOW_TICKS // 2
    sizes = []
    for i in range(len(ticks)):
        window = [x for x in samples[max(0, i - half) : i + half + 1] if x is not None]
        sizes.append(max(1, round(dispersion_index(window, prior_s=0.0))))
    return sizes


def requests_from_ticks(ticks: Sequence[StoredTick], *, seed: int) -> list[TraceRequest]:
    """The window's workload, rebuilt from its ticks as the module says; arrival order."""
    rng = np.random.default_rng(seed)
    lengths = _filled_lengths(ticks)
    requests: list[TraceRequest] = []
    carried = 0.0
    for tick, tick_lengths, burst in zip(ticks, lengths, burst_sizes(ticks), strict=True):
        obs = tick.observation
        if obs is None or obs.num_req is None or obs.num_req <= 0 or tick_lengths is None:
            continue
        carried += obs.num_req
        n = math.floor(carried + 1e-9)
        carried -= n
        if n == 0:
            continue
        # ceil(n / burst) bursts of sizes as equal as possible.
        bursts = math.ceil(n / burst)
        sizes = np.full(bursts, n // bursts) + (np.arange(bursts) < n % bursts)
        start_s = max(tick.end_s - obs.duration_s, 0.0)
        centres = np.repeat(rng.uniform(start_s, tick.end_s, size=bursts), sizes)
        spread_s = BURST_SPREAD_S if burst > 1 else 0.0
        arrivals = np.maximum(centres + rng.uniform(-spread_s, spread_s, size=n), 0.0)
        isl = _scaled_to_mean(_isl_draws(rng, n, tick_lengths), tick_lengths.isl)
        osl = _scaled_to_mean(_osl_draws(rng, n, tick_lengths.osl), tick_lengths.osl)
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
