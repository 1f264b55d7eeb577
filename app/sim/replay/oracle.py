"""The clairvoyant oracle: the cheapest replica schedule for a trace known in advance.

A replay is graded against this oracle. It knows every future request and the truth model, and
answers in two steps:

1. `required_engines`: r*, the fewest engines per role in each interval `k` (covering
   `[k·interval_s, (k+1)·interval_s)`, from 0 to the interval of the last arrival) that meet both
   latency targets at the load that actually arrives.

   - **Prefill** is simulated: the interval's arrivals alone, on `c` empty `PrefillEngine`s (the
     simulator's own engine code, so the world's one-prompt and prefix-cost rules hold), routed
     as the cluster routes them (to the engine with the fewest prompt tokens pending, ties to the
     first; an arrival is routed before an iteration ending at the same instant). r* is the
     smallest `c` whose `quantile` of TTFT meets the target. Using the simulator's engines is
     the point: the answer holds in the simulated world the policies are graded in, chunked
     prefill and batching included. The search starts at a throughput guess (the busiest burst
     of prompts at the engine's best tokens per second plus each prompt's prefix cost, or each
     prompt alone when the engine computes one prompt per iteration, given the burst's length
     plus the target to finish), tries one below it if it passes and gallops up if it fails,
     then bisects; this assumes the TTFT quantile does not increase with `c`, which holds in
     practice but is not guaranteed (least-pending routing is greedy).
     When even one idle engine per request cannot meet the target (prompts too long), the
     target is raised to that best achievable quantile, so the answer stays finite.
   - **Decode** is analytic, by Little's law, and deliberately an upper bound: every request
     with `osl > 1` is taken to decode from its *arrival* for `(osl - 1) × itl_target_ms` (the
     longest it may take and still meet the target; its prefill, at most a TTFT, is not
     modelled, which shifts the window earlier but does not shorten it). The demand is the
     peak concurrency over the interval, counted on a grid of at most 1 s (a request counts in
     every cell it touches). An engine holds at most `n_max` requests: the largest batch whose
     iteration at the interval's mean context (mean ISL + mean OSL / 2 of the decoding requests
     arriving in it) meets the ITL target and whose KV need (n × (mean ISL + mean OSL)) fits in
     `max_kv_tokens`, and at most the engines' `max_num_seqs` when set; it is found by
     bisection, assuming the ITL grows with the batch. An interval with no decoding arrival but
     requests still decoding takes the mean context of the latest interval that had some (where
     those requests came from). If not even one request per engine meets the target,
     `n_max = 1` (the best an engine can do). r* = ceil(peak / n_max).

2. `oracle_schedule`: from r* of one role, the cheapest schedule when an engine ordered at `t`
   serves from `t + startup_delay_s` and is billed from `t`. It is the ski-rental-style greedy
   over level sets, exact for homogeneous replicas with a fixed start-up delay (project reference
   notes): the `k`-th engine is needed exactly while demand ≥ k, so the cost splits by level; at
   each level every busy run must be covered, and each idle gap between two runs is either
   bridged (billed for the gap) or paid as a restart (billed for the start-up delay, as the new
   engine is ordered that much ahead), so the cheaper of the two is taken independently per gap.
   A gap shorter than the delay is bridged; a gap equal to it is restarted (the same cost). Each
   run is ordered `startup_delay_s` before it starts, clipped at 0: engines needed at the start
   are there from time 0 and billed from 0. Nothing is dropped at the horizon
   (`len(demand) × interval_s`), where billing stops.

Pure functions: no clock, no I/O; the same inputs always give the same plan.
"""

from __future__ import annotations

import bisect
import heapq
import math
import numbers
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from app.core.sla.capacity import largest_meeting
from app.core.traces import TraceRequest
from app.sim.replay.results import OracleStep
from app.sim.world.cluster import ROLES
from app.sim.world.engines import PrefillEngine, SimRequest
from app.sim.world.truth import TruthModel

