"""How many engines a role needs for its latency target, from the learned iteration costs
(app/core/sla/latency.py) and the load.

The formulas of SLA scaling (`app/core/sla/step.py`), kept apart so that each can be checked
on its own:

- **Prefill**: each prompt length L of the mix costs its engine time (`PrefillCost.busy_s`: its
  chunks alone, or sharing the fixed cost of full chunks when the engines are seen to pack
  prompts), and its TTFT is the time it waits plus its prefill alone (`alone_s`). The wait is
  Allen-Cunneen's M/G/c approximation: routing to the least-loaded engine sends an arrival to an
  idle engine when there is one, so only the share C that finds all `c` busy waits (Erlang C;
  arrivals in bursts of D take D engines at once, so at c ÷ D servers, at least one); its scale
  is the Pollaczek-Khinchine wait of the engines pooled into one M/G/1 server `c` times as fast,
  with the second moment of the engine times (a long-prompt mix needs more engines than its
  mean suggests) multiplied by the arrivals' index of dispersion (bursts wait like fewer,
  larger requests: M^X/G/1), times C ÷ ρ; the tail is the usual exponential approximation
  `P(W > x) ≈ C·exp(−x·C / E[W])`. The fewest engines at
  which at most `1 − quantile` of the servable requests wait longer than the target less their
  own prefill, at no more than `max_utilisation`. Prompts no count can serve (prefill alone above
  the target) are counted apart.
- **Decode**: Little's law at a full engine's ITL. A request of `osl` tokens decodes for
  `(osl − 1) × ITL`; the arrival rate λ keeps `λ × (osl − 1) × ITL` requests in flight on
  average, and a quantile of that count is sized for (`peak_concurrency`: an M^X/G/∞ count,
  variance = mean × dispersion). One engine holds the largest batch whose learned iteration
  time (at the batch's context) meets the target, whose KV fits and which the engine schedules
  at once (`max_num_seqs`); the ITL is the target where the target bounds that batch, and the
  batch's own iteration time where the KV cache or `max_num_seqs` does (`decode_batch_cap`;
  app/core/sla/decode_wish.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np
from scipy import special

from app.core.perf.interpolation import PerfModel
from app.core.sla.latency import DecodeCost, PrefillCost

# (upper bound in tokens, requests) of one ISL histogram bucket; the last bound may be inf.
Bucket = tuple[float, float]


# Where a histogram bucket's requests are taken to lie: evenly across it.
_BUCKET_SPREAD = tuple((k + 0.5) / 8 for k in range(8))


@dataclass(frozen=True)
class LengthMix:
    """Prompt lengths as the prefill formula needs them: the mean, the sizing quantile and the
    distribution as weighted points (two per histogram bucket, at its quarter and three quarters,
    rescaled so that their mean is the exact one)."""

    mean: float
    second_moment: float  # E[isl²]
    quantile: float  # the prompt length at the sizing quantile
    points: tuple[tuple[float, float], ...] = ()  # (length, weight)
    # The share of each prompt's tokens prefill computes; the rest, its start, is a cache hit.
    computed_share: float = 1.0

    @classmethod
    def uniform(cls, isl: float) -> LengthMix:
        return cls(isl, isl * isl, isl, ((isl, 1.0),) if isl > 0 else ())

    @classmethod
    def exponential(cls, isl: float, q: float, shares: int = 32) -> LengthMix:
        """A known mean and an unknown spread: exponential lengths (coefficient of variation 1),
        as one point at the middle of each of `shares` equal shares, rescaled to the exact mean.
        Prompt lengths are rarely all alike (the Azure conversation trace's vary by 0.96 of their
        mean, its 99th percentile 3.6x the mean); read as all of the mean length, the sizing
        quantile's prompt is the mean and the TTFT of the long ones goes unplanned for."""
        if isl <= 0:
            return cls.uniform(max(isl, 0.0))
        raw = [-math.log(1 - (k + 0.5) / shares) for k in range(shares)]
        k = shares / sum(raw)
        points = tuple((isl * x * k, 1.0 / shares) for x in raw)
        second = sum(length * length * w for length, w in points)
        return cls(isl, second, -isl * math.log(1 - q), points)

    @classmethod
    def from_histogram(cls, buckets: list[Bucket], mean: float, q: float) -> LengthMix:
        """Points from histogram buckets (the open last bucket is taken to end at twice its lower
        bound: no better is known) and the `q` quantile (interpolated inside its bucket, as
        PromQL's histogram_quantile). An empty histogram knows the mean only: `exponential`."""
        total = sum(count for _, count in buckets)
        if total <= 0 or mean <= 0:
            return cls.exponential(mean, q)
        raw: list[tuple[float, float]] = []
        lower = 0.0
        for upper, count in buckets:
            top = upper if math.isfinite(upper) else 2 * lower
            if count > 0:
                for f in _BUCKET_SPREAD:
                    raw.append((lower + (top - lower) * f, count / len(_BUCKET_SPREAD)))
            lower = upper if math.isfinite(upper) else lower
        raw_mean = sum(m * c for m, c in raw) / total
        k = mean / raw_mean if raw_mean > 0 else 1.0
        points = tuple((m * k, c / total) for m, c in raw)
        second = sum(m * m * w for m, w in points)
        rank, seen, lower, quantile = q * total, 0.0, 0.0, mean
        for upper, count in buckets:
            top = upper if math.isfinite(upper) else 2 * lower
            if count > 0 and seen + count >= rank:
                quantile = lower + (top - lower) * (rank - seen) / count
                break
            seen += count
            lower = upper if math.isfinite(upper) else lower
        return cls(mean, max(second, mean * mean), max(quantile, mean), points)

    def computed(self, share: float) -> LengthMix:
        """These prompts with `share` of each computed, the start of each read from a prefix
        cache (computed.py): the lengths stay, what each costs an engine falls."""
        return self if share == self.computed_share else replace(self, computed_share=share)


