"""SLA scaling: the planner's own algorithm (the seed's throughput and load modes are `seed`).

Every tick (`scaling.interval_s`, 5 s by default) it reads what a controller can read: the
frontend's traffic since the previous tick (requests, mean ISL and OSL, the ISL histogram), each
engine's latest forward pass (FPM) and the ready counts. Then, per role:

1. **World over profile** (`scale`): each fresh forward pass's wall time over the profile's time
   for the same work; the median of a tick's ratios, smoothed (EWMA) and bounded. Iterations are
   immune to the transients that mislead latency-based corrections (engines starting or
   draining change the latency users see, not the time an iteration of a given size takes).
2. **Lead** (`lead_s`): how long ordered engines took to become ready, measured from the planner's
   own scale-ups (EWMA); `startup_estimate_s` until it has measured one. The planner sizes for
   the traffic one lead ahead: engines ordered now serve no sooner.
3. **Demand**: the request rate of the busiest `burst_window_s` (10 s) of the last
   `level_window_s` (20 s): a burst longer than the TTFT target builds a queue whatever the
   minute's mean, and the window follows it within a tick. Or, where more, the smoother
   `trend_window_s` level raised by its forecast: the peak it reached within one lead in the
   traffic's own history (the `growth_quantile` of max(level over [t, t + lead]) ÷ level(t) over
   `history_s`, the larger of two estimates: among the pairs that started nearest the level now,
   and by a quantile regression on the level, capped at the way back to the history's median
   level; until that history has `growth_min_points`,
   `cold_start_growth`) and a ramp under way (the level's slope over max(2 × trend window,
   lead), carried a lead ahead). The forecast only ever raises the demand.
   Lengths are the trend window's means and the ISL histogram of the samples kept (`lookback_s`);
   burstiness is the index of dispersion of the per-tick request counts.
4. **Wish**: engines for that demand (`app/core/capacity.py`): prefill for the TTFT target
   including queueing (bursts and the prompt-length mix) and the prompts queued now; decode for
   the ITL target by Little's law at the `decode_peak_quantile` of the requests in flight,
   against the largest batch meeting `decode_itl_margin` × the target; decode also for the
   requests the engines actually hold or queue now, when that is more.
5. **Target**: up at once to the wish; down only to the highest wish of the scale-down window
   (`scale_down_window_s`, or `scale_down_window_leads` measured leads when that is longer), not
   before the planner has watched a full window, and not before the headroom is learned: the
   headroom, not the window, covers the lead.

Nothing here reads the clock: `now_s` comes with the input. State (the samples, wishes and
measured scales) is an explicit object the caller keeps between ticks.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
from statsmodels.regression.quantile_regression import QuantReg
from statsmodels.tools.sm_exceptions import IterationLimitWarning

from app.core.capacity import (
    Bucket,
    LengthMix,
    decode_batch_limit,
    decode_concurrency,
    peak_concurrency,
    prefill_engines,
)
from app.core.fpm import ForwardPassMetrics
from app.core.interpolation import PerfModel
from app.core.types import Replicas, Role, RoleBounds

EngineKey = tuple[str, int]
_DISPERSION_MIN_TICKS = 6
_QUANTREG_MAX_ITER = 2000


class SlaReason(StrEnum):
    NO_TRAFFIC_DATA = "no_traffic_data"
    MODEL_NOT_READY = "model_not_ready"
    NO_INVENTORY = "no_inventory"  # how many engines run is not known yet: no target
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    HOLD = "hold"  # the wish is below the count, the stabilisation window keeps it
    NO_CHANGE = "no_change"


@dataclass(frozen=True)
class SlaSettings:
    ttft_target_ms: float
    itl_target_ms: float
    bounds: dict[Role, RoleBounds]
    chunk_tokens: int  # prefill max_num_batched_tokens
    max_kv_tokens: int  # per decode engine
    quantile: float = 0.99
    prefill_max_utilisation: float = 0.9
    decode_itl_margin: float = 1.0  # decode batches are sized for this share of the ITL target
    decode_peak_quantile: float = 0.99  # of the requests in flight, the count decode is sized for
    level_window_s: float = 20.0
    burst_window_s: float = 10.0
    trend_window_s: float = 60.0
    lookback_s: float = 300.0
    scale_down_window_s: float = 60.0  # the scale-down window (the shortest, counted in leads)
    scale_down_window_leads: float = 0.0  # the window in scaling latencies (lead_s)
    startup_estimate_s: float = 120.0
    trend: bool = True
    history_s: float = 1800.0  # how much of the traffic's past the forecast's headroom learns from
    growth_quantile: float = 0.9
    # The headroom learns from this share of the history's pairs: those that started nearest the
    # level now (1: all of them).
    growth_neighbour_share: float = 0.3
    growth_min_points: int = 24
    growth_regression: bool = True  # the pooled estimate of the headroom, besides the neighbours'
    cold_start_growth: float = 1.6
    scale_bounds: tuple[float, float] = (0.5, 4.0)
    scale_smoothing: float = 0.3  # EWMA weight of a tick's median ratio


@dataclass(frozen=True)
class TrafficSample:
    """One tick's traffic, as the frontend counted it."""

    end_s: float
    duration_s: float
    num_req: float
    isl: float | None  # mean input tokens
    osl: float | None  # mean output tokens
    isl_buckets: tuple[Bucket, ...] = ()


