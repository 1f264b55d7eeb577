"""The demand one lead ahead: the level and burst of the recent traffic, the headroom the
traffic's own history teaches (the peak within a lead), any ramp under way, the length mix and the
burstiness (docs/scaling.md)."""

from __future__ import annotations

import math
import statistics
import warnings
from collections import deque

import numpy as np

from app.core.sla.capacity import Bucket, LengthMix, decode_concurrency, peak_concurrency
from app.core.sla.settings import SlaSettings
from app.core.sla.state import LevelRecord, SlaState
from app.core.sla.types import Demand, Growth, TrafficSample

_DISPERSION_MIN_TICKS = 6
_QUANTREG_MAX_ITER = 2000
# How far below the level now a history pair stops saying how this traffic grows and only says
# how high it went. At x1 every pair from below would count only as a height, and a rise to new
# highs (where every pair is from below) would read as no growth at all; a factor of two keeps the
# pairs of the same traffic at a somewhat lower level as growth.
_FAR_BELOW = 2.0
# A surge: ticks in a row, each arriving faster than the one before by more than `_SURGE_SD`
# standard deviations of that difference (Poisson's times the traffic's dispersion). Two rises in
# a row from a busy level are a crowd still arriving; from near silence (at most the quiet
# fraction of the rate now) two are also a burst after a quiet period that began mid-tick, a step
# whose size the quiet period's keep (quiet.py) answers for, so there it takes three. 3 sd: a
# difference that large comes by chance about once in 740 ticks, twice in a row about once in
# 550,000.
_SURGE_TICKS_FROM_QUIET = 3
_SURGE_TICKS = 2
_SURGE_SD = 3.0


def window_rates(samples: list[TrafficSample]) -> tuple[float, float, float | None, float | None]:
    """(duration, requests, mean ISL, mean OSL) of consecutive samples merged."""
    duration = sum(s.duration_s for s in samples)
    num = sum(s.num_req for s in samples)
    isl_n = [(s.isl, s.num_req) for s in samples if s.isl is not None and s.num_req > 0]
    osl_n = [(s.osl, s.num_req) for s in samples if s.osl is not None and s.num_req > 0]
    isl = sum(v * n for v, n in isl_n) / sum(n for _, n in isl_n) if isl_n else None
    osl = sum(v * n for v, n in osl_n) / sum(n for _, n in osl_n) if osl_n else None
    return duration, num, isl, osl