@dataclass(frozen=True)
class PrefillSizing:
    engines: int
    utilisation: float  # per engine, at that count
    wait_s: float  # the quantile wait at that count
    service_s: float  # prefill alone of a quantile-length servable prompt
    capacity_tokens_s: float  # per engine, saturated, at this mix
    meets_target: bool  # False: no count up to max_engines meets it (the count: the fewest near the best)
    miss_share: float  # of the servable requests, the share expected to miss the target at that count
    unservable_share: float  # requests whose prefill alone exceeds the target: no count serves them
    longest_servable_tokens: int


def prefill_engines(
    cost: PrefillCost,
    *,
    token_rate_s: float,
    mix: LengthMix,
    ttft_target_ms: float,
    quantile: float = 0.99,
    max_utilisation: float = 0.9,
    max_engines: int = 1024,
    dispersion: float = 1.0,
    correction: float = 1.0,
) -> PrefillSizing:
    """The fewest engines at which at most `1 − quantile` of the servable requests miss the TTFT
    target. A request of length L misses when its wait exceeds the target less its own prefill,
    so the share missing is Σ_L P(L)·P(W > target − alone(L)): a long prompt has little room to
    wait, a short one much. Prompts whose prefill alone exceeds the target are unservable: counted,
    and left out (no count serves them, so they must not drive the count up). `correction`
    (≤ 1 when the engines were busier than the model said) divides every engine time."""
    target_s = ttft_target_ms / 1000.0
    # The correction divides every engine time, so the longest servable prompt is the longest
    # whose uncorrected prefill fits the target times the correction.
    longest = cost.longest_within_s(target_s * correction, computed_share=mix.computed_share)
    lengths, weights, alone, busy = mix_times(cost, mix, correction)
    servable = lengths <= longest
    unservable = float(weights[~servable].sum())
    mean_len = float(weights @ lengths)
    mean_s = float(weights @ busy)
    capacity = mean_len / mean_s if mean_s > 0 else 0.0
    q_len = mix.quantile if mix.quantile <= longest else float(lengths[servable].max(initial=0.0))
    service_s = cost.alone_s(q_len, mix.computed_share) / correction if q_len > 0 else 0.0
    if token_rate_s <= 0 or mean_len <= 0:
        return PrefillSizing(0, 0.0, 0.0, service_s, capacity, True, 0.0, unservable, longest)
    request_rate = token_rate_s / mean_len
    start = max(1, math.ceil(request_rate * mean_s / max_utilisation))
    if not servable.any():
        # Every prompt misses whatever the count: the engines still have to compute them.
        rho = request_rate * mean_s / start
        return PrefillSizing(start, rho, math.inf, service_s, capacity, False, 1.0, unservable, longest)
    sw = weights[servable] / weights[servable].sum()
    budgets = target_s - alone[servable]
    second_s2 = float(weights @ busy**2) * max(dispersion, 1.0)
    allowed = 1.0 - quantile
    tried: list[tuple[int, float, float, float, float]] = []  # (count, rho, waits, mean wait, miss)
    for c in range(start, max_engines + 1):
        # Allen-Cunneen: the c engines pooled into one server c times as fast (E[S]/c, E[S²]/c²;
        # bursts, dispersion above 1, wait like larger requests: M^X/G/1) give the wait's scale,
        # and only the share `waits` that finds no idle engine waits at all.
        rho = request_rate * mean_s / c
        waits = _waits(c, rho, dispersion)
        mean_wait = _mean_wait_s(request_rate, rho, second_s2 / c**2) * waits / rho
        miss = float(sw @ _tail(waits, mean_wait, budgets))
        if miss <= allowed:
            wait_s = _wait_quantile_s(waits, mean_wait, quantile)
            return PrefillSizing(c, rho, wait_s, service_s, capacity, True, miss, unservable, longest)
        tried.append((c, rho, waits, mean_wait, miss))
    if not tried:  # the utilisation bound is above max_engines
        rho = request_rate * mean_s / max_engines
        return PrefillSizing(max_engines, rho, math.inf, service_s, capacity, False, 1.0, unservable, longest)
    # Nothing meets it: the fewest engines within one allowance of the best any count does.
    # Where the load is the limit that is near max_engines; where the prompts near the longest
    # servable are (their budget to wait is all but nothing), more engines barely help, and it is
    # near the utilisation bound instead of max_engines.
    best = tried[-1][4]
    c, rho, waits, mean_wait, miss = next(t for t in tried if t[4] <= best + allowed)
    wait_s = _wait_quantile_s(waits, mean_wait, quantile) if math.isfinite(mean_wait) else math.inf
    return PrefillSizing(c, rho, wait_s, service_s, capacity, False, miss, unservable, longest)