@dataclass(frozen=True)
class SlaInput:
    now_s: float
    traffic: TrafficSample | None
    fpm: Mapping[Role, Mapping[EngineKey, ForwardPassMetrics]]
    ready: Mapping[Role, int]
    expected: Mapping[Role, int]  # what the planner last ordered (starting engines included)
    # False while the caller cannot say how many engines run (a service that just started, before
    # the connector, an acknowledged decision or every role's FPM tells it): zeros are unknowns,
    # and a target computed from them could scale a running cluster down.
    inventory_known: bool = True


@dataclass
class SlaState:
    samples: deque[TrafficSample] = field(default_factory=deque)
    wishes: deque[tuple[float, dict[Role, int]]] = field(default_factory=deque)
    # (t, prompt tokens per second, requests in decode at the target) of the level window
    history: deque[tuple[float, float, float]] = field(default_factory=deque)
    scale: dict[Role, float] = field(default_factory=dict)
    first_s: float | None = None
    # Scaling latency: the open scale-up orders (role -> (ordered at, count)) and the measurements.
    orders: dict[Role, tuple[float, int]] = field(default_factory=dict)
    lead_s: float | None = None
    seen: dict[tuple[Role, EngineKey], ForwardPassMetrics] = field(default_factory=dict)


@dataclass(frozen=True)
class SlaResult:
    replicas: Replicas | None
    reason: SlaReason
    detail: str
    diagnostics: dict[str, Any]


@dataclass(frozen=True)
class Growth:
    """How far the levels may rise within a lead: (prompt tokens, decode requests) ratios."""

    tokens: float  # the larger of the two estimates
    flight: float
    neighbours: tuple[float, float]
    regression: tuple[float, float] | None  # None: `growth_regression` is off
    # The regression's ceiling: the history's median level over the level now (None: off)
    ceiling: tuple[float, float] | None = None


@dataclass(frozen=True)
class Demand:
    """What the engines must serve at `now + lead`."""

    request_rate_s: float  # the level
    token_rate_s: float  # prompt tokens per second to size prefill for
    in_flight_mean: float  # requests in decode at the ITL target, on average
    in_flight: float  # ... at the decode peak quantile: what decode is sized for
    isl: float
    osl: float
    mix: LengthMix
    dispersion: float  # index of dispersion of the per-tick request counts
    growth: Growth | None  # None: no forecast (`trend` off)
    growth_learned: bool  # False: the cold-start headroom (the history is still too short)
    ramp: tuple[float, float]  # slopes of the two levels per second (0 when falling)


@dataclass(frozen=True)
class SlaTick:
    """What one tick of SLA scaling needs; the tick chain calls `sla_step` with it."""

    model: PerfModel | None
    state: SlaState
    input: SlaInput
    settings: SlaSettings