def demand_at(
    state: SlaState,
    now: float,
    lead_s: float,
    settings: SlaSettings,
    fallback_lengths: tuple[float, float] | None = None,
) -> Demand | None:
    """The rate to size for: the busiest `burst_window_s` of the last `level_window_s`, or the
    smoother `trend_window_s` level raised by its growth or ramp over the lead, whichever is
    more. Lengths are the trend window's means (ISL shifts move prefill work as much as the
    request rate does); burstiness is the index of dispersion of the per-tick request counts.
    `fallback_lengths` (mean ISL, OSL) stand in when requests arrived but none completed yet (a
    wake from zero: no engine served them)."""
    smooth = [s for s in state.samples if s.end_s > now - settings.trend_window_s]
    d_smooth, n_smooth, isl, osl = window_rates(smooth)
    if d_smooth > 0 and n_smooth == 0:
        isl = osl = 0.0  # no request at all: nothing to serve, not an unknown
    elif n_smooth > 0 and (isl is None or osl is None) and fallback_lengths is not None:
        isl, osl = fallback_lengths
    if d_smooth <= 0 or isl is None or osl is None:
        return None
    # The busiest `burst_window_s` of the level window: a burst longer than the TTFT target
    # builds a queue whatever the minute's mean, so the level is the burst's rate.
    level = busiest_rate(
        [s for s in state.samples if s.end_s > now - settings.level_window_s], settings.burst_window_s
    )
    trend = n_smooth / d_smooth

    def in_flight(rate: float) -> float:
        return decode_concurrency(request_rate_s=rate, osl_tokens=osl, itl_target_ms=settings.itl_target_ms)

    recorded = state.first_s is not None and now - state.first_s >= settings.trend_window_s
    if recorded:
        # Only a full window is a level: the first ticks' partial windows would read as a ramp.
        # The last two fields are what this tick forecast: the level, unless a steady rise is
        # under way (below).
        state.history.append(LevelRecord(now, trend * isl, in_flight(trend), trend * isl, in_flight(trend)))
    while state.history and state.history[0].t_s <= now - settings.history_s:
        state.history.popleft()
    # A ramp under way goes on for the lead: its slope, carried from the middle of the window.
    ahead_s = lead_s + settings.trend_window_s / 2
    slope_window_s = max(2 * settings.trend_window_s, lead_s)
    ramp = (
        _slopes(state.history, now - slope_window_s, settings.trend_window_s)
        if settings.trend
        else (0.0, 0.0)
    )
    # A ramp is carried up to the highest level the history has seen (or the level now, if
    # higher): the trend catching up with a step (a burst after a quiet period) rises as steeply
    # as a ramp for a trend window, and carried a lead ahead it would read several times the
    # burst; growth beyond the history's levels is the headroom's to forecast.
    top_tokens = max([level * isl, *(h.tokens_s for h in state.history)])
    top_flight = max([in_flight(level), *(h.in_flight for h in state.history)])
    ramp_tokens = min(trend * isl + ramp[0] * ahead_s, top_tokens)
    ramp_flight = min(in_flight(trend) + ramp[1] * ahead_s, top_flight)
    # Unless the arrivals rose along a line rather than in a step: a rise that has lasted the
    # whole slope window is growth compounding (a day's morning, a launch's spreading), and its
    # rate per second is carried the lead ahead, beyond any level seen (a first ramp has no
    # history above it, so the cap would leave the lead to the cold-start headroom).
    rates = None
    if ramp != (0.0, 0.0) and _rises_steadily(list(state.samples), now - slope_window_s):
        rates = _slopes(state.history, now - slope_window_s, settings.trend_window_s, log=True)
        ramp_tokens = max(ramp_tokens, trend * isl * math.exp(rates[0] * ahead_s))
        ramp_flight = max(ramp_flight, in_flight(trend) * math.exp(rates[1] * ahead_s))
    if recorded and rates is not None:
        # What this tick forecast a steady rise to reach: the headroom learns how far the
        # traffic went beyond it, so a rise carried here is not counted again as headroom where
        # the level is the same on the way down (below).
        state.history[-1] = LevelRecord(
            now,
            trend * isl,
            in_flight(trend),
            trend * isl * math.exp(rates[0] * ahead_s),
            in_flight(trend) * math.exp(rates[1] * ahead_s),
        )
    growth = _growth_quantiles(state.history, lead_s, settings) if settings.trend else None
    learned = growth is not None
    if settings.trend and growth is None:
        # Nothing learned yet is the widest uncertainty, not none: a cold start gets a wide
        # headroom until the history has its points (a service starting into a ramp).
        cold = settings.cold_start_growth
        growth = Growth(tokens=cold, flight=cold, neighbours=(cold, cold), regression=None)
    g_tokens, g_flight = (growth.tokens, growth.flight) if growth else (1.0, 1.0)
    # A crowd still arriving rises faster than the level window's busiest burst can follow, and
    # its engines are a lead away: carried ahead at its pace, for as long as it has lasted.
    dispersion = dispersion_index(list(state.samples), settings.dispersion_prior_s)
    surge = (
        _surge(list(state.samples), lead_s, dispersion, settings.quiet_fraction) if settings.trend else None
    )
    surge_rate = surge[1] if surge else 0.0
    tokens_s = max(level * isl, trend * isl * g_tokens, ramp_tokens, surge_rate * isl)
    flight_mean = max(in_flight(level), in_flight(trend) * g_flight, ramp_flight, in_flight(surge_rate))
    buckets = merged_buckets(list(state.samples))
    # No histogram (Dynamo's replay gives means only): the mean, at an exponential spread.
    mix = LengthMix.from_histogram(buckets, isl, settings.quantile)
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
        ramp_growth=rates,
        level_in_flight=in_flight(level),
        surge=surge,
    )


def _surge(
    samples: list[TrafficSample], lead_s: float, dispersion: float = 1.0, quiet_fraction: float = 0.0
) -> tuple[float, float] | None:
    """A rise under way at the tick scale: (how long it has lasted, the request rate it is
    carried to). When each of the last `_SURGE_TICKS` or more ticks (`_SURGE_TICKS_FROM_QUIET`
    where the rise began at most `quiet_fraction` of the rate now) arrived faster than the one
    before by more than `_SURGE_SD` standard deviations of that difference (Poisson's times the
    traffic's `dispersion`: the Azure trace at 30x, each request 30 arriving within a second,
    runs of three such rises on noise alone at Poisson's), the rise since the tick before
    the first goes on at its mean pace for as long as it has lasted, at most `lead_s`: a crowd
    half arrived is taken to arrive as much again. None otherwise (the last tick no longer rose:
    the level, the trend and the headroom take over)."""
    rates = [(s.num_req / s.duration_s, s.num_req, s.duration_s) for s in samples if s.duration_s > 0]
    rises, lasted_s = 0, 0.0
    for (before, n0, d0), (after, n1, d1) in zip(reversed(rates[:-1]), reversed(rates[1:]), strict=True):
        if after - before <= _SURGE_SD * math.sqrt(dispersion * (n1 / d1**2 + n0 / d0**2)):
            break
        rises += 1
        lasted_s += d1
    if not rises:
        return None
    start, now = rates[-1 - rises][0], rates[-1][0]
    if rises < (_SURGE_TICKS_FROM_QUIET if start <= quiet_fraction * now else _SURGE_TICKS):
        return None
    return lasted_s, now + (now - start) / lasted_s * min(lasted_s, lead_s)