# The last mix's engine times: a tick sizes the same mix on the same learned cost several times (at
# the level, the forecast, the backlog), and the prompts' chunk-by-chunk times are most of a call.
# The cost object is held with its result, so its id is not reused while the entry stands.
_MIX_TIMES: list[tuple[PrefillCost, LengthMix, float, tuple[np.ndarray, ...]]] = []


def mix_times(cost: PrefillCost, mix: LengthMix, correction: float) -> tuple[np.ndarray, ...]:
    """(lengths, weights summing to 1, alone s, busy s) of the mix's points, the times ÷ correction."""
    for held_cost, held_mix, held_correction, result in _MIX_TIMES:
        if held_cost is cost and held_mix == mix and held_correction == correction:
            return result
    points = mix.points or ((mix.mean, 1.0),)
    lengths = np.array([length for length, _ in points])
    weights = np.array([w for _, w in points])
    weights = weights / weights.sum()
    alone = np.array([cost.alone_s(length, mix.computed_share) for length in lengths]) / correction
    busy = np.array([cost.busy_s(length, mix.computed_share) for length in lengths]) / correction
    result = (lengths, weights, alone, busy)
    _MIX_TIMES[:] = [(cost, mix, correction, result)]
    return result


def erlang_c(servers: float, offered: float) -> float:
    """The probability that an arrival finds all `servers` busy (Erlang C) at `offered` load
    (arrival rate × mean service time, in servers); 1 at or beyond saturation. Erlang B by its
    incomplete-gamma form, which holds for a count that is not whole (see `_waits`)."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    log_b = (
        servers * math.log(offered)
        - offered
        - float(special.gammaln(servers + 1))
        - math.log(float(special.gammaincc(servers + 1, offered)))
    )
    blocked = math.exp(log_b)
    return servers * blocked / (servers - offered * (1 - blocked))


def _waits(engines: int, rho: float, dispersion: float) -> float:
    """The share of arrivals that wait at all. Least-loaded routing sends an arrival to an idle
    engine when there is one, so with Poisson arrivals only those finding every engine busy
    wait (Erlang C: at 15 engines 50% busy, 1 in 89, where one pooled server says 1 in 2; a
    prompt that can barely wait is servable at a sane count). Arrivals in bursts come
    `dispersion` at a time and take that many engines at once: the c engines wait like c ÷ D
    servers of one burst each, down to one server (ρ: every arrival that finds work waits).
    On Azure's conversations x30 (dispersion 25-31) that is the single server it always was."""
    servers = max(engines / max(dispersion, 1.0), 1.0)
    return erlang_c(servers, rho * servers)