def sla_step(model: PerfModel | None, state: SlaState, inp: SlaInput, settings: SlaSettings) -> SlaResult:
    now = inp.now_s
    if state.first_s is None:
        state.first_s = now
    scales = {role: _update_scale(model, state, role, records, settings) for role, records in inp.fpm.items()}
    lead_s = _update_lead(state, inp, settings)
    if inp.traffic is not None and inp.traffic.duration_s > 0:
        state.samples.append(inp.traffic)
    while state.samples and state.samples[0].end_s <= now - settings.lookback_s:
        state.samples.popleft()
    diagnostics: dict[str, Any] = {
        "scale": {r: round(s, 4) for r, s in state.scale.items()},
        "scale_samples": scales,
        "lead_s": round(lead_s, 1),
        "lead_measured": state.lead_s is not None,
    }
    if model is None:
        return SlaResult(None, SlaReason.MODEL_NOT_READY, "no performance model", diagnostics)
    demand = _demand(state, now, lead_s, settings)
    if demand is None:
        return SlaResult(None, SlaReason.NO_TRAFFIC_DATA, "no traffic in the level window", diagnostics)
    diagnostics["demand"] = {
        "request_rate_s": round(demand.request_rate_s, 3),
        "token_rate_s": round(demand.token_rate_s, 1),
        "in_flight_mean": round(demand.in_flight_mean, 1),
        "in_flight": round(demand.in_flight, 1),
        "dispersion": round(demand.dispersion, 2),
        "growth": [round(demand.growth.tokens, 3), round(demand.growth.flight, 3)] if demand.growth else None,
        "growth_learned": demand.growth_learned,
        "growth_neighbours": _rounded(demand.growth.neighbours) if demand.growth_learned else None,
        "growth_regression": _rounded(demand.growth.regression) if demand.growth_learned else None,
        "growth_regression_ceiling": _rounded(demand.growth.ceiling) if demand.growth_learned else None,
        "ramp_per_s": [round(r, 4) for r in demand.ramp],
        "isl_mean": round(demand.isl, 1),
        "isl_quantile": round(demand.mix.quantile, 1),
        "osl_mean": round(demand.osl, 1),
    }
    wish, role_diag = _wishes(model, demand, inp, state, settings, lead_s)
    diagnostics["roles"] = role_diag
    if not inp.inventory_known:
        detail = "how many engines run is not known yet (no connector report, decision or FPM)"
        return SlaResult(None, SlaReason.NO_INVENTORY, detail, diagnostics)
    state.wishes.append((now, wish))
    window_s = scale_down_window_s(settings, lead_s)
    diagnostics["scale_down_window_s"] = round(window_s, 1)
    # Strictly older than the window: with a window of 0 the current wish stays in it.
    while state.wishes and state.wishes[0][0] < now - window_s:
        state.wishes.popleft()
    watched_s = now - state.first_s
    target: dict[Role, int] = {}
    reasons: dict[Role, SlaReason] = {}
    notes = []
    for role in settings.bounds:
        current = inp.expected.get(role, inp.ready.get(role, 0))
        want = wish[role]
        if want > current:
            target[role], reasons[role] = want, SlaReason.SCALE_UP
        elif want == current:
            target[role], reasons[role] = current, SlaReason.NO_CHANGE
        elif watched_s < window_s:
            target[role], reasons[role] = current, SlaReason.HOLD
            role_diag[role]["hold"] = f"watched {watched_s:.0f} s of the {window_s:.0f} s window"
        elif settings.trend and not demand.growth_learned:
            # The window is short because the learned headroom covers the lead; until it is
            # learned, nothing says which engines the next lead needs.
            target[role], reasons[role] = current, SlaReason.HOLD
            role_diag[role]["hold"] = "the forecast's headroom is not learned yet"
        else:
            stable = max(w[role] for _, w in state.wishes)
            if stable < current:
                target[role], reasons[role] = stable, SlaReason.SCALE_DOWN
            else:
                target[role], reasons[role] = current, SlaReason.HOLD
                role_diag[role]["hold"] = f"highest wish of the window is {stable}"
        role_diag[role]["reason"] = str(reasons[role])
        notes.append(f"{role} {current}->{target[role]} ({reasons[role]}, wish {want})")
        if target[role] > max(current, inp.ready.get(role, 0)) and role not in state.orders:
            # An order still open keeps its start: the engines it asked for come first. An order
            # the ready engines already meet measures nothing.
            state.orders[role] = (now, target[role])
    order = (SlaReason.SCALE_UP, SlaReason.SCALE_DOWN, SlaReason.HOLD, SlaReason.NO_CHANGE)
    reason = next(r for r in order if r in reasons.values())
    return SlaResult(target, reason, "; ".join(notes), diagnostics)


