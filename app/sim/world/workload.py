"""Workloads for the simulator: a trace at K times its rate, arrivals synthesised from a rate
curve (ServeGen's per-window request rates) with request lengths drawn from a real trace, and
generators for traffic patterns the planner was not tuned on (bursts with idle gaps, a flash
crowd, a smooth day, long prompts, heavy-tailed outputs, code completion's bursts out of
silence: app/sim/world/bursts.py).

All are seeded and deterministic: the same inputs give the same requests. `WORKLOADS` names
every workload of the decision-quality benchmark (bench/replay_quality.py), built from the
bundled traces; `planner replay --workload NAME` replays one.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.config import REPO_ROOT
from app.core.traces import TraceRequest
from app.sim.world.bursts import code_bursts
from app.sources.traces import load_trace

JITTER_S = 0.5


def expand_rate(
    requests: Sequence[TraceRequest], k: float, seed: int, *, spread_s: float = JITTER_S
) -> list[TraceRequest]:
    """The trace at `k` times its arrival rate, with its shape over time kept: each request
    becomes `k` requests with the same lengths and arrival times spread uniformly within
    ±`spread_s` (default 0.5 s; clipped at 0). A fractional `k` copies each request floor(k)
    times plus once more with probability frac(k).

    The copies of a request stand for other users sending the same request about then. Within
    ±0.5 s they arrive as a one-second burst that more users at the same rate need not make; a
    wider window (±30 s) spreads each request's copies over a minute, keeping the shape over
    minutes."""
    if not (math.isfinite(k) and k > 0):
        raise ValueError(f"rate scale must be a positive number, got {k!r}")
    if not (math.isfinite(spread_s) and spread_s >= 0):
        raise ValueError(f"rate spread must be a finite number of seconds >= 0, got {spread_s!r}")
    if k == 1:
        return list(requests)
    rng = random.Random(seed)
    whole, frac = int(k), k - int(k)
    out: list[TraceRequest] = []
    for r in requests:
        copies = whole + (1 if frac and rng.random() < frac else 0)
        for _ in range(copies):
            arrival = max(0.0, r.arrival_s + rng.uniform(-spread_s, spread_s))
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


# --- Workloads beyond the two the planner was tuned on --------------------------------------------
#
# Each generator stands for a traffic pattern seen in production that neither the Azure
# conversation trace nor ServeGen's daily curve has. Arrivals are a Poisson process whose rate
# follows the pattern (Lewis-Shedler thinning: candidates at the peak rate, each kept with
# probability rate(t) / peak), so two runs with the same seed give the same requests.

RateAt = Callable[[float], float]
Lengths = Callable[[random.Random], tuple[int, int]]

# Llama-3.1's context window (128k): a prompt rescaled beyond it could not be served at all.
MAX_CONTEXT_TOKENS = 131_072


def _poisson(rate_at: RateAt, peak_rps: float, duration_s: float, rng: random.Random) -> list[float]:
    """Arrival times in [0, duration_s) of a Poisson process with rate `rate_at(t)` ≤ `peak_rps`."""
    if not (peak_rps > 0 and duration_s > 0):
        raise ValueError(f"peak rate and duration must be positive, got {peak_rps}, {duration_s}")
    arrivals = []
    t = 0.0
    while True:
        t += rng.expovariate(peak_rps)
        if t >= duration_s:
            return arrivals
        if rng.random() * peak_rps < rate_at(t):
            arrivals.append(t)


def _requests(arrivals: Sequence[float], lengths: Lengths, rng: random.Random) -> list[TraceRequest]:
    # Lengths are drawn after the arrivals, from the same generator: both are fixed by the seed.
    return [TraceRequest(t, *lengths(rng)) for t in arrivals]


def drawn_from(requests: Sequence[TraceRequest]) -> Lengths:
    """Lengths of a request picked uniformly from a trace (its prompt and output together)."""
    if not requests:
        raise ValueError("no requests to draw lengths from")
    pairs = [(r.isl_tokens, r.osl_tokens) for r in requests]
    return lambda rng: pairs[rng.randrange(len(pairs))]


def _lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return min(high, max(low, round(rng.lognormvariate(math.log(median), sigma))))


def code_lengths(rng: random.Random) -> tuple[int, int]:
    """Code completion: a prompt of surrounding code (lognormal, median 1,500 tokens, clipped to
    64..8,192) and a completion of a line or a few (lognormal, median 24 tokens, clipped to
    1..512). A synthetic stand-in, not fitted to a trace: the bundled Azure trace is the
    conversation one, whose outputs (median 129) are far longer than a completion's."""
    return _lognormal(rng, 1500, 0.6, 64, 8192), _lognormal(rng, 24, 1.0, 1, 512)