def _slopes(
    history: deque[LevelRecord],
    since_s: float,
    min_span_s: float,
    *,
    log: bool = False,
) -> tuple[float, float]:
    """Least-squares slopes (per second) of both levels since `since_s` (of their logarithms with
    `log`: a growth rate), never below 0: only a rise is carried forward (the planner never
    scales in on a forecast). Points spanning less than `min_span_s` give no slope: the first
    minute's levels are too few to say anything."""
    points = np.array(
        [h[:3] for h in history if h.t_s > since_s and (not log or min(h.tokens_s, h.in_flight) > 0)]
    )
    if len(points) < 3 or np.ptp(points[:, 0]) < min_span_s:
        return 0.0, 0.0
    if log:
        points[:, 1:] = np.log(points[:, 1:])
    t = points[:, 0] - points[:, 0].mean()
    denom = float((t * t).sum())
    tokens, flight = (
        max(0.0, float((t * (points[:, k] - points[:, k].mean())).sum()) / denom) for k in (1, 2)
    )
    return tokens, flight


def _rises_steadily(samples: list[TrafficSample], since_s: float) -> bool:
    """Whether the per-tick arrival rates since `since_s` follow a line more closely than any
    single step does (the squared error of the least-squares line against that of the best split
    into two levels). A ramp keeps rising and its slope says where it goes; a step rose once."""
    points = [(s.end_s, s.num_req / s.duration_s) for s in samples if s.end_s > since_s and s.duration_s > 0]
    if len(points) < _DISPERSION_MIN_TICKS:
        return False
    t, y = (np.array(column, dtype=float) for column in zip(*points, strict=True))
    line_sse = float(((y - np.polyval(np.polyfit(t - t.mean(), y, 1), t - t.mean())) ** 2).sum())
    # Every split into the first k and the last n - k ticks, each at its own mean (prefix sums).
    n, k = len(y), np.arange(1, len(y))
    head, head_sq = np.cumsum(y)[:-1], np.cumsum(y * y)[:-1]
    tail, tail_sq = y.sum() - head, float((y * y).sum()) - head_sq
    step_sse = (head_sq - head * head / k) + (tail_sq - tail * tail / (n - k))
    return line_sse < float(step_sse.min())


def busiest_rate(items: list[TrafficSample], window_s: float) -> float:
    """The highest request rate over any run of consecutive ticks spanning at least `window_s`
    (the rate of all of them if together they span less)."""
    d_all, n_all, _, _ = window_rates(items)
    if d_all < window_s:
        return n_all / d_all if d_all > 0 else 0.0
    # Only full runs: a short first window (the scrape right after a start-up check, 0.04 s
    # holding two requests) read alone is a rate many times the traffic's.
    best = 0.0
    for end in range(len(items)):
        start, span = end, items[end].duration_s
        while start > 0 and span < window_s:
            start -= 1
            span += items[start].duration_s
        d, n, _, _ = window_rates(items[start : end + 1])
        if span >= window_s and d > 0:
            best = max(best, n / d)
    return best