# A simulated TTFT is a sum of iteration times minus the arrival: allow for float rounding when
# comparing it with a target it may equal exactly (a request alone on an idle engine).
_TTFT_EPS_S = 1e-9
# Change points are rounded to the nanosecond, so that times equal on paper (a drop at j·interval
# and a restart ordered at i·interval − delay) are one point, not two an ulp apart.
_TIME_DIGITS = 9
# Decode concurrency is counted on cells of at most this width.
_DECODE_CELL_S = 1.0

_PENDING = attrgetter("pending_tokens")


# --- r*: engines needed per interval ---------------------------------------------------------------


def required_engines(
    requests: Sequence[TraceRequest],
    truth: TruthModel,
    *,
    interval_s: float,
    ttft_target_ms: float,
    itl_target_ms: float,
    quantile: float = 0.99,
) -> dict[str, list[int]]:
    """r* per role ("prefill", "decode"): one count per interval from 0 to the last arrival's."""
    _check_positive(interval_s, "interval_s")
    _check_positive(ttft_target_ms, "ttft_target_ms")
    _check_positive(itl_target_ms, "itl_target_ms")
    if not (0.0 < quantile <= 1.0):
        raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
    for i, request in enumerate(requests):
        if not (math.isfinite(request.arrival_s) and request.arrival_s >= 0):
            raise ValueError(f"requests[{i}]: arrival_s must be finite and >= 0, got {request.arrival_s!r}")
    if not requests:
        return {"prefill": [], "decode": []}
    ordered = sorted(requests, key=lambda r: r.arrival_s)  # stable: ties keep the given order
    count = int(ordered[-1].arrival_s // interval_s) + 1
    return {
        "prefill": _prefill_demand(ordered, truth, interval_s, ttft_target_ms / 1000.0, quantile, count),
        "decode": _decode_demand(ordered, truth, interval_s, itl_target_ms, count),
    }


def _check_positive(value: float, name: str) -> None:
    if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _prefill_demand(
    ordered: list[TraceRequest],
    truth: TruthModel,
    interval_s: float,
    target_s: float,
    quantile: float,
    count: int,
) -> list[int]:
    batches: list[list[SimRequest]] = [[] for _ in range(count)]
    for i, r in enumerate(ordered):
        batches[int(r.arrival_s // interval_s)].append(SimRequest(i, r.arrival_s, r.isl_tokens, r.osl_tokens))
    # The engine's best prefill cost per token (a full chunk, usually): the throughput guess.
    best_s_per_token = min(
        truth.prefill_iteration_s(n) / n for n in range(1, truth.max_num_batched_tokens + 1)
    )
    demand = []
    for batch in batches:
        guess = _prefill_guess(batch, truth, best_s_per_token, target_s, interval_s)
        demand.append(_min_prefill_engines(batch, truth, target_s, quantile, guess))
    return demand


def _prefill_guess(
    batch: list[SimRequest], truth: TruthModel, best_s_per_token: float, target_s: float, interval_s: float
) -> int:
    """Engines needed for the busiest burst: prompts arriving within `w` seconds must (nearly
    all) be done `target_s` after the last of them, so they need at least their work over
    `w + target_s`, at the engine's best speed (a prompt alone in the one-prompt world, which
    packs none; plus its prefix cost, k × ISL² / 2 however it is chunked, in the prefix-cost
    world). A guess, not a bound (the quantile lets a few be late): the search checks it either
    way."""
    if not batch:
        return 0
    arrival_s = np.array([r.arrival_s for r in batch])
    if truth.one_prompt:
        per_request_s = [truth.prefill_request_s(r.isl) for r in batch]
        work_s = np.concatenate(([0.0], np.cumsum(per_request_s)))
    elif truth.prefix_cost_s_per_token2:
        k = truth.prefix_cost_s_per_token2
        per_request_s = [r.isl * best_s_per_token + k * r.isl * r.isl / 2 for r in batch]
        work_s = np.concatenate(([0.0], np.cumsum(per_request_s)))
    else:
        work_s = np.concatenate(([0.0], np.cumsum([r.isl for r in batch]) * best_s_per_token))
    guess = 1
    for window_s in (1.0, 5.0, 15.0, 60.0):
        window_s = min(window_s, interval_s)
        ends = np.searchsorted(arrival_s, arrival_s + window_s, side="right")
        burst_s = float(np.max(work_s[ends] - work_s[: len(batch)]))
        guess = max(guess, math.ceil(burst_s / (window_s + target_s)))
    return guess


def _min_prefill_engines(
    batch: list[SimRequest], truth: TruthModel, target_s: float, quantile: float, guess: int
) -> int:
    n = len(batch)
    if n == 0:
        return 0
    # With `n` engines every arrival finds an idle one (at most n - 1 are busy), so each TTFT is
    # its prompt alone: the best achievable. A target below that is raised to it.
    alone_s = np.quantile([truth.prefill_request_s(r.isl) for r in batch], quantile)
    limit_s = max(target_s, float(alone_s)) + _TTFT_EPS_S
    # The linear quantile is at least the value of rank floor(q·(n-1)): more late requests than
    # this and the simulation can stop, it fails (the floor is taken low, to never stop early
    # on a pass).
    max_late = n - 1 - max(0, math.floor(quantile * (n - 1) - 1e-9))

    def meets(c: int) -> bool:
        if c >= n:
            return True  # the best achievable, by construction of limit_s
        ttfts = _simulate_prefill(batch, c, truth, limit_s, max_late)
        return ttfts is not None and float(np.quantile(ttfts, quantile)) <= limit_s

    guess = min(max(guess, 1), n)
    if meets(guess):
        # The guess is usually the answer or close: check just below before bisecting.
        if guess == 1 or not meets(guess - 1):
            return guess
        lo, hi = 1, guess - 1
    else:
        lo, step = guess + 1, 1
        while True:
            c = min(guess + step, n)
            if meets(c):
                hi = c
                break
            lo, step = c + 1, step * 2
    while lo < hi:  # smallest passing c in [lo, hi]; hi passes
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def _simulate_prefill(
    batch: list[SimRequest], count: int, truth: TruthModel, limit_s: float, max_late: int
) -> list[float] | None:
    """TTFTs of `batch` on `count` empty engines, or None once more than `max_late` exceed
    `limit_s` (the quantile cannot meet it any more)."""
    engines = [PrefillEngine(f"oracle-prefill-{i}", truth) for i in range(count)]
    events: list[tuple[float, int, PrefillEngine]] = []  # (iteration end, seq, engine); seq breaks ties
    seq = 0
    ttfts: list[float] = []
    late = 0
    push, pop = heapq.heappush, heapq.heappop

    def end_iteration() -> bool:
        nonlocal seq, late
        end_s, _, engine = pop(events)
        for request in engine.finish(end_s):
            ttft = end_s - request.arrival_s
            ttfts.append(ttft)
            if ttft > limit_s:
                late += 1
        following = engine.start(end_s)
        if following is not None:
            seq += 1
            push(events, (following, seq, engine))
        return late <= max_late

    for request in batch:
        now = request.arrival_s
        # Iterations ending strictly before the arrival first: at a tie the cluster routes first.
        while events and events[0][0] < now:
            if not end_iteration():
                return None
        engine = min(engines, key=_PENDING)
        engine.enqueue(request)
        if engine.busy_until is None:  # a busy engine starts its next iteration when this one ends
            seq += 1
            push(events, (engine.start(now), seq, engine))
    while events:
        if not end_iteration():
            return None
    return ttfts


def _decode_demand(
    ordered: list[TraceRequest], truth: TruthModel, interval_s: float, itl_target_ms: float, count: int
) -> list[int]:
    decoding = [r for r in ordered if r.osl_tokens > 1]
    if not decoding:
        return [0] * count
    arrival_s = np.array([r.arrival_s for r in decoding])
    isl = np.array([r.isl_tokens for r in decoding], dtype=float)
    osl = np.array([r.osl_tokens for r in decoding], dtype=float)

    # Concurrency on cells aligned with the intervals: a request occupies every cell its
    # [arrival, arrival + (osl - 1)·ITL target) touches, so a cell's count bounds its peak.
    cells_per_interval = max(1, math.ceil(interval_s / _DECODE_CELL_S))
    cell_s = interval_s / cells_per_interval
    total = count * cells_per_interval
    end_s = arrival_s + (osl - 1) * (itl_target_ms / 1000.0)
    first = np.minimum(np.floor(arrival_s / cell_s).astype(np.int64), total)
    stop = np.minimum(np.ceil(end_s / cell_s).astype(np.int64), total)
    stop = np.maximum(stop, first + 1)  # osl > 1: at least the arrival's cell
    diff = (
        np.bincount(first, minlength=total + 2)[: total + 1]
        - np.bincount(stop, minlength=total + 2)[: total + 1]
    )
    concurrency = np.cumsum(diff)[:total]
    peaks = concurrency.reshape(count, cells_per_interval).max(axis=1)

    # Mean ISL and OSL of the decoding requests arriving in each interval.
    index = np.minimum((arrival_s // interval_s).astype(np.int64), count - 1)
    arrivals = np.bincount(index, minlength=count)
    isl_sum = np.bincount(index, weights=isl, minlength=count)
    osl_sum = np.bincount(index, weights=osl, minlength=count)

    demand = []
    capacity: dict[tuple[float, float], int] = {}
    means: tuple[float, float] | None = None
    for k in range(count):
        if arrivals[k]:
            means = (float(isl_sum[k] / arrivals[k]), float(osl_sum[k] / arrivals[k]))
        peak = int(peaks[k])
        if peak == 0 or means is None:
            # means is None only before the first decoding arrival, where nothing decodes.
            demand.append(0)
            continue
        if means not in capacity:
            capacity[means] = decode_capacity(truth, means[0], means[1], itl_target_ms)
        demand.append(math.ceil(peak / capacity[means]))
    return demand


def decode_capacity(truth: TruthModel, isl_mean: float, osl_mean: float, itl_target_ms: float) -> int:
    """Requests one decode engine holds at the ITL target: the largest batch `n` whose iteration
    at context `isl_mean + osl_mean / 2` takes at most `itl_target_ms` and whose KV need
    `n × (isl_mean + osl_mean)` fits in `truth.max_kv_tokens`, at most `truth.max_num_seqs`
    (the engines schedule no more); 1 if none does (one request per engine is the best an engine
    can do). Bisection: the ITL is taken to grow with the batch."""
    context = isl_mean + osl_mean / 2
    need = isl_mean + osl_mean
    kv_cap = int(truth.max_kv_tokens // need) if need > 0 else truth.max_kv_tokens
    while kv_cap > 0 and kv_cap * need > truth.max_kv_tokens:
        kv_cap -= 1  # floor division in floats may round up
    cap = kv_cap if truth.max_num_seqs is None else min(kv_cap, truth.max_num_seqs)

    def meets(n: int) -> bool:
        return truth.decode_iteration_s(n * context, n) * 1000.0 <= itl_target_ms

    return largest_meeting(meets, cap)


# --- the schedule --------------------------------------------------------------------------------


@dataclass(frozen=True)
class OracleSchedule:
    """One role's engines, ordered or serving, over `[0, horizon_s]`."""

    steps: list[tuple[float, int]]  # (from time_s, count), time-sorted, starting at 0.0
    initial: int  # engines at t = 0
    gpu_hours: float
    horizon_s: float

    def count_at(self, t_s: float) -> int:
        """Engines at `t_s` (a change at `t_s` counts; before 0: the initial count)."""
        i = bisect.bisect_right(self.steps, t_s, key=lambda step: step[0]) - 1
        return self.steps[max(i, 0)][1]


def oracle_schedule(
    demand: Sequence[int], *, interval_s: float, startup_delay_s: float, gpus_per_engine: int = 1
) -> OracleSchedule:
    """The cheapest schedule serving `demand[k]` engines over `[k·interval_s, (k+1)·interval_s)`
    when engines are ordered `startup_delay_s` before they serve (module docstring)."""
    _check_positive(interval_s, "interval_s")
    delay_ok = isinstance(startup_delay_s, numbers.Real) and math.isfinite(startup_delay_s)
    if not (delay_ok and startup_delay_s >= 0):
        raise ValueError(f"startup_delay_s must be a finite number >= 0, got {startup_delay_s!r}")
    if not (isinstance(gpus_per_engine, int) and gpus_per_engine >= 1):
        raise ValueError(f"gpus_per_engine must be an integer >= 1, got {gpus_per_engine!r}")
    for k, d in enumerate(demand):
        if not (isinstance(d, int | np.integer) and d >= 0):
            raise ValueError(f"demand[{k}] must be an integer >= 0, got {d!r}")
    levels = [int(d) for d in demand]
    horizon_s = len(levels) * interval_s
    # A gap equal to the delay (up to float rounding) is restarted: with the restart ordered no
    # earlier than the drop, both land on one instant and cancel out.
    tolerance_s = 1e-9 * max(1.0, interval_s, startup_delay_s)

    changes: defaultdict[float, int] = defaultdict(int)

    def on(from_s: float, to_s: float | None) -> None:
        changes[round(from_s, _TIME_DIGITS)] += 1
        if to_s is not None:
            changes[round(to_s, _TIME_DIGITS)] -= 1

    for level in range(1, max(levels, default=0) + 1):
        start_s: float | None = None  # order time of the engine on at this level
        end_s = 0.0  # end of the last busy run at this level
        k = 0
        while k < len(levels):
            if levels[k] < level:
                k += 1
                continue
            run_start = k
            while k < len(levels) and levels[k] >= level:
                k += 1
            a_s, b_s = run_start * interval_s, k * interval_s
            if start_s is None:
                start_s = max(0.0, a_s - startup_delay_s)
            elif a_s - end_s < startup_delay_s - tolerance_s:
                pass  # bridge the gap: keep the engine on
            else:
                on(start_s, end_s)
                start_s = max(end_s, a_s - startup_delay_s)
            end_s = b_s
        if start_s is not None:
            # Kept to the horizon if the last run reaches it; dropped where it ends otherwise.
            on(start_s, end_s if end_s < horizon_s else None)

    steps: list[tuple[float, int]] = [(0.0, 0)]
    current = 0
    for t_s in sorted(changes):
        current += changes[t_s]
        if t_s == 0.0:
            steps[0] = (0.0, current)
        elif current != steps[-1][1]:
            steps.append((t_s, current))
    gpu_s = sum(
        count * ((steps[i + 1][0] if i + 1 < len(steps) else horizon_s) - t_s)
        for i, (t_s, count) in enumerate(steps)
    )
    return OracleSchedule(
        steps=steps, initial=steps[0][1], gpu_hours=gpu_s * gpus_per_engine / 3600.0, horizon_s=horizon_s
    )


# --- both roles ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class OraclePlan:
    demand: dict[str, list[int]]  # r* per role and interval
    schedule: dict[str, OracleSchedule]
    gpu_hours: float  # both roles, GPUs per engine included

    @property
    def timeline(self) -> list[OracleStep]:
        return combine(self.schedule)


def combine(schedules: Mapping[str, OracleSchedule]) -> list[OracleStep]:
    """The roles' schedules as one timeline: a step at every change of any role, with every
    role's count from then on."""
    times = sorted({t_s for schedule in schedules.values() for t_s, _ in schedule.steps})
    return [
        OracleStep(at_s=t_s, billed={role: s.count_at(t_s) for role, s in schedules.items()}) for t_s in times
    ]


def oracle_plan(
    requests: Sequence[TraceRequest],
    truth: TruthModel,
    *,
    interval_s: float,
    ttft_target_ms: float,
    itl_target_ms: float,
    startup_delay_s: float,
    gpus_per_engine: Mapping[str, int],
    quantile: float = 0.99,
) -> OraclePlan:
    """r* for both roles and their cheapest schedules (a role missing from `gpus_per_engine` has
    1 GPU per engine, as in the cluster)."""
    demand = required_engines(
        requests,
        truth,
        interval_s=interval_s,
        ttft_target_ms=ttft_target_ms,
        itl_target_ms=itl_target_ms,
        quantile=quantile,
    )
    schedule = {
        role: oracle_schedule(
            demand[role],
            interval_s=interval_s,
            startup_delay_s=startup_delay_s,
            gpus_per_engine=gpus_per_engine.get(role, 1),
        )
        for role in ROLES
    }
    return OraclePlan(demand=demand, schedule=schedule, gpu_hours=sum(s.gpu_hours for s in schedule.values()))