def _raised_cosine(low_rps: float, high_rps: float, period_s: float) -> RateAt:
    """`low_rps` at t = 0, `high_rps` half a period later, `low_rps` again after a period."""
    return lambda t: low_rps + (high_rps - low_rps) * (1.0 - math.cos(2.0 * math.pi * t / period_s)) / 2.0


def bursty_gaps(
    *,
    duration_s: float = 1800.0,
    burst_s: tuple[float, float] = (20.0, 120.0),
    gap_s: tuple[float, float] = (60.0, 240.0),
    burst_rps: tuple[float, float] = (150.0, 450.0),
    lengths: Lengths = code_lengths,
    seed: int = 0,
) -> list[TraceRequest]:
    """Code completion from a team's editors: bursts of hundreds of requests per second while
    people type, separated by idle minutes. Bursts last uniform(`burst_s`) seconds at a rate
    uniform(`burst_rps`) (constant within the burst); the gaps between them last
    triangular(`gap_s`, mode at the short end) seconds, 2 minutes on average, during which
    nothing arrives: with the defaults the cluster is silent about 60% of the time, and the
    gaps (1 to 4 minutes) are on the scale of an engine's start-up delay, so a policy must
    choose between keeping idle engines and being late for the next burst. It starts with a
    burst at t = 0; short prompts and outputs (`code_lengths`)."""
    rng = random.Random(seed)
    bursts: list[tuple[float, float, float]] = []  # (start, end, rate)
    t = 0.0
    while t < duration_s:
        length = rng.uniform(*burst_s)
        bursts.append((t, min(t + length, duration_s), rng.uniform(*burst_rps)))
        t += length + rng.triangular(gap_s[0], gap_s[1], gap_s[0])
    arrivals = []
    for start, end, rate in bursts:
        steady = [start + a for a in _poisson(lambda _t, r=rate: r, rate, end - start, rng)]
        arrivals.extend(steady)
    return _requests(arrivals, lengths, rng)