def dispersion_index(items: list[TrafficSample], prior_s: float) -> float:
    """Var ÷ mean of the per-tick request counts: 1 for Poisson arrivals, more for bursts. The
    variance comes from the differences of consecutive ticks (a trend is not burstiness), by
    their median absolute deviation (one step in the level, a single large difference, is not
    burstiness either).

    The reading is shrunk towards Poisson's 1 by the ticks it rests on: `prior_s` of ticks weigh
    as much as the prior. A median deviation of a few differences is a poor variance (on Poisson
    counts, 8 ticks read above 2.6 one time in ten); read raw at a start-up it sized the long-prompt
    mix's prefill for bursts 4-7 times Poisson that its first minute did not have (1.5-2.5)."""
    if len(items) < _DISPERSION_MIN_TICKS:
        return 1.0  # the deviation of two or three differences says nothing
    tick_s = statistics.fmean(s.duration_s for s in items)
    counts = np.array([s.num_req / s.duration_s * tick_s for s in items if s.duration_s > 0])
    mean = float(counts.mean())
    if mean <= 0:
        return 1.0
    diffs = np.diff(counts)
    sigma = 1.4826 * float(np.median(np.abs(diffs - np.median(diffs))))
    raw = sigma * sigma / 2 / mean
    weight = len(diffs) / (len(diffs) + prior_s / tick_s)
    return max(1.0, 1.0 + weight * (raw - 1.0))


def _growth_quantiles(history: deque[LevelRecord], lead_s: float, settings: SlaSettings) -> Growth | None:
    """How far each level rose within `lead_s`, as the traffic kept in the history did it: the
    `growth_quantile` of max(level over [t, t + lead]) ÷ forecast(t), at least 1, for prompt
    tokens and for requests in decode. The peak within the lead, not the level at its end: an
    engine let go now is back no sooner than a lead later, so the engines kept now must serve
    everything up to then. Beyond the forecast made at t (the level, or a steady rise carried a
    lead ahead), not the level: a rise the forecast carried is no surprise, and counted as one it
    is read again wherever the level is the same on the way down. None until the history has
    `growth_min_points` such pairs.

    Two estimates, of which the larger counts (docs/scaling.md):
    - **neighbours**: the empirical quantile among the pairs that started nearest the level now
      (`growth_neighbour_share` of them, at least `growth_min_points`, nearest by ratio). From a
      trough traffic tends to climb, from a peak to fall: a quantile over the whole history is
      too thin in a trough and too wide at a peak, where the engines are many. A pair that
      started more than `_FAR_BELOW` (x2) below the level now counts the peak it reached over
      the level now (at least 1) where that is less than its own ratio.
    - **regression** (`growth_regression`): a linear quantile regression of the log growth on the
      log of the level over the history's geometric mean, read at the level now. It pools every
      pair, so it sees the pull back towards the usual level in a trough the history has no
      neighbours for yet (the first trough), where the neighbours see only the flat trough. It
      is capped at that way back: the history's median level over the level now (`ceiling`)."""
    times = np.array([h.t_s for h in history])
    later = np.searchsorted(times, times + lead_s)
    starts = np.flatnonzero(later < len(times))
    if len(starts) < settings.growth_min_points:
        return None
    # Both estimates are at least 1 (the forecast only ever raises the demand).
    neighbours, regression, ceiling = [], [], []
    for column in (1, 2):
        levels = np.array([h[column] for h in history])
        forecasts = np.maximum(np.array([h[column + 2] for h in history]), levels)
        base = levels[starts]
        peaks = np.array([levels[i : later[i] + 1].max() for i in starts])
        pairs = base > 0
        now = levels[-1]
        if not pairs.any() or now <= 0:
            neighbours.append(1.0)
            regression.append(1.0)
            ceiling.append(1.0)
            continue
        log_growth = np.log(peaks[pairs] / forecasts[starts][pairs])
        log_level = np.log(base[pairs])
        # A pair that started far below the level now says how high the traffic went, not that
        # it would rise by the same factor from up here: read at 400 req/s, a x10 crowd seen from
        # 40 forecasts 400, not 4,000. Nearer, the ratio is how this traffic grows (a rise to a
        # new high keeps the growth it had on the way).
        from_peak = np.maximum(0.0, np.log(peaks[pairs] / now))
        far = log_level < math.log(now / _FAR_BELOW)
        reached = np.where(far, np.minimum(log_growth, from_peak), log_growth)
        near = reached
        if settings.growth_neighbour_share < 1:
            keep = max(settings.growth_min_points, int(settings.growth_neighbour_share * len(near)))
            near = reached[np.argsort(np.abs(log_level - math.log(now)), kind="stable")[:keep]]
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
    # Imported here: statsmodels takes about a second to import, and every process that only
    # validates a file or fails at start-up (and every test that starts one) would pay it.
    from statsmodels.regression.quantile_regression import QuantReg
    from statsmodels.tools.sm_exceptions import IterationLimitWarning

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


def merged_buckets(items: list[TrafficSample]) -> list[Bucket]:
    merged: dict[float, float] = {}
    for s in items:
        for bound, count in s.isl_buckets:
            merged[bound] = merged.get(bound, 0.0) + count
    return sorted(merged.items())
