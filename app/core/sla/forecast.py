"""The demand a count chosen now must serve, as a distribution learned from the traffic's own past.

Every tick records the level it saw (`LevelPoint`: prompt tokens per second and requests in decode
at the ITL target, both at the busiest burst of the level window). A count chosen now serves over a
horizon: engines ordered now serve from `now + lead` until the planner can change its mind again,
and engines released now are back no sooner than a lead later. For every past tick `t` whose
horizon has fully passed, the history holds a pair: what was seen at `t`, and the peak of the level
over `[t + start, t + end]`. The forecast now is read off the pairs that started nearest the level
now:

- **nearest** by `asinh(level / scale)`: logarithmic above `scale` (a twentieth of the history's
  own peak), linear below it, so every near-silent tick is a neighbour of every other and a level
  near zero never turns a ratio into a fleet;
- each neighbour gives one scenario: the level now plus the rise (or fall) that followed it, in
  absolute units (prompt tokens per second; requests in decode), never compounded over the lead;
- capped at `cap` times the history's own peak (the level now included): the forecast says what
  this traffic has done, not more.

Until the history holds `min_pairs` pairs the missing ones are the prior: the history's own peak
so far, or the level now times `prior_growth` where that is more (a wide guess, as nothing is
known), so the forecast moves from the prior to the traffic's own pairs as they come. Bursty, gappy
traffic yields wide scenario sets and smooth traffic narrow ones, with no rule per traffic kind.

**Calibration** (the keep horizon, `calibration`): each tick keeps what its forecast said (`Quote`,
the scenarios' request-weighted quantile at the target). Once that horizon has passed, the quote
is scored: the peak that came less the quote. The scenarios move up by the request-weighted
target quantile of those scores (each weighs the peak that came: a silent horizon misses nothing),
never down, and no higher than the history's own peak. Neighbours that have not yet seen what a
quiet moment can bring (a short history of bursts from silence) are corrected by the quiet
moments whose forecast fell short; forecasts that come true add nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

# The level below which the neighbour distance is linear, as a share of the history's peak: levels
# this far below the peak are all "near silent" and alike.
_SCALE_SHARE = 0.05
# Quantiles reported in the tick record (the scenarios themselves size the count).
REPORTED_QUANTILES = (0.5, 0.9, 0.99)


class Quote(NamedTuple):
    """What one tick's forecast said of one horizon `[t + start_s, t + end_s]`: the scenarios'
    request-weighted quantile at the target, before calibration (`calibration` scores it once the
    horizon has passed)."""

    start_s: float
    end_s: float
    tokens_s: float
    flight: float


@dataclass(frozen=True)
class LevelPoint:
    """What one tick saw: the busiest burst of the level window, as prompt tokens per second and
    as requests in decode at the ITL target (Little's law); and what its keep forecast said
    (None before it is made)."""

    t_s: float
    tokens_s: float
    flight: float
    keep: Quote | None = None


@dataclass(frozen=True)
class Forecast:
    """Equally likely demand scenarios over one horizon (prompt tokens/s and requests in decode,
    pairwise), and what they rest on."""

    tokens_s: np.ndarray
    flight: np.ndarray
    pairs: int  # history pairs among the scenarios (the rest is the prior)
    prior: int  # scenarios from the prior
    quote: Quote  # what this forecast says, before calibration (kept to score it later)
    shift: Shift  # the calibration the scenarios were moved by

    def summary(self) -> dict[str, Any]:
        """The reported quantiles of both, what they rest on and their calibration, for the tick
        record (`ForecastHorizon` in app/core/diagnostics.py)."""
        return {
            "q": list(REPORTED_QUANTILES),
            "tokens_s": [round(float(np.quantile(self.tokens_s, q)), 1) for q in REPORTED_QUANTILES],
            "flight": [round(float(np.quantile(self.flight, q)), 1) for q in REPORTED_QUANTILES],
            "pairs": self.pairs,
            "prior": self.prior,
            "shift_tokens_s": round(self.shift.tokens_s, 1),
            "shift_flight": round(self.shift.flight, 2),
            "scored": self.shift.scored,
        }


class Shift(NamedTuple):
    """How far a horizon's past forecasts fell short of the peaks that came (`calibration`)."""

    tokens_s: float = 0.0
    flight: float = 0.0
    scored: int = 0  # past forecasts whose horizon has passed


def request_quantile(values: np.ndarray, share: float) -> float:
    """The least scenario value such that the scenarios at or below it bring at least `share` of
    the requests (each weighs its own demand); 0 when no scenario brings any."""
    values = np.asarray(values, float)
    return weighted_quantile(values, values, share)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, share: float) -> float:
    """The least value such that the values at or below it carry at least `share` of the weight;
    0 when nothing weighs anything."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    if not len(cumulative) or cumulative[-1] <= 0:
        return 0.0
    index = int(np.searchsorted(cumulative, share * cumulative[-1] * (1 - 1e-12)))
    return float(values[order][min(index, len(order) - 1)])


def calibration(
    levels: Sequence[LevelPoint],
    quotes: Sequence[Quote | None],
    now: LevelPoint,
    *,
    share: float,
    min_scored: int,
) -> Shift:
    """The request-weighted `share` quantile of how far past quotes fell short: for each past tick
    whose quoted horizon has passed, the peak that came less the quote (negative where it came in
    below), weighted by that peak (the requests a shortfall would have missed; a horizon that
    stayed silent weighs nothing). Nothing until `min_scored` quotes are scored."""
    points = [*levels, now]
    t = np.fromiter((p.t_s for p in points), float, len(points))
    values = np.array([(p.tokens_s, p.flight) for p in points])
    scores, weights = [], []
    for i, quote in enumerate(quotes):
        if quote is None or t[i] + quote.end_s > now.t_s:
            continue
        a = int(np.searchsorted(t, t[i] + quote.start_s, side="left"))
        b = max(int(np.searchsorted(t, t[i] + quote.end_s, side="right")), a + 1)
        if a >= len(points):
            continue
        peak = values[a:b].max(axis=0)
        scores.append(peak - (quote.tokens_s, quote.flight))
        weights.append(peak)
    if len(scores) < min_scored:
        return Shift(scored=len(scores))
    s, w = np.array(scores), np.array(weights)
    return Shift(
        weighted_quantile(s[:, 0], w[:, 0], share),
        weighted_quantile(s[:, 1], w[:, 1], share),
        len(scores),
    )


def horizon_peaks(levels: Sequence[LevelPoint], start_s: float, end_s: float, now_s: float) -> np.ndarray:
    """For each level point, the peak prompt-token level and in-flight level over its horizon
    `[t + start_s, t + end_s]`, as an (n, 2) array; NaN where the horizon has not fully passed by
    `now_s`. A horizon shorter than a tick takes the first tick at or after its start."""
    n = len(levels)
    out = np.full((n, 2), np.nan)
    if n == 0:
        return out
    t = np.fromiter((p.t_s for p in levels), float, n)
    values = np.array([(p.tokens_s, p.flight) for p in levels])
    lo = np.searchsorted(t, t + start_s, side="left")
    hi = np.searchsorted(t, t + end_s, side="right")
    for i in np.flatnonzero(t + end_s <= now_s):
        a, b = lo[i], max(hi[i], lo[i] + 1)
        if a < n:
            out[i] = values[a:b].max(axis=0)
    return out


def forecast(
    levels: Sequence[LevelPoint],
    now: LevelPoint,
    *,
    start_s: float,
    end_s: float,
    share: float,
    neighbour_share: float,
    min_pairs: int,
    prior_growth: float,
    cap: float,
    floor_now: bool,
    quotes: Sequence[Quote | None] | None = None,
) -> Forecast:
    """The scenarios for the horizon `[now + start_s, now + end_s]` (see the module docstring).
    `floor_now`: the horizon includes the present, so no scenario is below the level now.
    `quotes`: what the forecasts of the same horizon said at each level point; given, the
    scenarios are calibrated by them."""
    peaks = horizon_peaks(levels, start_s, end_s, now.t_s)
    done = ~np.isnan(peaks[:, 0])
    x = np.array([(p.tokens_s, p.flight) for p in levels]).reshape(-1, 2)[done]
    y = peaks[done]
    top_tokens = max([now.tokens_s, *(p.tokens_s for p in levels)])
    top_flight = max([now.flight, *(p.flight for p in levels)])
    tokens: list[float] = []
    flight: list[float] = []
    if len(x):
        k = min(len(x), max(min_pairs, math.ceil(neighbour_share * len(x))))
        scale = max(_SCALE_SHARE * top_tokens, 1e-9)
        distance = np.abs(np.arcsinh(x[:, 0] / scale) - math.asinh(now.tokens_s / scale))
        # Pairs as near as the k-th are all neighbours: in a silence every silent tick of the
        # history is, and what followed each of them, not only the latest ones, is the outlook.
        order = np.flatnonzero(distance <= np.partition(distance, k - 1)[k - 1])
        tokens = list(now.tokens_s + (y[order, 0] - x[order, 0]))
        flight = list(now.flight + (y[order, 1] - x[order, 1]))
    pairs = len(tokens)
    prior = max(0, min_pairs - pairs)
    tokens += [max(now.tokens_s * prior_growth, top_tokens)] * prior
    flight += [max(now.flight * prior_growth, top_flight)] * prior
    low_tokens, low_flight = (now.tokens_s, now.flight) if floor_now else (0.0, 0.0)
    high_tokens, high_flight = max(cap * top_tokens, low_tokens), max(cap * top_flight, low_flight)
    base_tokens = np.clip(np.array(tokens, float), low_tokens, high_tokens)
    base_flight = np.clip(np.array(flight, float), low_flight, high_flight)
    quote = Quote(start_s, end_s, request_quantile(base_tokens, share), request_quantile(base_flight, share))
    shift = Shift()
    if quotes is not None:
        # Up only: a forecast that came in high is the base's own caution, and lowering it on a
        # few quiet scores would release what the next burst needs.
        shift = calibration(levels, quotes, now, share=share, min_scored=min_pairs)
        shift = Shift(max(shift.tokens_s, 0.0), max(shift.flight, 0.0), shift.scored)
    return Forecast(
        np.maximum(np.minimum(base_tokens + shift.tokens_s, np.maximum(base_tokens, top_tokens)), low_tokens),
        np.maximum(np.minimum(base_flight + shift.flight, np.maximum(base_flight, top_flight)), low_flight),
        pairs,
        prior,
        quote,
        shift,
    )