def flash_crowd(
    lengths: Sequence[TraceRequest],
    *,
    base_rps: float = 40.0,
    factor: float = 10.0,
    jump_at_s: float = 600.0,
    rise_s: float = 20.0,
    hold_s: float = 300.0,
    decay_s: float = 150.0,
    duration_s: float = 1800.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """A flash crowd (a launch, a link on a front page, a batch job let loose): a steady
    `base_rps` that rises linearly to `factor` times itself within `rise_s` seconds at
    `jump_at_s`, stays there for `hold_s` seconds, then decays back towards the base with time
    constant `decay_s` (after three time constants 5% of the excess is left). Nothing in the
    past of the traffic announces the jump, so no forecast can see it coming: only the cost
    of catching up can be measured. Lengths drawn from `lengths` (a real trace)."""
    draw = drawn_from(lengths)
    peak = base_rps * factor
    hold_end = jump_at_s + rise_s + hold_s

    def rate_at(t: float) -> float:
        if t < jump_at_s:
            return base_rps
        if t < jump_at_s + rise_s:
            return base_rps + (peak - base_rps) * (t - jump_at_s) / rise_s
        if t < hold_end:
            return peak
        return base_rps + (peak - base_rps) * math.exp(-(t - hold_end) / decay_s)

    rng = random.Random(seed)
    return _requests(_poisson(rate_at, peak, duration_s, rng), draw, rng)


def diurnal(
    lengths: Sequence[TraceRequest],
    *,
    trough_rps: float = 30.0,
    peak_rps: float = 270.0,
    duration_s: float = 1800.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """A day of interactive traffic, compressed 48x into 30 minutes (not an hour, so that the
    benchmark's matrix fits its time budget): a smooth raised cosine from the night's
    `trough_rps` at t = 0 to the afternoon's `peak_rps` half-way and back. ServeGen's real day
    is ragged; this one is the smooth case a forecast should get right, with ramps (a 9x swing
    over 15 minutes) slower than any start-up delay. Lengths drawn from `lengths` (a real
    trace)."""
    draw = drawn_from(lengths)
    rng = random.Random(seed)
    rate_at = _raised_cosine(trough_rps, peak_rps, duration_s)
    return _requests(_poisson(rate_at, peak_rps, duration_s, rng), draw, rng)


def long_prompt(
    lengths: Sequence[TraceRequest],
    *,
    low_rps: float = 8.0,
    high_rps: float = 16.0,
    duration_s: float = 1800.0,
    isl_scale: float = 1.35,
    seed: int = 0,
) -> list[TraceRequest]:
    """Long-context traffic (retrieval, document chat, agents carrying long histories): a
    moderate rate swinging smoothly from `low_rps` to `high_rps` and back over the run, with
    lengths drawn from `lengths` (Mooncake's synthetic trace: mean prompt 15.3k tokens, p99
    66k) and every prompt × `isl_scale` (1.35: mean about 20.7k, p99 about 90k), capped at the
    model's 128k context. Prefill dominates; prompts above about 47k tokens take longer than a
    1 s TTFT alone on an idle engine, so some requests are late whatever the policy (2,980 of
    the 21,664, 14%, in the profile's world)."""
    if not isl_scale > 0:
        raise ValueError(f"isl_scale must be positive, got {isl_scale}")
    draw = drawn_from(lengths)

    def scaled(rng: random.Random) -> tuple[int, int]:
        isl, osl = draw(rng)
        return min(MAX_CONTEXT_TOKENS - osl, round(isl * isl_scale)), osl

    rng = random.Random(seed)
    rate_at = _raised_cosine(low_rps, high_rps, duration_s)
    return _requests(_poisson(rate_at, high_rps, duration_s, rng), scaled, rng)


def heavy_tail_output(
    lengths: Sequence[TraceRequest],
    *,
    low_rps: float = 50.0,
    high_rps: float = 110.0,
    duration_s: float = 1800.0,
    osl_median: float = 180.0,
    osl_sigma: float = 1.25,
    max_osl: int = 16_384,
    seed: int = 0,
) -> list[TraceRequest]:
    """Generation with heavy-tailed outputs (reasoning, code generation, long-form writing): a
    few requests decode for minutes and hold their KV cache all the while, so decode load lags
    the request rate and a scale-down strands long requests. Prompts are drawn from `lengths`
    (Azure-like); outputs are lognormal with median `osl_median` and sigma `osl_sigma` (1.25:
    mean about 390 tokens, p99 about 3,300) capped at `max_osl`. The rate swings smoothly from
    `low_rps` to `high_rps` and back over the run."""
    draw = drawn_from(lengths)

    def heavy(rng: random.Random) -> tuple[int, int]:
        isl, _ = draw(rng)
        return isl, _lognormal(rng, osl_median, osl_sigma, 1, max_osl)

    rng = random.Random(seed)
    rate_at = _raised_cosine(low_rps, high_rps, duration_s)
    return _requests(_poisson(rate_at, high_rps, duration_s, rng), heavy, rng)


# --- The benchmark matrix's workloads, by name -----------------------------------------------------

DATA_DIR = REPO_ROOT / "data" / "traces"
AZURE_CONV = "AzureLLMInferenceTrace_conv.csv"
SERVEGEN_RATE = "language_m-large_aggregate_rate.csv"
MOONCAKE_ARXIV = "mooncake_trace_arxiv_first1000.jsonl"
MOONCAKE_SYNTHETIC = "mooncake_synthetic_trace.jsonl"
# The Mooncake arXiv slice averages 5.65 req/s of 9.8k-token prompts (about one prefill engine's
# tokens), but arrives in batches: every 3.05 s about 17 requests stamped the same millisecond.
# Meeting the TTFT target on such a batch takes 11-16 prefill engines even at 1x (the oracle's
# r*), and one decode engine. At 2x each copy is jittered ±0.5 s, which spreads the batches:
# 6-14 prefill engines (about 10 on average) and 2 decode engines, for the trace's 178 s.
MOONCAKE_ARXIV_RATE_SCALE = 2


def _azure_conv_x30(data_dir: Path) -> list[TraceRequest]:
    return expand_rate(load_trace(data_dir / AZURE_CONV), 30, seed=0)


def _servegen_day1(data_dir: Path) -> list[TraceRequest]:
    # Day 2 of 14 (windows 144..287: the widest daily swing), the day compressed into an hour.
    day = read_rate_curve(data_dir / SERVEGEN_RATE)[144:288]
    return synthesize(day, load_trace(data_dir / AZURE_CONV), compress=24, seed=0)


def _mooncake_arxiv(data_dir: Path) -> list[TraceRequest]:
    return expand_rate(load_trace(data_dir / MOONCAKE_ARXIV), MOONCAKE_ARXIV_RATE_SCALE, seed=0)


def _bursty_gaps(data_dir: Path) -> list[TraceRequest]:
    return bursty_gaps(seed=0)


def _flash_crowd(data_dir: Path) -> list[TraceRequest]:
    return flash_crowd(load_trace(data_dir / AZURE_CONV), seed=0)


def _diurnal(data_dir: Path) -> list[TraceRequest]:
    return diurnal(load_trace(data_dir / AZURE_CONV), seed=0)


def _long_prompt(data_dir: Path) -> list[TraceRequest]:
    return long_prompt(load_trace(data_dir / MOONCAKE_SYNTHETIC), seed=0)


def _heavy_tail_output(data_dir: Path) -> list[TraceRequest]:
    return heavy_tail_output(load_trace(data_dir / AZURE_CONV), seed=0)


# Code completion at 20x its own rate (code_bursts, app/sim/world/bursts.py: 30 minutes of bursts out
# of silence, 2.6 requests/s at 1x with seed 0, 2.1 with seed 1), as 20x the users would send
# it: each request copied 20 times, within ±0.5 s of it (clustered: the silences kept, every
# request a one-second burst of 20) or within ±30 s (spread: the same minutes, smoother seconds,
# and the gaps shorter than a minute filled). 92,100 requests with seed 0, 75,780 with seed 1.
CODE_BURSTS_RATE_SCALE = 20
CODE_BURSTS_DURATION_S = 1800.0
CODE_BURSTS_SPREAD_S = {"clustered": JITTER_S, "spread": 30.0}


def _code_bursts(form: str, seed: int) -> Callable[[Path], list[TraceRequest]]:
    def build(data_dir: Path) -> list[TraceRequest]:
        base = code_bursts(duration_s=CODE_BURSTS_DURATION_S, seed=seed)
        return expand_rate(base, CODE_BURSTS_RATE_SCALE, seed, spread_s=CODE_BURSTS_SPREAD_S[form])

    return build


# Every workload of bench/replay_quality.py's matrix, built from the bundled traces in `data_dir`
# (data/traces/); `planner replay --workload NAME` replays one.
WORKLOADS: dict[str, Callable[[Path], list[TraceRequest]]] = {
    "azure-conv-x30": _azure_conv_x30,
    "servegen-day1": _servegen_day1,
    "mooncake-arxiv": _mooncake_arxiv,
    "bursty-gaps": _bursty_gaps,
    "flash-crowd": _flash_crowd,
    "diurnal": _diurnal,
    "long-prompt": _long_prompt,
    "heavy-tail-output": _heavy_tail_output,
    "code-bursts-clustered": _code_bursts("clustered", seed=0),
    "code-bursts-spread": _code_bursts("spread", seed=0),
    "code-bursts-clustered-s1": _code_bursts("clustered", seed=1),
    "code-bursts-spread-s1": _code_bursts("spread", seed=1),
}


def build_workload(name: str, data_dir: Path = DATA_DIR) -> list[TraceRequest]:
    """The named workload's requests, sorted by arrival; an unknown name is a ValueError listing
    the known ones."""
    build = WORKLOADS.get(name)
    if build is None:
        raise ValueError(f"unknown workload {name!r} (choose from {', '.join(WORKLOADS)})")
    requests = build(Path(data_dir))
    requests.sort(key=lambda r: r.arrival_s)  # stable; the generators already are
    return requests
