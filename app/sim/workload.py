"""Workloads for the simulator: a trace at K times its rate, and arrivals synthesised from a rate
curve (ServeGen's per-window request rates) with request lengths drawn from a real trace.

Both are seeded and deterministic: the same inputs give the same requests.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.core.traces import TraceRequest

JITTER_S = 0.5


def expand_rate(requests: Sequence[TraceRequest], k: float, seed: int) -> list[TraceRequest]:
    """The trace at `k` times its arrival rate, with its shape over time kept: each request
    becomes `k` requests with the same lengths and arrival times spread uniformly within ±0.5 s
    (clipped at 0). A fractional `k` copies each request floor(k) times plus once more with
    probability frac(k)."""
    if not (math.isfinite(k) and k > 0):
        raise ValueError(f"rate scale must be a positive number, got {k!r}")
    if k == 1:
        return list(requests)
    rng = random.Random(seed)
    whole, frac = int(k), k - int(k)
    out: list[TraceRequest] = []
    for r in requests:
        copies = whole + (1 if frac and rng.random() < frac else 0)
        for _ in range(copies):
            arrival = max(0.0, r.arrival_s + rng.uniform(-JITTER_S, JITTER_S))
            out.append(TraceRequest(arrival, r.isl_tokens, r.osl_tokens))
    out.sort(key=lambda r: r.arrival_s)
    return out


@dataclass(frozen=True)
class RateWindow:
    start_s: float
    rate_rps: float


def read_rate_curve(path: str | Path) -> list[RateWindow]:
    """ServeGen's aggregate rate file (`window_start_s,total_rate_rps,...`)."""
    path = Path(path)
    try:
        with path.open(newline="") as stream:
            rows = list(csv.DictReader(stream))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror})") from None
    windows = []
    for line_no, row in enumerate(rows, start=2):
        try:
            windows.append(RateWindow(float(row["window_start_s"]), float(row["total_rate_rps"])))
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{path}:{line_no}: expected numeric window_start_s and total_rate_rps"
            ) from None
    if not windows:
        raise ValueError(f"{path}: no rate windows")
    return windows


def synthesize(
    windows: Sequence[RateWindow],
    lengths: Sequence[TraceRequest],
    *,
    compress: float,
    rate_scale: float = 1.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """Poisson arrivals following a rate curve whose time axis is divided by `compress` (a day
    of 600 s windows at `compress=24` lasts an hour), at the windows' own request rates ×
    `rate_scale`; each request's lengths are those of a request drawn from `lengths`."""
    if not windows:
        raise ValueError("no rate windows")
    if not lengths:
        raise ValueError("no requests to draw lengths from")
    if not (compress > 0 and rate_scale > 0):
        raise ValueError(f"compress and rate_scale must be positive, got {compress}, {rate_scale}")
    rng = random.Random(seed)
    origin = windows[0].start_s
    out: list[TraceRequest] = []
    for i, window in enumerate(windows):
        start = (window.start_s - origin) / compress
        end = (
            (windows[i + 1].start_s - origin) / compress
            if i + 1 < len(windows)
            else start + ((window.start_s - windows[i - 1].start_s) / compress if i else 0.0)
        )
        rate = window.rate_rps * rate_scale
        t = start
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= end:
                break
            sample = lengths[rng.randrange(len(lengths))]
            out.append(TraceRequest(t, sample.isl_tokens, sample.osl_tokens))
    return out
