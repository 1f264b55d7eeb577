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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The level below which the neighbour distance is linear, as a share of the history's peak: levels
# this far below the peak are all "near silent" and alike.
_SCALE_SHARE = 0.05
# Quantiles reported in the tick record (the scenarios themselves size the count).
REPORTED_QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class LevelPoint:
    """What one tick saw: the busiest burst of the level window, as prompt tokens per second and
    as requests in decode at the ITL target (Little's law)."""

    t_s: float
    tokens_s: float
    flight: float


@dataclass(frozen=True)
class Forecast:
    """Equally likely demand scenarios over one horizon (prompt tokens/s and requests in decode,
    pairwise), and what they rest on."""

    tokens_s: np.ndarray
    flight: np.ndarray
    pairs: int  # history pairs among the scenarios (the rest is the prior)
    prior: int  # scenarios from the prior

    def quantiles(self) -> dict[str, list[float]]:
        """The reported quantiles of both, for the tick record."""
        return {
            "q": list(REPORTED_QUANTILES),
            "tokens_s": [round(float(np.quantile(self.tokens_s, q)), 1) for q in REPORTED_QUANTILES],
            "flight": [round(float(np.quantile(self.flight, q)), 1) for q in REPORTED_QUANTILES],
        }


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
    neighbour_share: float,
    min_pairs: int,
    prior_growth: float,
    cap: float,
    floor_now: bool,
) -> Forecast:
    """The scenarios for the horizon `[now + start_s, now + end_s]` (see the module docstring).
    `floor_now`: the horizon includes the present, so no scenario is below the level now."""
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
    tokens_a = np.clip(np.array(tokens, float), low_tokens, max(cap * top_tokens, low_tokens))
    flight_a = np.clip(np.array(flight, float), low_flight, max(cap * top_flight, low_flight))
    return Forecast(tokens_a, flight_a, pairs, prior)