def _mean_wait_s(rate: float, rho: float, second_s2: float) -> float:
    if rho >= 1:
        return math.inf
    return rate * second_s2 / (2 * (1 - rho))  # Pollaczek-Khinchine


def _tail(waits: float, mean_wait: float, budgets_s: np.ndarray) -> np.ndarray:
    """P(W > x) ≈ C·exp(−x·C / E[W]) for each budget x, C the share that waits at all (1 where
    x < 0: it waits no matter what)."""
    if waits >= 1 or not math.isfinite(mean_wait):
        return np.ones_like(budgets_s)
    if mean_wait <= 0:
        return np.where(budgets_s < 0, 1.0, 0.0)
    return np.where(budgets_s < 0, 1.0, waits * np.exp(-np.maximum(budgets_s, 0.0) * waits / mean_wait))


def _wait_quantile_s(waits: float, mean_wait: float, quantile: float) -> float:
    tail = 1 - quantile
    if waits <= tail or mean_wait <= 0:
        return 0.0  # fewer than 1 - quantile of the requests wait at all
    return mean_wait / waits * math.log(waits / tail)


def decode_batch_limit(
    cost: DecodeCost,
    *,
    isl_tokens: float,
    osl_tokens: float,
    itl_target_ms: float,
    max_kv_tokens: int,
    max_num_seqs: int | None = None,
    held_context_tokens: float | None = None,
    profile_itl_ms: Callable[[float, float], float] | None = None,
) -> int:
    """The most requests one decode engine holds at the ITL target: the largest batch whose
    iteration at context `isl + osl/2` meets the target (the learned cost, cautious beyond the
    batches seen), whose KV need `n × (isl + osl)` fits and which the engine schedules at once
    (`max_num_seqs`); 1 when not even one request meets it (one per engine is the best an engine
    can do). Bisection: the learned iteration time grows with the batch.

    `held_context_tokens`, the mean context of the requests the engines hold now (FPM), raises
    both when it is larger: long outputs stay in flight longer, so the requests in decode are
    longer than the arrivals' mean (a heavy-tailed output mix holds twice its mean context).

    `profile_itl_ms(batch, context)`, the profile's own ITL, is a floor beyond the batches the
    engines were seen running: there a straight line through a few ticks of small batches has
    little to say (in the profile's own world, records of up to 85 requests at a 1k context
    put the 30 ms limit near 370 requests, where the profile, and the world, have it at 233),
    and a batch never seen is not taken as cheaper than the profile says. Within the data, the
    learned cost alone decides: a world cheaper than its profile is learned where it is run."""
    context, need = decode_context(isl_tokens, osl_tokens, held_context_tokens)
    cap = decode_batch_cap(need, max_kv_tokens=max_kv_tokens, max_num_seqs=max_num_seqs)
    return largest_meeting(
        lambda n: decode_iteration_ms(cost, n, context, profile_itl_ms) <= itl_target_ms, cap
    )