def scale_down_window_s(settings: SlaSettings, lead_s: float) -> float:
    """How long a wish keeps its engines: `scale_down_window_s`, or `scale_down_window_leads`
    scaling latencies when that is longer (0 leads by default). The headroom already covers the
    peak within one lead, so the window only filters the wish's tick-to-tick noise; a window in
    leads trades GPU-hours for fewer restarts (docs/scaling.md)."""
    return max(settings.scale_down_window_s, settings.scale_down_window_leads * lead_s)


def _bounded(value: int, bounds: RoleBounds) -> int:
    return max(bounds.min_replicas, min(bounds.max_replicas, value))


def _wishes(
    model: PerfModel, demand: Demand, inp: SlaInput, state: SlaState, settings: SlaSettings, lead_s: float
) -> tuple[dict[Role, int], dict[Role, dict[str, Any]]]:
    wish: dict[Role, int] = {}
    diag: dict[Role, dict[str, Any]] = {}
    if "prefill" in settings.bounds:
        scale = state.scale.get("prefill", 1.0)
        # The prompts queued now must be cleared too, by the time more engines could serve.
        queued = sum(r.queued.sum_prefill_tokens for r in inp.fpm.get("prefill", {}).values())
        backlog_rate = queued / max(lead_s, settings.level_window_s)
        sizing = prefill_engines(
            model,
            token_rate_s=demand.token_rate_s + backlog_rate,
            mix=demand.mix,
            ttft_target_ms=settings.ttft_target_ms,
            chunk_tokens=settings.chunk_tokens,
            scale=scale,
            quantile=settings.quantile,
            max_utilisation=settings.prefill_max_utilisation,
            max_engines=settings.bounds["prefill"].max_replicas,
            dispersion=demand.dispersion,
        )
        wish["prefill"] = _bounded(sizing.engines, settings.bounds["prefill"])
        diag["prefill"] = {
            "needed": sizing.engines,
            "wish": wish["prefill"],
            "utilisation": round(sizing.utilisation, 3),
            "wait_s": round(sizing.wait_s, 3) if math.isfinite(sizing.wait_s) else None,
            "service_s": round(sizing.service_s, 3),
            "capacity_tokens_s": round(sizing.capacity_tokens_s, 1),
            "queued_tokens": queued,
            "backlog_tokens_s": round(backlog_rate, 1),
            "meets_target": sizing.meets_target,
        }
    if "decode" in settings.bounds:
        scale = state.scale.get("decode", 1.0)
        batch = decode_batch_limit(
            model,
            isl_tokens=demand.isl,
            osl_tokens=demand.osl,
            itl_target_ms=settings.itl_target_ms * settings.decode_itl_margin,
            scale=scale,
            max_kv_tokens=settings.max_kv_tokens,
        )
        in_flight = demand.in_flight
        held = sum(
            r.scheduled.num_decode_requests + r.queued.num_decode_requests
            for r in inp.fpm.get("decode", {}).values()
        )
        needed = max(math.ceil(in_flight / batch), math.ceil(held / batch))
        wish["decode"] = _bounded(needed, settings.bounds["decode"])
        diag["decode"] = {
            "needed": needed,
            "wish": wish["decode"],
            "batch_limit": batch,
            "in_flight_at_target": round(in_flight, 1),
            "held_now": held,
        }
    return wish, diag


def _rates(samples: list[TrafficSample]) -> tuple[float, float, float | None, float | None]:
    """(duration, requests, mean ISL, mean OSL) of consecutive samples merged."""
    duration = sum(s.duration_s for s in samples)
    num = sum(s.num_req for s in samples)
    isl_n = [(s.isl, s.num_req) for s in samples if s.isl is not None and s.num_req > 0]
    osl_n = [(s.osl, s.num_req) for s in samples if s.osl is not None and s.num_req > 0]
    isl = sum(v * n for v, n in isl_n) / sum(n for _, n in isl_n) if isl_n else None
    osl = sum(v * n for v, n in osl_n) / sum(n for _, n in osl_n) if osl_n else None
    return duration, num, isl, osl


