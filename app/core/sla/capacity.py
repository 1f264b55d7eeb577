"""How many engines a role needs for its latency target, from the profile and the load.

The formulas of SLA scaling (`app/core/sla/step.py`), kept apart so that each can be checked
on its own:

- **Prefill**: an engine computes prompts in chunks of up to `max_num_batched_tokens`; saturated,
  it processes `chunk ÷ TTFT(chunk)` tokens per second. A request's TTFT is the time it waits
  plus its own prefill. Routing to the least-loaded engine pools the `c` engines into one queue
  served `c` times as fast; the Pollaczek-Khinchine mean wait of that M/G/1 queue uses the second
  moment of the prompt lengths (a long-prompt mix needs more engines than its mean suggests),
  multiplied by the arrivals' index of dispersion (bursts wait like fewer, larger requests:
  M^X/G/1), and the wait's tail is the usual exponential approximation
  `P(W > x) ≈ ρ·exp(−x·ρ / E[W])`. The fewest engines whose `quantile` wait plus the prefill of
  a `quantile`-length prompt fits the target, at no more than `max_utilisation`.
- **Decode**: Little's law at the ITL target. A request of `osl` tokens decodes for
  `(osl − 1) × ITL`; at the target, the arrival rate λ keeps `λ × (osl − 1) × ITL` requests in
  flight on average, and a quantile of that count is sized for (`peak_concurrency`: an M^X/G/∞
  count, variance = mean × dispersion). One engine holds the largest batch whose iteration (the
  profile's ITL surface, at the batch's context) meets the target and whose KV fits: throughput
  and latency come from the same surface, so they cannot disagree. The search bisects, taking
  the ITL to grow with the batch; the interpolated surface is not strictly monotonic, so the
  limit can be off by a few requests where it is not.

`scale` is the world's latency over the profile's (1.2: everything 20% slower), as measured from
the engines' own iterations; every latency below is the profile's × `scale`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

from app.core.perf.interpolation import PerfModel

# (upper bound in tokens, requests) of one ISL histogram bucket; the last bound may be inf.
Bucket = tuple[float, float]


@dataclass(frozen=True)
class LengthMix:
    """Prompt lengths as the prefill formula needs them."""

    mean: float
    second_moment: float  # E[isl²]
    quantile: float  # the prompt length at the sizing quantile

    @classmethod
    def uniform(cls, isl: float) -> LengthMix:
        return cls(isl, isl * isl, isl)

    @classmethod
    def from_histogram(cls, buckets: list[Bucket], mean: float, q: float) -> LengthMix:
        """Moments from histogram buckets (each taken at the middle of its range, rescaled so the
        mean is the exact one) and the `q` quantile (interpolated inside its bucket; the open last
        bucket is taken to end at twice its lower bound: no better is known)."""
        total = sum(count for _, count in buckets)
        if total <= 0 or mean <= 0:
            return cls.uniform(max(mean, 0.0))
        mids: list[tuple[float, float]] = []
        lower = 0.0
        for upper, count in buckets:
            top = upper if math.isfinite(upper) else 2 * lower
            if count > 0:
                mids.append(((lower + top) / 2, count))
            lower = upper if math.isfinite(upper) else lower
        raw_mean = sum(m * c for m, c in mids) / total
        k = mean / raw_mean if raw_mean > 0 else 1.0
        second = sum((m * k) ** 2 * c for m, c in mids) / total
        # The quantile by linear interpolation inside its bucket, as PromQL's histogram_quantile.
        rank, seen, lower, quantile = q * total, 0.0, 0.0, mean
        for upper, count in buckets:
            top = upper if math.isfinite(upper) else 2 * lower
            if count > 0 and seen + count >= rank:
                quantile = lower + (top - lower) * (rank - seen) / count
                break
            seen += count
            lower = upper if math.isfinite(upper) else lower
        return cls(mean, max(second, mean * mean), max(quantile, mean))


def prefill_capacity_tokens_s(model: PerfModel, *, chunk_tokens: int, scale: float) -> float:
    """Prompt tokens per second of one saturated prefill engine."""
    return chunk_tokens / (model.prefill_ttft_ms(chunk_tokens) * scale / 1000.0)


def prefill_service_s(model: PerfModel, isl_tokens: float, *, chunk_tokens: int, scale: float) -> float:
    """One prompt alone on an idle engine: its full chunks, then the rest."""
    full, rest = divmod(max(isl_tokens, 1.0), chunk_tokens)
    ms = full * model.prefill_ttft_ms(chunk_tokens) + (model.prefill_ttft_ms(rest) if rest >= 1 else 0.0)
    return ms * scale / 1000.0


@dataclass(frozen=True)
class PrefillSizing:
    engines: int
    utilisation: float  # per engine, at that count
    wait_s: float  # the quantile wait at that count
    service_s: float  # prefill of a quantile-length prompt
    capacity_tokens_s: float  # per engine
    meets_target: bool  # False: even max_engines do not meet it (the count is then max_engines)


def prefill_engines(
    model: PerfModel,
    *,
    token_rate_s: float,
    mix: LengthMix,
    ttft_target_ms: float,
    chunk_tokens: int,
    scale: float,
    quantile: float = 0.99,
    max_utilisation: float = 0.9,
    max_engines: int = 1024,
    dispersion: float = 1.0,
) -> PrefillSizing:
    capacity = prefill_capacity_tokens_s(model, chunk_tokens=chunk_tokens, scale=scale)
    service_s = prefill_service_s(model, mix.quantile, chunk_tokens=chunk_tokens, scale=scale)
    budget_s = ttft_target_ms / 1000.0 - service_s
    if token_rate_s <= 0 or mix.mean <= 0:
        return PrefillSizing(0, 0.0, 0.0, service_s, capacity, budget_s >= 0)
    mean_s = mix.mean / capacity
    second_s2 = mix.second_moment / capacity**2
    request_rate = token_rate_s / mix.mean
    wait_s = math.inf
    start = max(1, math.ceil(token_rate_s / (capacity * max_utilisation)))
    for c in range(start, max_engines + 1):
        rho = request_rate / c * mean_s
        # Routing to the least-loaded engine pools the c engines into one server c times as
        # fast (service time S/c, so E[S²]/c²). Arrivals in bursts (index of dispersion of the
        # counts above 1) wait like fewer, larger requests: E[S²] grows by that factor (M^X/G/1).
        wait_s = _quantile_wait_s(request_rate, rho, second_s2 * max(dispersion, 1.0) / c**2, quantile)
        if wait_s <= budget_s:
            return PrefillSizing(c, rho, wait_s, service_s, capacity, True)
    rho = request_rate / max_engines * mean_s
    return PrefillSizing(max_engines, rho, wait_s, service_s, capacity, False)


def _quantile_wait_s(rate: float, rho: float, second_s2: float, quantile: float) -> float:
    if rho >= 1:
        return math.inf
    mean_wait = rate * second_s2 / (2 * (1 - rho))  # Pollaczek-Khinchine
    tail = 1 - quantile
    if rho <= tail or mean_wait <= 0:
        return 0.0  # fewer than 1 - quantile of the requests wait at all
    return mean_wait / rho * math.log(rho / tail)


def decode_batch_limit(
    model: PerfModel,
    *,
    isl_tokens: float,
    osl_tokens: float,
    itl_target_ms: float,
    scale: float,
    max_kv_tokens: int,
) -> int:
    """The most requests one decode engine holds at the ITL target: the largest batch whose
    iteration at context `isl + osl/2` meets the target and whose KV need `n × (isl + osl)` fits;
    1 when not even one request meets it (one per engine is the best an engine can do).
    Bisection: the ITL grows with the batch."""
    context = max(isl_tokens + osl_tokens / 2, 1.0)
    need = max(isl_tokens + osl_tokens, 1.0)
    kv_cap = int(max_kv_tokens // need)

    def meets(n: int) -> bool:
        return model.decode_itl_ms(n, context) * scale <= itl_target_ms

    return largest_meeting(meets, kv_cap)


def largest_meeting(meets: Callable[[int], bool], cap: int) -> int:
    """The largest n in [1, cap] with meets(n), for a test that holds up to some n and fails
    beyond (bisection); 1 when even 1 fails or cap < 1 (one per engine is the least there is)."""
    if cap < 1 or not meets(1):
        return 1
    lo, hi = 1, cap  # lo passes; find the largest passing n in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if meets(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def decode_concurrency(*, request_rate_s: float, osl_tokens: float, itl_target_ms: float) -> float:
    """Requests in flight at the ITL target, on average (Little's law)."""
    return request_rate_s * max(osl_tokens - 1, 0.0) * itl_target_ms / 1000.0


def peak_concurrency(mean: float, *, dispersion: float, quantile: float) -> float:
    """The `quantile` of the requests in flight: in an M^X/G/∞ system the count has the mean
    `mean` and the variance `mean × dispersion` (the index of dispersion of the arrivals); the
    normal quantile of that."""
    if mean <= 0:
        return 0.0
    z = NormalDist().inv_cdf(quantile)
    return mean + z * math.sqrt(mean * max(dispersion, 1.0))