def decode_context(
    isl_tokens: float, osl_tokens: float, held_context_tokens: float | None = None
) -> tuple[float, float]:
    """(mean context, KV tokens per request) a decode batch is sized at: `isl + osl/2` and
    `isl + osl`, both raised in proportion when the requests held now are longer."""
    context = max(isl_tokens + osl_tokens / 2, 1.0)
    need = max(isl_tokens + osl_tokens, 1.0)
    if held_context_tokens is not None and held_context_tokens > context:
        need *= held_context_tokens / context
        context = held_context_tokens
    return context, need


def decode_batch_cap(kv_need_tokens: float, *, max_kv_tokens: int, max_num_seqs: int | None = None) -> int:
    """The most requests an engine can hold whatever their pace: its KV cache over a request's
    need, and `max_num_seqs`."""
    cap = int(max_kv_tokens // kv_need_tokens)
    return cap if max_num_seqs is None else min(cap, max_num_seqs)


def decode_iteration_ms(
    cost: DecodeCost, n: float, context: float, profile_itl_ms: Callable[[float, float], float] | None
) -> float:
    """One iteration of `n` requests at `context` tokens each: the learned cost, and at least the
    profile's (`profile_itl_ms`) beyond the batches the engines were seen running."""
    ms = cost.iteration_ms(n, n * context)
    if profile_itl_ms is not None and cost.beyond_data(n, n * context):
        ms = max(ms, profile_itl_ms(n, context))
    return ms


def profile_decode_floor(model: PerfModel, scale: float = 1.0) -> Callable[[float, float], float]:
    """`decode_batch_limit`'s `profile_itl_ms`: the profile's decode ITL times the world's
    measured decode scale (`scale`: its iterations' times over the profile's, both ways), as the
    highest the profile reaches up to the batch and near the context. Scaled up as well as down:
    beyond the batches seen the learned cost is a line through small batches, and in a world
    20% slower than its profile a floor that only scaled down left the limit at the profile's
    (ITL broke at each burst's start: bursty-gaps 82%, heavy-tail-output 85% at truth 1.2).

    Its surface dips past its plateau (a floor that fell again would let the limit's bisection
    land beyond a batch it refused), and it is not monotone in the context either: the engines'
    own contexts spread around the mean (at 250 requests, 29.0 ms at 2,000 tokens and 32.4 ms at
    1,500 on the bundled H200 profile)."""

    def floor_ms(n: float, context: float) -> float:
        return scale * max(
            model.decode_itl_ms(float(b), context * k)
            for b in np.linspace(1.0, max(n, 1.0), _FLOOR_BATCHES)
            for k in _FLOOR_CONTEXTS
        )

    return floor_ms


_FLOOR_BATCHES = 16
# The profile is read at the context and a quarter below it, where its surface rises again
# (at 250 requests, 32.4 ms at 1,500 tokens against 29.0 ms at 2,000), not above: the context
# already is the longer of the arrivals' and the held requests' (FPM), and a quarter above cut
# the batch limit of long contexts by a fifth (10k tokens at 30 ms: 60 where the profile's own
# world meets the target at 76).
_FLOOR_CONTEXTS = (0.75, 1.0)


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