def _demand(state: SlaState, now: float, lead_s: float, settings: SlaSettings) -> Demand | None:
    """The rate to size for: the busiest `burst_window_s` of the last `level_window_s`, or the
    smoother `trend_window_s` level raised by its growth or ramp over the lead, whichever is
    more. Lengths are the trend window's means (ISL shifts move prefill work as much as the
    request rate does); burstiness is the index of dispersion of the per-tick request counts."""
    smooth = [s for s in state.samples if s.end_s > now - settings.trend_window_s]
    d_smooth, n_smooth, isl, osl = _rates(smooth)
    if d_smooth > 0 and n_smooth == 0:
        isl = osl = 0.0  # no request at all: nothing to serve, not an unknown
    if d_smooth <= 0 or isl is None or osl is None:
        return None
    # The busiest `burst_window_s` of the level window: a burst longer than the TTFT target
    # builds a queue whatever the minute's mean, so the level is the burst's rate.
    level = _busiest(
        [s for s in state.samples if s.end_s > now - settings.level_window_s], settings.burst_window_s
    )
    trend = n_smooth / d_smooth

    def in_flight(rate: float) -> float:
        return decode_concurrency(request_rate_s=rate, osl_tokens=osl, itl_target_ms=settings.itl_target_ms)

    if state.first_s is not None and now - state.first_s >= settings.trend_window_s:
        # Only a full window is a level: the first ticks' partial windows would read as a ramp.
        state.history.append((now, trend * isl, in_flight(trend)))
    while state.history and state.history[0][0] <= now - settings.history_s:
        state.history.popleft()
    growth = _growth_quantiles(state.history, lead_s, settings) if settings.trend else None
    learned = growth is not None
    if settings.trend and growth is None:
        # Nothing learned yet is the widest uncertainty, not none: a cold start gets a wide
        # headroom until the history has its points (a service starting into a ramp).
        cold = settings.cold_start_growth
        growth = Growth(tokens=cold, flight=cold, neighbours=(cold, cold), regression=None)
    g_tokens, g_flight = (growth.tokens, growth.flight) if growth else (1.0, 1.0)
    # A ramp under way goes on for the lead: its slope, carried from the middle of the window.
    ahead_s = lead_s + settings.trend_window_s / 2
    slope_window_s = max(2 * settings.trend_window_s, lead_s)
    ramp = (
        _slopes(state.history, now - slope_window_s, settings.trend_window_s)
        if settings.trend
        else (0.0, 0.0)
    )
    tokens_s = max(level * isl, trend * isl * g_tokens, trend * isl + ramp[0] * ahead_s)
    dispersion = _dispersion(list(state.samples))
    flight_mean = max(in_flight(level), in_flight(trend) * g_flight, in_flight(trend) + ramp[1] * ahead_s)
    buckets = _merged_buckets(list(state.samples))
    mix = LengthMix.from_histogram(buckets, isl, settings.quantile) if buckets else LengthMix.uniform(isl)
    return Demand(
        request_rate_s=level,
        token_rate_s=tokens_s,
        in_flight_mean=flight_mean,
        in_flight=peak_concurrency(
            flight_mean, dispersion=dispersion, quantile=settings.decode_peak_quantile
        ),
        isl=isl,
        osl=osl,
        mix=mix,
        dispersion=dispersion,
        growth=growth,
        growth_learned=learned,
        ramp=ramp,
    )


def _slopes(
    history: deque[tuple[float, float, float]], since_s: float, min_span_s: float
) -> tuple[float, float]:
    """Least-squares slopes (per second) of both levels since `since_s`, never below 0: only a
    rise is carried forward (the planner never scales in on a forecast). Points spanning less
    than `min_span_s` give no slope: the first minute's levels are too few to say anything."""
    points = np.array([h for h in history if h[0] > since_s])
    if len(points) < 3 or np.ptp(points[:, 0]) < min_span_s:
        return 0.0, 0.0
    t = points[:, 0] - points[:, 0].mean()
    denom = float((t * t).sum())
    tokens, flight = (
        max(0.0, float((t * (points[:, k] - points[:, k].mean())).sum()) / denom) for k in (1, 2)
    )
    return tokens, flight


