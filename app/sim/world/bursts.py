"""Code-completion traffic as editors send it: bursts out of silence or a trickle, many times an
hour, with no warning; and `traffic_stats`, the statistics that describe such traffic.

A real code-completion trace at its own rate (58 minutes, about 2.5 requests/s) has:

- per-minute request counts: mean 152, max 632, coefficient of variation 1.03; 12 of the 58
  minutes without a request;
- per 10 s window: coefficient of variation 1.67, 56% of the windows empty;
- 24 silent gaps of 30 s or more between two requests, the longest 210 s;
- a minute's count over the previous minute's: 90th percentile about 23x;
- prompts: mean 2,048 tokens, median 1,469, p99 7,436; outputs: mean 28, median 13, p99 252.

`code_bursts` reproduces these at 1x (`traffic_stats` measures them); app/sim/world/workload.py
replays it at 20x as 20x the users would make it, each request copied 20 times.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import numpy as np

from app.core.traces import TraceRequest

# A completion's prompt is the code around the cursor, cut to the code model's context.
MAX_PROMPT_TOKENS = 8192
MAX_COMPLETION_TOKENS = 1024
# A gap between bursts this long or longer is a long one (and a silent gap in `traffic_stats`).
LONG_GAP_S = 30.0

Lengths = Callable[[random.Random], tuple[int, int]]


def _lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return min(high, max(low, round(rng.lognormvariate(math.log(median), sigma))))


def completion_lengths(rng: random.Random) -> tuple[int, int]:
    """A code completion's prompt and output, lognormal, fitted to the real trace.

    Prompt: median 1,469 tokens, sigma 0.72, clipped to 16..8,192. One lognormal cannot have the
    trace's median, mean and p99 together (its mean of 2,048 asks for sigma 0.82, its p99 of
    7,436 for sigma 0.70): sigma 0.72 gives a mean of about 1,880 and a p99 of about 7,800.
    Output: median 13 tokens, sigma 1.27, clipped to 1..1,024: mean about 29, p99 about 250."""
    return (
        _lognormal(rng, 1469, 0.72, 16, MAX_PROMPT_TOKENS),
        _lognormal(rng, 13, 1.27, 1, MAX_COMPLETION_TOKENS),
    )


def code_bursts(
    *,
    duration_s: float = 1800.0,
    short_gap_s: tuple[float, float] = (2.0, 30.0),
    long_gap_share: float = 0.45,
    max_gap_s: float = 210.0,
    trickle_share: float = 0.55,
    trickle_rps: float = 0.025,
    burst_median_s: float = 14.0,
    burst_sigma: float = 0.45,
    rate_median_rps: float = 12.0,
    small_share: float = 0.16,
    small_rate_rps: float = 0.7,
    rate_sigma: float = 0.25,
    lengths: Lengths = completion_lengths,
    seed: int = 0,
) -> list[TraceRequest]:
    """Code completion from a team's editors at its own rate (about 2.5 requests/s): gaps and
    bursts in turn, starting with a gap.

    A gap is short (uniform within `short_gap_s`) or, with probability `long_gap_share`, long:
    log-uniform from 30 s to `max_gap_s` (as many of 30-60 s as of 60-120 s), so a few minutes
    pass without a request many times an hour. A share `trickle_share` of the gaps carry a
    trickle (Poisson at `trickle_rps`, a request every 40 s) and the others are silent. A burst
    lasts a lognormal time (median `burst_median_s`, sigma `burst_sigma`, at least 1 s) at a
    lognormal rate (sigma `rate_sigma`) with median `rate_median_rps`, or `small_rate_rps` for a
    share `small_share` of them (a few people, not the whole team); Poisson arrivals within.
    Bursts start at full rate: the minutes before one are silent or nearly. A big burst's rate
    varies little (the busiest minute of the trace is only 4x its mean minute, and 10 s windows
    with requests vary with a CV of about 0.8); burst sizes spread through the durations and the
    two kinds of burst. Lengths from `lengths` (by default `completion_lengths`).

    Measured with `traffic_stats` over 40 seeds of 58 minutes (medians; the module docstring has
    the real trace's figures): 2.5 requests/s, per-minute max 590, CV 1.01, 9 empty minutes;
    per 10 s CV 1.78 with 55% empty; 26 silent gaps of 30 s or more, the longest 187 s; rise
    p90 23x (but 5x to 65x from seed to seed: it rests on a handful of minutes)."""
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration must be a positive number of seconds, got {duration_s!r}")
    if not (0 < short_gap_s[0] <= short_gap_s[1] <= LONG_GAP_S <= max_gap_s):
        raise ValueError(f"gaps must satisfy 0 < short gaps <= {LONG_GAP_S:g} s <= max_gap_s")
    if not all(0 <= share <= 1 for share in (long_gap_share, trickle_share, small_share)):
        raise ValueError("long_gap_share, trickle_share and small_share must be within 0..1")
    if not min(trickle_rps, burst_median_s, rate_median_rps, small_rate_rps) > 0:
        raise ValueError("rates and the burst median must be positive")
    rng = random.Random(seed)

    def poisson(start: float, end: float, rate: float) -> None:
        t = start
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                return
            arrivals.append(t)

    arrivals: list[float] = []
    t = 0.0
    while True:
        if rng.random() < long_gap_share:
            gap = LONG_GAP_S * (max_gap_s / LONG_GAP_S) ** rng.random()
        else:
            gap = rng.uniform(*short_gap_s)
        if rng.random() < trickle_share:
            poisson(t, min(t + gap, duration_s), trickle_rps)
        t += gap
        if t >= duration_s:
            break
        length = max(1.0, rng.lognormvariate(math.log(burst_median_s), burst_sigma))
        median = small_rate_rps if rng.random() < small_share else rate_median_rps
        end = min(duration_s, t + length)
        poisson(t, end, rng.lognormvariate(math.log(median), rate_sigma))
        t = end
    return [TraceRequest(a, *lengths(rng)) for a in arrivals]


def traffic_stats(requests: Sequence[TraceRequest], duration_s: float) -> dict[str, float]:
    """The statistics that describe bursty traffic, as a flat dict of numbers.

    Counted over whole minutes and whole 10 s windows from t = 0 to `duration_s` (a partial
    last window is left out): `minute_mean`, `minute_max`, `minute_cv` (standard deviation over
    mean), `minute_empty` (how many), `minute_empty_share`, and the same with `window10s_`.
    `rise_p90`: the 90th percentile of a minute's count over the previous minute's, over minutes
    that follow a minute with requests (a burst out of silence has no ratio: the empty minutes
    count those). Between consecutive requests: `gaps_30s` (silent gaps of 30 s or more) and
    `longest_gap_s`. Lengths: `isl_mean`, `isl_p50`, `isl_p99` and the same for `osl_`. Also
    `requests` and `rate_rps` (over `duration_s`)."""
    if not (math.isfinite(duration_s) and duration_s >= 60):
        raise ValueError(f"duration must be at least a minute, got {duration_s!r}")
    arrivals = np.sort(np.array([r.arrival_s for r in requests], dtype=float))
    stats = {"requests": float(len(arrivals)), "rate_rps": len(arrivals) / duration_s}
    for name, width in (("minute", 60.0), ("window10s", 10.0)):
        n = int(duration_s // width)
        inside = arrivals[(arrivals >= 0) & (arrivals < n * width)]
        counts = np.bincount((inside // width).astype(int), minlength=n)
        mean = float(counts.mean())
        stats[f"{name}_mean"] = mean
        stats[f"{name}_max"] = float(counts.max())
        stats[f"{name}_cv"] = float(counts.std()) / mean if mean > 0 else 0.0
        stats[f"{name}_empty"] = float((counts == 0).sum())
        stats[f"{name}_empty_share"] = float((counts == 0).mean())
        if name == "minute":
            after = counts[:-1] > 0
            rises = counts[1:][after] / counts[:-1][after]
            stats["rise_p90"] = float(np.percentile(rises, 90)) if len(rises) else 0.0
    gaps = np.diff(arrivals)
    stats["gaps_30s"] = float((gaps >= LONG_GAP_S).sum())
    stats["longest_gap_s"] = float(gaps.max()) if len(gaps) else 0.0
    lengths = {"isl": [r.isl_tokens for r in requests], "osl": [r.osl_tokens for r in requests]}
    for name, values in lengths.items():
        v = np.array(values or [0], dtype=float)
        stats[f"{name}_mean"] = float(v.mean())
        stats[f"{name}_p50"] = float(np.percentile(v, 50))
        stats[f"{name}_p99"] = float(np.percentile(v, 99))
    return stats