def _busiest(items: list[TrafficSample], window_s: float) -> float:
    """The highest request rate over any run of consecutive ticks spanning at least `window_s`
    (all of them if they span less)."""
    best = 0.0
    for end in range(len(items)):
        start, span = end, items[end].duration_s
        while start > 0 and span < window_s:
            start -= 1
            span += items[start].duration_s
        d, n, _, _ = _rates(items[start : end + 1])
        if d > 0 and (span >= window_s or start == 0):
            best = max(best, n / d)
    return best


def _dispersion(items: list[TrafficSample]) -> float:
    """Var ÷ mean of the per-tick request counts: 1 for Poisson arrivals, more for bursts. The
    variance comes from the differences of consecutive ticks (a trend is not burstiness), by
    their median absolute deviation (one step in the level, a single large difference, is not
    burstiness either)."""
    if len(items) < _DISPERSION_MIN_TICKS:
        return 1.0  # the deviation of two or three differences says nothing
    tick_s = statistics.fmean(s.duration_s for s in items)
    counts = np.array([s.num_req / s.duration_s * tick_s for s in items if s.duration_s > 0])
    mean = float(counts.mean())
    if mean <= 0:
        return 1.0
    diffs = np.diff(counts)
    sigma = 1.4826 * float(np.median(np.abs(diffs - np.median(diffs))))
    return max(1.0, sigma * sigma / 2 / mean)


def _growth_quantiles(
    history: deque[tuple[float, float, float]], lead_s: float, settings: SlaSettings
) -> Growth | None:
    """How far each level rose within `lead_s`, as the traffic kept in the history did it: the
    `growth_quantile` of max(level over [t, t + lead]) ÷ level(t), at least 1, for prompt tokens
    and for requests in decode. The peak within the lead, not the level at its end: an engine let
    go now is back no sooner than a lead later, so the engines kept now must serve everything up
    to then. None until the history has `growth_min_points` such pairs.

    Two estimates, of which the larger counts (docs/scaling.md):
    - **neighbours**: the empirical quantile among the pairs that started nearest the level now
      (`growth_neighbour_share` of them, at least `growth_min_points`, nearest by ratio). From a
      trough traffic tends to climb, from a peak to fall: a quantile over the whole history is
      too thin in a trough and too wide at a peak, where the engines are many.
    - **regression** (`growth_regression`): a linear quantile regression of the log growth on the
      log of the level over the history's geometric mean, read at the level now. It pools every
      pair, so it sees the pull back towards the usual level in a trough the history has no
      neighbours for yet (the first trough), where the neighbours see only the flat trough. It
      is capped at that way back: the history's median level over the level now (`ceiling`)."""
    times = np.array([h[0] for h in history])
    later = np.searchsorted(times, times + lead_s)
    starts = np.flatnonzero(later < len(times))
    if len(starts) < settings.growth_min_points:
        return None
    # Both estimates are at least 1 (the forecast only ever raises the demand).
    neighbours, regression, ceiling = [], [], []
    for column in (1, 2):
        levels = np.array([h[column] for h in history])
        base = levels[starts]
        peaks = np.array([levels[i : later[i] + 1].max() for i in starts])
        pairs = base > 0
        now = levels[-1]
        if not pairs.any() or now <= 0:
            neighbours.append(1.0)
            regression.append(1.0)
            ceiling.append(1.0)
            continue
        log_growth = np.log(peaks[pairs] / base[pairs])
        log_level = np.log(base[pairs])
        near = log_growth
        if settings.growth_neighbour_share < 1:
            keep = max(settings.growth_min_points, int(settings.growth_neighbour_share * len(near)))
            near = log_growth[np.argsort(np.abs(log_level - math.log(now)), kind="stable")[:keep]]
        neighbours.append(max(1.0, math.exp(float(np.quantile(near, settings.growth_quantile)))))
        predicted = usual = 0.0  # with the regression off: x1, which the neighbours outvote
        if settings.growth_regression:
            reference = float(np.log(levels[levels > 0]).mean())
            predicted = _quantile_line(
                log_level - reference, log_growth, settings.growth_quantile, math.log(now) - reference
            )
            # The way back to the usual level, and no further: a straight line along the
            # history's upper envelope can read far more deep in a trough (ServeGen's first: x4,
            # where the way back to the usual level was x2), and above that level the neighbours
            # know better.
            median = float(np.median(levels))
            usual = math.log(median / now) if median > 0 else 0.0
        regression.append(max(1.0, math.exp(min(predicted, usual))))
        ceiling.append(math.exp(usual))
    return Growth(
        tokens=max(neighbours[0], regression[0]),
        flight=max(neighbours[1], regression[1]),
        neighbours=(neighbours[0], neighbours[1]),
        regression=(regression[0], regression[1]) if settings.growth_regression else None,
        ceiling=(ceiling[0], ceiling[1]) if settings.growth_regression else None,
    )


def _quantile_line(x: np.ndarray, y: np.ndarray, quantile: float, at: float) -> float:
    """The `quantile` of y given x = `at`, by linear quantile regression (statsmodels). Where x
    does not vary or the fit fails, the plain quantile of y: the line has nothing to lean on."""
    if np.ptp(x) <= 1e-9:
        return float(np.quantile(y, quantile))
    design = np.column_stack([np.ones_like(x), x])
    with warnings.catch_warnings():
        # Few distinct growths (steady traffic) converge slowly; the last iterate is still a line
        # of the right quantile to within its tolerance. The fit also estimates its standard
        # errors, which divide by zero when most residuals are 0; only the line is used.
        warnings.simplefilter("ignore", IterationLimitWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            intercept, slope = QuantReg(y, design).fit(q=quantile, max_iter=_QUANTREG_MAX_ITER).params
        except (np.linalg.LinAlgError, ValueError):
            return float(np.quantile(y, quantile))
    value = float(intercept + slope * at)
    return value if math.isfinite(value) else float(np.quantile(y, quantile))


def _rounded(pair: tuple[float, float] | None) -> list[float] | None:
    return [round(v, 3) for v in pair] if pair else None


def _merged_buckets(items: list[TrafficSample]) -> list[Bucket]:
    merged: dict[float, float] = {}
    for s in items:
        for bound, count in s.isl_buckets:
            merged[bound] = merged.get(bound, 0.0) + count
    return sorted(merged.items())


def _expected_s(model: PerfModel, role: Role, record: ForwardPassMetrics) -> float | None:
    """The profile's time for the work one forward pass did."""
    s = record.scheduled
    if role == "prefill" and s.sum_prefill_tokens > 0:
        return model.prefill_ttft_ms(s.sum_prefill_tokens) / 1000.0
    if role == "decode" and s.num_decode_requests > 0:
        context = s.sum_decode_kv_tokens / s.num_decode_requests
        return model.decode_itl_ms(s.num_decode_requests, context) / 1000.0
    return None


def _update_scale(
    model: PerfModel | None,
    state: SlaState,
    role: Role,
    records: Mapping[EngineKey, ForwardPassMetrics],
    settings: SlaSettings,
) -> int:
    """Fold this tick's fresh forward passes into the role's scale; returns how many were used."""
    if model is None:
        return 0
    ratios = []
    for key, record in records.items():
        if state.seen.get((role, key)) is record or record.wall_time_s <= 0:
            continue
        state.seen[(role, key)] = record
        expected = _expected_s(model, role, record)
        if expected:
            ratios.append(record.wall_time_s / expected)
    if ratios:
        low, high = settings.scale_bounds
        ratio = min(high, max(low, statistics.median(ratios)))
        before = state.scale.get(role)
        a = settings.scale_smoothing
        state.scale[role] = ratio if before is None else before + a * (ratio - before)
    return len(ratios)


def _update_lead(state: SlaState, inp: SlaInput, settings: SlaSettings) -> float:
    """Close the scale-up orders the ready counts have reached; their age is the scaling latency
    (EWMA), which is how far ahead the forecast looks."""
    for role, (ordered_s, count) in list(state.orders.items()):
        if inp.expected.get(role, count) < count:
            del state.orders[role]  # cancelled by a later scale-down: nothing measured
        elif inp.ready.get(role, 0) >= count:
            latency = inp.now_s - ordered_s
            state.lead_s = latency if state.lead_s is None else 0.7 * state.lead_s + 0.3 * latency
            del state.orders[role]
    return state.lead_s if state.lead_s is not None else settings.startup_estimate_s
