"""The formulas of SLA scaling (`app/core/sla/capacity.py`) against hand computations.

Two kinds of iteration cost feed them:

- a **known world**: a cost learned from records that lie exactly on a chosen line
  (`a + b·T + c·T·(P + T/2)/n` for prefill, `a + b·n + c·K` for decode) and that cover every
  iteration a test asks about, so the learned cost is that line; every expected value is then
  written out from the line's coefficients;
- the **cold start** on the bundled H200 profile: `prior_models` reads the profile's measured
  points as straight lines (checked here against an ordinary least-squares fit by numpy), and
  with no forward pass seen yet a prefill prediction is that line.
  Queueing values on it are recomputed from the formulas with `alone_s`/`busy_s` as inputs.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
from scipy import integrate

from app.core.perf.interpolation import PerfModel
from app.core.sla.capacity import (
    Bucket,
    LengthMix,
    PrefillSizing,
    decode_batch_limit,
    decode_concurrency,
    erlang_c,
    peak_concurrency,
    prefill_engines,
)
from app.core.sla.latency import (
    DecodeCost,
    LatencyModels,
    LinearCost,
    PrefillCost,
    decode_features,
    prefill_features,
    prior_models,
)
from app.sources.profile_files import load_profile

H200 = Path(__file__).resolve().parents[2] / "data" / "profiles" / "h200-llama3.1-8b-fp8"
CHUNK = 8192  # the default prefill max_num_batched_tokens (app/workers/resources.py)
# SlaTuning's defaults: the profile is worth 10 forward passes, read 2 standard errors high
# beyond the data, fading with a 900 s half-life.
PRIOR = {"prior_records": 10.0, "half_life_s": 900.0}

# The known prefill world: 15 ms per iteration, 0.015 ms per token, 1e-6 ms per token pair.
PA, PB, PC = 15.0, 0.015, 1e-6
# The known decode world: 5 ms per iteration, 0.05 ms per request, 2e-5 ms per token of context.
DA, DB, DC = 5.0, 0.05, 2e-5


@pytest.fixture(scope="module")
def h200() -> PerfModel:
    return PerfModel.from_profile(load_profile(H200))


@pytest.fixture(scope="module")
def prior(h200: PerfModel) -> LatencyModels:
    return prior_models(h200, chunk_tokens=CHUNK, **PRIOR)


def prefill_ms(tokens: float, prefix: float = 0.0, prompts: float = 1.0) -> float:
    return PA + PB * tokens + PC * tokens * (prefix + tokens / 2) / prompts


def decode_ms(requests: float, kv_tokens: float, slower: float = 1.0) -> float:
    return slower * (DA + DB * requests + DC * kv_tokens)


def _exact(x: np.ndarray, y: np.ndarray) -> LinearCost:
    """A cost learned from records lying exactly on a line: the line, and the records' range."""
    return LinearCost.from_prior(x, y, **PRIOR).observed(x, y, now_s=0.0)


def known_prefill(*, packs: bool = False) -> PrefillCost:
    rows = [
        (t, p, n)
        for t in (64, 512, 1000, 2048, 4096, CHUNK)
        for p in (0, CHUNK, 4 * CHUNK, 8 * CHUNK)
        for n in (1, 2, 8)
    ]
    x = np.array([prefill_features(t, p, n) for t, p, n in rows])
    y = np.array([prefill_ms(t, p, n) for t, p, n in rows])
    return PrefillCost(_exact(x, y), CHUNK, packed_evidence=1.0 if packs else 0.0)


def known_decode(slower: float = 1.0) -> DecodeCost:
    rows = [(n, n * ctx) for n in (1, 8, 64, 256, 512) for ctx in (500, 2000, 8000)]
    x = np.array([decode_features(n, k) for n, k in rows])
    y = np.array([decode_ms(n, k, slower) for n, k in rows])
    return DecodeCost(_exact(x, y))


def _hand_waits(engines: int, rho: float, dispersion: float = 1.0) -> float:
    """Erlang C at c ÷ D servers (at least one) and the same utilisation: by the textbook sum
    when the count is whole, else from Erlang B's integral 1/B = a ∫ e^(−a·t) (1 + t)^s dt."""
    servers = max(engines / max(dispersion, 1.0), 1.0)
    offered = rho * servers
    if servers == int(servers):
        n = int(servers)
        last = offered**n / math.factorial(n) * n / (n - offered)
        return last / (sum(offered**k / math.factorial(k) for k in range(n)) + last)
    inverse, _ = integrate.quad(lambda t: offered * math.exp(-offered * t) * (1 + t) ** servers, 0, math.inf)
    blocked = 1 / inverse
    return servers * blocked / (servers - offered * (1 - blocked))


def _hand_sizing(
    cost: PrefillCost,
    *,
    token_rate_s: float,
    mix: LengthMix,
    engines: int,
    target_ms: float,
    quantile: float = 0.99,
    dispersion: float = 1.0,
    correction: float = 1.0,
) -> tuple[float, float, float]:
    """(utilisation, share of servable requests missing the target, quantile wait) of `engines`
    behind one queue, written out from the formulas: engine time per request
    `busy_s / correction`, the share that waits at all Erlang C's (the textbook sum), the mean
    wait Allen-Cunneen's, the M/G/1 Pollaczek-Khinchine wait of the engines pooled into one
    server `engines` times as fast (E[S]/c, E[S²]/c², E[S²] times the arrivals' index of
    dispersion when above 1) times C/ρ, the exponential tail P(W > x) = C·exp(−x·C/E[W]) at
    each length's budget (the target less its prefill alone)."""
    lengths = np.array([length for length, _ in mix.points])
    weights = np.array([w for _, w in mix.points])
    weights = weights / weights.sum()
    busy = np.array([cost.busy_s(length) for length in lengths]) / correction
    alone = np.array([cost.alone_s(length) for length in lengths]) / correction
    rate = token_rate_s / float(weights @ lengths)
    rho = rate * float(weights @ busy) / engines
    if rho >= 1:
        return rho, 1.0, math.inf
    waits = _hand_waits(engines, rho, dispersion)
    pooled = rate * float(weights @ busy**2) * max(dispersion, 1.0) / engines**2 / (2 * (1 - rho))
    mean_wait = pooled * waits / rho
    servable = alone * correction <= target_ms / 1000.0
    budgets = target_ms / 1000.0 - alone[servable]
    tails = np.where(budgets < 0, 1.0, waits * np.exp(-np.maximum(budgets, 0.0) * waits / mean_wait))
    miss = float(weights[servable] @ tails / weights[servable].sum())
    tail = 1 - quantile
    wait = 0.0 if waits <= tail else mean_wait / waits * math.log(waits / tail)
    return rho, miss, wait


# --- iteration costs: a prompt alone, on a busy engine, the longest within a budget ---------------


def test_known_world_costs_are_the_line() -> None:
    cost = known_prefill()
    for t, p, n in ((1000, 0, 1), (CHUNK, 2 * CHUNK, 1), (3000, CHUNK, 2)):
        assert cost.iteration_ms(t, p, n) == pytest.approx(prefill_ms(t, p, n), rel=1e-6)
    assert known_decode().iteration_ms(100, 100 * 2075) == pytest.approx(decode_ms(100, 100 * 2075), rel=1e-6)


def test_prefill_alone_is_its_chunks_one_after_the_other_each_reading_the_prefix() -> None:
    cost = known_prefill()
    # Two full chunks, then 3000 tokens: the second chunk reads the first's 8192 tokens of KV,
    # the rest reads both.
    hand_ms = prefill_ms(CHUNK, 0) + prefill_ms(CHUNK, CHUNK) + prefill_ms(3000, 2 * CHUNK)
    assert cost.alone_s(2 * CHUNK + 3000) == pytest.approx(hand_ms / 1000.0, rel=1e-6)
    # Exactly three chunks: no rest term (a zero-token rest is not one more pass).
    hand_ms = sum(prefill_ms(CHUNK, k * CHUNK) for k in range(3))
    assert cost.alone_s(3 * CHUNK) == pytest.approx(hand_ms / 1000.0, rel=1e-6)
    # Shorter than a chunk: one iteration.
    assert cost.alone_s(1500) == pytest.approx(prefill_ms(1500) / 1000.0, rel=1e-6)
    # The late chunks cost more than the first: three chunks are more than 3 × the first.
    assert cost.alone_s(3 * CHUNK) > 3 * prefill_ms(CHUNK) / 1000.0 + 0.1


def test_prefill_busy_is_alone_unless_the_engine_packs_prompts() -> None:
    alone, packing = known_prefill(), known_prefill(packs=True)
    assert (alone.packs, packing.packs) == (False, True)
    for isl in (1000.0, 2 * CHUNK + 3000.0):
        assert alone.busy_s(isl) == alone.alone_s(isl)
    # Packed, a 1000-token prompt shares its iteration with 7.192 others: read per prompt it
    # pays the fixed 15 ms only for its own share of the chunk, 1000/8192 of it (17.3 ms); but
    # no less than its tokens' share of one full single-prompt chunk (171.4 ms × 1000/8192,
    # 20.9 ms): a packed chunk may cost what one sequence of its tokens does.
    per_prompt_s = packing.alone_s(1000) - PA * (1 - 1000 / CHUNK) / 1000
    full_chunk_share_s = packing.iteration_ms(CHUNK) / 1000 * 1000 / CHUNK
    assert per_prompt_s == pytest.approx(0.01733, abs=1e-5)
    assert full_chunk_share_s == pytest.approx(0.02093, abs=1e-5)
    assert packing.busy_s(1000) == pytest.approx(full_chunk_share_s, rel=1e-12)
    # A prompt longer than two chunks reads its own prefix: per prompt it costs more than its
    # share of full single-prompt chunks, and that reading stands.
    assert packing.busy_s(2 * CHUNK + 3000) == pytest.approx(
        packing.alone_s(2 * CHUNK + 3000) - PA * (3 - (2 * CHUNK + 3000) / CHUNK) / 1000, rel=1e-6
    )
    # Whole chunks have nothing to share.
    assert packing.busy_s(3 * CHUNK) == packing.alone_s(3 * CHUNK)


def test_longest_prompt_within_a_budget() -> None:
    cost = known_prefill()
    for budget_s in (0.05, 0.3, 1.0):
        longest = cost.longest_within_s(budget_s)
        # Bisection to within max(16, 0.5%) tokens: the longest fits, a step longer does not.
        assert cost.alone_s(longest) <= budget_s < cost.alone_s(longest + max(16, longest // 200))
    # 0.05 s: one iteration of T tokens with 15 + 0.015·T + 5e-7·T² <= 50 ms: T <= 2176.
    assert 2176 - 16 <= cost.longest_within_s(0.05) <= 2176
    # Not even one token fits in less than the fixed cost.
    assert cost.longest_within_s(0.010) == 0


# --- the cold start: the profile read as straight lines -------------------------------------------


def test_the_prior_is_a_straight_line_through_the_profiles_points(
    h200: PerfModel, prior: LatencyModels
) -> None:
    # Prefill: the profile's TTFT of one prompt of T tokens, T = 100 ... 16372, against
    # (1, T, T²/2) by ordinary least squares.
    pre = h200.prefill.data
    t = np.asarray(pre.isl_tokens, dtype=float)
    line, *_ = np.linalg.lstsq(np.column_stack([np.ones_like(t), t, t * t / 2]), pre.ttft_ms, rcond=None)
    for tokens in (100.0, 2000.0, 8192.0, 16000.0):
        got = prior.prefill.model.mean_ms(prefill_features(tokens, 0.0))
        assert got == pytest.approx(line @ [1.0, tokens, tokens * tokens / 2], rel=1e-6)
    # Decode: each point's KV tokens (usage × capacity) and requests (KV ÷ context, at least 1)
    # against (1, n, K).
    dec = h200.decode.data
    kv = np.asarray(dec.kv_usage, dtype=float) * dec.max_kv_tokens
    n = np.maximum(kv / np.asarray(dec.context_tokens, dtype=float), 1.0)
    line, *_ = np.linalg.lstsq(np.column_stack([np.ones_like(n), n, kv]), dec.itl_ms, rcond=None)
    for requests, context in ((1, 350), (100, 2075), (300, 5000)):
        got = prior.decode.model.mean_ms(decode_features(requests, requests * context))
        assert got == pytest.approx(line @ [1.0, requests, requests * context], rel=1e-6)
    # No forward pass seen: prefill reads the line; decode never less (beyond the passes seen,
    # the profile's own ITL up to that batch is its floor).
    line_ms = prior.prefill.model.mean_ms(prefill_features(2000, 0))
    assert prior.prefill.iteration_ms(2000) == pytest.approx(line_ms, rel=1e-12)
    assert prior.decode.iteration_ms(100, 207500) >= prior.decode.model.mean_ms(decode_features(100, 207500))
    assert prior.prefill.packs is False  # not seen packing: the cautious reading


def test_prefill_capacity_of_the_default_chunk(prior: LatencyModels) -> None:
    # Pinned so that a change of the profile or its prior shows up here: the profile reads 8192
    # tokens in 169.99 ms, the prior's line through its points 169.14 ms, 48,434.1 tokens/s.
    sizing = prefill_engines(
        prior.prefill, token_rate_s=1000.0, mix=LengthMix.uniform(CHUNK), ttft_target_ms=1000.0
    )
    assert prior.prefill.alone_s(CHUNK) == pytest.approx(0.169137, rel=1e-5)
    assert sizing.capacity_tokens_s == pytest.approx(CHUNK / prior.prefill.alone_s(CHUNK), rel=1e-12)
    assert sizing.capacity_tokens_s == pytest.approx(48434.14, rel=1e-6)


def flat(points: object) -> list[float]:
    return [float(v) for point in points for v in point]  # type: ignore[attr-defined]


# --- LengthMix ------------------------------------------------------------------------------------


def test_uniform_mix_second_moment_is_the_mean_squared() -> None:
    mix = LengthMix.uniform(2000.0)
    assert (mix.mean, mix.second_moment, mix.quantile, mix.points) == (
        2000.0,
        4_000_000.0,
        2000.0,
        ((2000.0, 1.0),),
    )
    assert LengthMix.uniform(0.0).points == ()


def _spread(lower: float, upper: float, count: float) -> list[tuple[float, float]]:
    """A bucket's requests as eight points evenly across it, at 1/16, 3/16, ... 15/16."""
    return [(lower + (upper - lower) * (2 * k + 1) / 16, count / 8) for k in range(8)]


def test_single_bucket_histogram_is_eight_points_rescaled_to_the_mean() -> None:
    # One bucket (0, 4096]: points at 256, 768, ..., 3840, whose mean 2048 is rescaled to the
    # exact 2000: 250, 750, ..., 3750, an eighth of the requests each.
    mix = LengthMix.from_histogram([(4096.0, 50.0)], 2000.0, 0.5)
    assert mix.mean == 2000.0
    hand = [(250.0 + 500.0 * k, 0.125) for k in range(8)]
    assert flat(mix.points) == pytest.approx(flat(hand), rel=1e-12)
    assert mix.second_moment == pytest.approx(sum(m * m for m, _ in hand) / 8, rel=1e-12)
    # The median of (0, 4096] interpolated: 2048; above the mean, so kept.
    assert mix.quantile == pytest.approx(2048.0, rel=1e-12)


def test_histogram_mean_is_exact_and_points_rescale_to_it() -> None:
    buckets: list[Bucket] = [(1000.0, 6.0), (2000.0, 3.0), (4000.0, 1.0)]
    mean = 1400.0
    mix = LengthMix.from_histogram(buckets, mean, 0.95)
    assert mix.mean == mean  # the frontend's exact mean, not the buckets' estimate
    # By hand: each bucket's points average its middle (500 × 6, 1500 × 3, 3000 × 1); their
    # mean 10500/10 = 1050; every point scaled by 1400/1050 so the mean is the exact one.
    k = mean / 1050.0
    raw = _spread(0.0, 1000.0, 0.6) + _spread(1000.0, 2000.0, 0.3) + _spread(2000.0, 4000.0, 0.1)
    hand = [(m * k, w) for m, w in raw]
    assert flat(mix.points) == pytest.approx(flat(hand), rel=1e-12)
    assert sum(m * w for m, w in mix.points) == pytest.approx(mean, rel=1e-12)
    assert mix.second_moment == pytest.approx(sum(m * m * w for m, w in hand), rel=1e-12)
    # The 0.95 quantile: rank 9.5 of 10; 9 lie at or below 2000, so it is half-way through the
    # one request of (2000, 4000]: 2000 + 2000 × 0.5 / 1 = 3000.
    assert mix.quantile == pytest.approx(3000.0, rel=1e-12)


def test_histogram_quantile_inside_a_middle_bucket() -> None:
    buckets: list[Bucket] = [(1000.0, 2.0), (3000.0, 6.0), (8000.0, 2.0)]
    mix = LengthMix.from_histogram(buckets, 2500.0, 0.5)
    # rank 5: 2 below 1000, then 3 of the 6 in (1000, 3000]: 1000 + 2000 × 3/6 = 2000, which is
    # below the mean: the quantile prompt is never taken shorter than the mean one.
    assert mix.quantile == 2500.0
    mix = LengthMix.from_histogram(buckets, 2500.0, 0.75)
    # rank 7.5: 1000 + 2000 × 5.5/6.
    assert mix.quantile == pytest.approx(1000.0 + 2000.0 * 5.5 / 6.0, rel=1e-12)


def test_histogram_open_last_bucket_ends_at_twice_its_lower_bound() -> None:
    buckets: list[Bucket] = [(1000.0, 8.0), (math.inf, 2.0)]
    mix = LengthMix.from_histogram(buckets, 1200.0, 0.95)
    # rank 9.5: 1.5 of the 2 in (1000, 2000]: 1000 + 1000 × 1.5/2 = 1750.
    assert mix.quantile == pytest.approx(1750.0, rel=1e-12)
    # Eight points across (0, 1000] (8 requests) and across (1000, 2000] (2): raw mean
    # (500 × 8 + 1500 × 2) / 10 = 700, scaled by 1200/700.
    k = 1200.0 / 700.0
    hand = [(m * k, w) for m, w in _spread(0.0, 1000.0, 0.8) + _spread(1000.0, 2000.0, 0.2)]
    assert flat(mix.points) == pytest.approx(flat(hand), rel=1e-12)
    assert mix.second_moment == pytest.approx(sum(m * m * w for m, w in hand), rel=1e-12)


def test_an_empty_histogram_knows_the_mean_only_and_spreads_it_exponentially() -> None:
    mix = LengthMix.from_histogram([(1000.0, 0.0)], 700.0, 0.99)
    assert mix == LengthMix.from_histogram([], 700.0, 0.99) == LengthMix.exponential(700.0, 0.99)
    lengths = [length for length, _ in mix.points]
    assert len(lengths) == 32 and all(w == 1 / 32 for _, w in mix.points)
    assert sum(length * w for length, w in mix.points) == pytest.approx(700.0, rel=1e-12)
    # The 99th percentile of an exponential of mean 700: 700 × ln(100) = 3,224 tokens.
    assert mix.quantile == pytest.approx(700.0 * math.log(100.0), rel=1e-12) == pytest.approx(3223.6, abs=0.1)
    # Its second moment is 2 × mean² (coefficient of variation 1); 32 points at the middles of
    # equal shares fall a little short of the far tail: 1.92 × mean².
    assert mix.second_moment / 700.0**2 == pytest.approx(1.92, abs=0.01)
    assert lengths == sorted(lengths) and lengths[0] < 0.02 * 700.0 and lengths[-1] > 4.2 * 700.0
    assert LengthMix.exponential(0.0, 0.99) == LengthMix.uniform(0.0)


# --- prefill_engines ------------------------------------------------------------------------------


def test_prefill_engines_is_the_smallest_count_meeting_the_target(prior: LatencyModels) -> None:
    # 70,000 prompt tokens/s of 2000-token prompts, TTFT 300 ms, on the cold-start prior (a
    # 2000-token prompt in 48.6 ms, 41,193 tokens/s per engine): the utilisation cap alone would
    # allow 2 engines (70000 / (41,193 × 0.9) = 1.89), the waits need more.
    cost, mix, rate, target = prior.prefill, LengthMix.uniform(2000.0), 70_000.0, 300.0
    assert cost.alone_s(2000.0) == pytest.approx(0.0485523, rel=1e-5)
    sizing = prefill_engines(cost, token_rate_s=rate, mix=mix, ttft_target_ms=target)
    capacity = 2000.0 / cost.busy_s(2000.0)
    assert capacity == pytest.approx(41192.7, rel=1e-5)
    assert sizing.capacity_tokens_s == pytest.approx(capacity, rel=1e-12)
    assert sizing.service_s == pytest.approx(cost.alone_s(2000.0), rel=1e-12)
    assert (sizing.meets_target, sizing.unservable_share) == (True, 0.0)
    assert math.ceil(rate / (capacity * 0.9)) == 2
    assert sizing.engines == 3

    rho, miss, wait = _hand_sizing(cost, token_rate_s=rate, mix=mix, engines=3, target_ms=target)
    assert sizing.utilisation == pytest.approx(rho, rel=1e-12)
    assert sizing.utilisation == pytest.approx(rate / (3 * capacity), rel=1e-12)
    assert sizing.miss_share == pytest.approx(miss, rel=1e-9)
    assert sizing.miss_share <= 0.01
    assert sizing.wait_s == pytest.approx(wait, rel=1e-12)
    # One prompt length: at most 1% missing is the 0.99 quantile wait within the budget.
    assert sizing.wait_s <= target / 1000.0 - sizing.service_s
    assert sizing.utilisation <= 0.9

    # One engine fewer: under the utilisation cap, but more than 1% of the requests would miss.
    rho_less, miss_less, wait_less = _hand_sizing(
        cost, token_rate_s=rate, mix=mix, engines=2, target_ms=target
    )
    assert rho_less <= 0.9
    assert miss_less > 0.01
    assert wait_less > target / 1000.0 - sizing.service_s
    # Not allowed the 3: no count up to 2 meets it; the answer is the utilisation bound (2),
    # flagged.
    fewer = prefill_engines(cost, token_rate_s=rate, mix=mix, ttft_target_ms=target, max_engines=2)
    assert (fewer.engines, fewer.meets_target) == (2, False)
    assert fewer.miss_share == pytest.approx(miss_less, rel=1e-9)


def test_prefill_engines_out_of_reach_is_the_fewest_near_the_best_count(prior: LatencyModels) -> None:
    # 100,000 tokens/s of 29,000-token prompts, TTFT 1 s: one prompt alone takes 0.860 s, so a
    # request may wait at most 140 ms: mostly only an idle engine serves it in time, and 1%
    # missing takes 7 engines (42% busy), more than the 6 allowed. The answer is the fewest engines whose
    # miss share is within one allowance (1 − quantile) of the best any allowed count gives (6),
    # flagged.
    cost, mix, rate = prior.prefill, LengthMix.uniform(29_000.0), 100_000.0
    assert cost.alone_s(29_000.0) == pytest.approx(0.86039, rel=1e-4)
    sizing = prefill_engines(cost, token_rate_s=rate, mix=mix, ttft_target_ms=1000.0, max_engines=6)
    misses = {
        c: _hand_sizing(cost, token_rate_s=rate, mix=mix, engines=c, target_ms=1000.0)[1] for c in range(4, 7)
    }
    expected = min(c for c, m in misses.items() if m <= misses[6] + 0.01)
    assert (sizing.engines, sizing.meets_target) == (expected, False)
    assert sizing.unservable_share == 0.0
    enough = prefill_engines(cost, token_rate_s=rate, mix=mix, ttft_target_ms=1000.0)
    assert (enough.engines, enough.meets_target) == (7, True)
    _, miss, _ = _hand_sizing(cost, token_rate_s=rate, mix=mix, engines=7, target_ms=1000.0)
    assert enough.miss_share == pytest.approx(miss, rel=1e-9) and miss <= 0.01
    _, miss_less, _ = _hand_sizing(cost, token_rate_s=rate, mix=mix, engines=6, target_ms=1000.0)
    assert miss_less > 0.01


def test_erlang_c_is_the_textbook_sum_and_holds_between_whole_counts() -> None:
    # One server: an arrival waits exactly when it is busy (ρ). Fifteen half busy: 1 in 89.
    assert erlang_c(1, 0.5) == pytest.approx(0.5, rel=1e-12)
    assert erlang_c(15, 7.5) == pytest.approx(_hand_waits(15, 0.5), rel=1e-9)
    assert erlang_c(15, 7.5) == pytest.approx(0.011292, rel=1e-4)
    # Between whole counts, Erlang B's integral form (the hand formula) and monotone in the count.
    assert erlang_c(2.5, 1.25) == pytest.approx(_hand_waits(5, 0.5, dispersion=2.0), rel=1e-7)
    assert erlang_c(3, 1.5) < erlang_c(2.5, 1.25) < erlang_c(2, 1.0)
    assert (erlang_c(4, 0.0), erlang_c(4, 4.0), erlang_c(4, 5.0)) == (0.0, 1.0, 1.0)


def test_a_prompt_that_can_barely_wait_takes_an_idle_engine_unless_arrivals_burst(
    prior: LatencyModels,
) -> None:
    # 29,000-token prompts may wait 140 ms. With Poisson arrivals least-loaded routing finds an
    # idle engine for nearly all but those arriving while every engine is busy: 7 engines (42%
    # busy) leave 0.96% late. Arriving in bursts of D, the engines wait like c ÷ D servers: 12
    # engines at D = 3, 49 at D = 30 (down to one server, where every arrival finding work waits).
    cost, mix = prior.prefill, LengthMix.uniform(29_000.0)
    counts = {
        d: prefill_engines(cost, token_rate_s=100_000.0, mix=mix, ttft_target_ms=1000.0, dispersion=d)
        for d in (1.0, 3.0, 30.0)
    }
    assert {d: s.engines for d, s in counts.items()} == {1.0: 7, 3.0: 12, 30.0: 49}
    for d, sizing in counts.items():
        _, miss, _ = _hand_sizing(
            cost, token_rate_s=100_000.0, mix=mix, engines=sizing.engines, target_ms=1000.0, dispersion=d
        )
        assert sizing.miss_share == pytest.approx(miss, rel=1e-6) and miss <= 0.01
        _, miss_less, _ = _hand_sizing(
            cost, token_rate_s=100_000.0, mix=mix, engines=sizing.engines - 1, target_ms=1000.0, dispersion=d
        )
        assert miss_less > 0.01


def test_out_of_reach_reports_the_miss_share_of_the_count_it_returns(prior: LatencyModels) -> None:
    cost, mix, rate = prior.prefill, LengthMix.uniform(29_000.0), 100_000.0
    sizing = prefill_engines(cost, token_rate_s=rate, mix=mix, ttft_target_ms=1000.0, max_engines=6)
    _, miss, _ = _hand_sizing(cost, token_rate_s=rate, mix=mix, engines=sizing.engines, target_ms=1000.0)
    # The share reported is the returned count's; 4 engines (the utilisation bound) would leave
    # 35% missing, 6 leave 3.5%.
    assert sizing.miss_share == pytest.approx(miss, rel=1e-9)
    _, miss_at_four, _ = _hand_sizing(cost, token_rate_s=rate, mix=mix, engines=4, target_ms=1000.0)
    assert miss_at_four == pytest.approx(0.3544, rel=1e-3)
    _, miss_at_max, _ = _hand_sizing(cost, token_rate_s=rate, mix=mix, engines=6, target_ms=1000.0)
    assert miss_at_max == pytest.approx(0.0355, rel=1e-2)
    # 5 engines leave 12%, more than one allowance above the best: the answer is 6 itself.
    assert sizing.engines == 6
    assert sizing.miss_share == pytest.approx(miss_at_max, rel=1e-9)


def test_prefill_engines_never_plans_past_the_utilisation_cap(prior: LatencyModels) -> None:
    # A loose TTFT (10 s) puts no pressure on the wait: the cap decides, ceil(rate / (cap × 0.9)).
    rate, mix = 200_000.0, LengthMix.uniform(2000.0)
    sizing = prefill_engines(
        prior.prefill, token_rate_s=rate, mix=mix, ttft_target_ms=10_000.0, max_utilisation=0.9
    )
    capacity = 2000.0 / prior.prefill.busy_s(2000.0)
    # 200,000 / (41,193 × 0.9) = 5.39: 6.
    assert sizing.engines == math.ceil(rate / (capacity * 0.9)) == 6
    assert sizing.utilisation == pytest.approx(rate / (6 * capacity), rel=1e-12)
    assert sizing.utilisation <= 0.9
    assert rate / (5 * capacity) > 0.9  # one fewer would run above the cap
    # A lower cap asks for more engines for the same traffic: 200,000 / (41,193 × 0.5) = 9.71.
    lower = prefill_engines(
        prior.prefill, token_rate_s=rate, mix=mix, ttft_target_ms=10_000.0, max_utilisation=0.5
    )
    assert lower.engines == math.ceil(rate / (capacity * 0.5)) == 10


def test_prefill_engines_for_a_slower_world_are_more(prior: LatencyModels) -> None:
    # The busy check's correction 1/1.5: every engine time 1.5× the model's.
    kwargs = {"token_rate_s": 60_000.0, "mix": LengthMix.uniform(2000.0), "ttft_target_ms": 300.0}
    base = prefill_engines(prior.prefill, **kwargs)  # type: ignore[arg-type]
    slow = prefill_engines(prior.prefill, correction=1 / 1.5, **kwargs)  # type: ignore[arg-type]
    assert slow.capacity_tokens_s == pytest.approx(base.capacity_tokens_s / 1.5, rel=1e-12)
    assert slow.service_s == pytest.approx(base.service_s * 1.5, rel=1e-12)
    rho, miss, _ = _hand_sizing(
        prior.prefill,
        token_rate_s=60_000.0,
        mix=LengthMix.uniform(2000.0),
        engines=slow.engines,
        target_ms=300.0,
        correction=1 / 1.5,
    )
    assert slow.utilisation == pytest.approx(rho, rel=1e-12)
    assert miss <= 0.01
    assert (base.engines, slow.engines) == (2, 3)


def test_prefill_engines_for_zero_traffic_is_zero(prior: LatencyModels) -> None:
    for rate, mix in ((0.0, LengthMix.uniform(2000.0)), (5000.0, LengthMix.uniform(0.0))):
        sizing = prefill_engines(prior.prefill, token_rate_s=rate, mix=mix, ttft_target_ms=300.0)
        assert (sizing.engines, sizing.utilisation, sizing.wait_s) == (0, 0.0, 0.0)


def test_prefill_engines_for_bursty_arrivals(prior: LatencyModels) -> None:
    # Arrivals in bursts (index of dispersion 6) wait as if E[S²] were 6× larger.
    cost, mix, rate, target = prior.prefill, LengthMix.uniform(2000.0), 60_000.0, 300.0

    def sizing(dispersion: float, max_engines: int = 1024) -> PrefillSizing:
        return prefill_engines(
            cost,
            token_rate_s=rate,
            mix=mix,
            ttft_target_ms=target,
            max_engines=max_engines,
            dispersion=dispersion,
        )

    calm, bursty = sizing(1.0), sizing(6.0)
    assert (calm.engines, bursty.engines) == (2, 4)
    _, miss, wait = _hand_sizing(
        cost, token_rate_s=rate, mix=mix, engines=4, target_ms=target, dispersion=6.0
    )
    assert bursty.wait_s == pytest.approx(wait, rel=1e-12)
    assert bursty.miss_share == pytest.approx(miss, rel=1e-9)
    assert miss <= 0.01
    _, miss_less, _ = _hand_sizing(
        cost, token_rate_s=rate, mix=mix, engines=3, target_ms=target, dispersion=6.0
    )
    assert miss_less > 0.01
    assert sizing(6.0, max_engines=3).meets_target is False
    # Below 1 (smoother than Poisson) is taken as Poisson.
    assert sizing(0.5) == calm


def test_a_long_prompt_has_less_room_to_wait_than_a_short_one() -> None:
    # Half the prompts 500 tokens, half 20,000 (a known world), TTFT 1 s: the long ones take
    # 0.545 s alone (171.4 + 238.5 + 135.0 ms, the later chunks reading the earlier ones) and
    # may wait 0.455 s, the short ones 0.977 s. The share missing is the mix of both tails.
    cost = known_prefill()
    assert cost.alone_s(20_000) == pytest.approx(0.5449, rel=1e-3)
    assert cost.alone_s(500) == pytest.approx(0.022625, rel=1e-4)
    mix = LengthMix(10_250.0, (500.0**2 + 20_000.0**2) / 2, 20_000.0, ((500.0, 0.5), (20_000.0, 0.5)))
    sizing = prefill_engines(cost, token_rate_s=100_000.0, mix=mix, ttft_target_ms=1000.0)
    rho, miss, _ = _hand_sizing(
        cost, token_rate_s=100_000.0, mix=mix, engines=sizing.engines, target_ms=1000.0
    )
    assert sizing.miss_share == pytest.approx(miss, rel=1e-9) and miss <= 0.01
    assert sizing.utilisation == pytest.approx(rho, rel=1e-12)
    _, miss_less, _ = _hand_sizing(
        cost, token_rate_s=100_000.0, mix=mix, engines=sizing.engines - 1, target_ms=1000.0
    )
    assert miss_less > 0.01
    # Sized by its mean prompt alone (every request 10,250 tokens, the same tokens/s), fewer do.
    mean_only = prefill_engines(
        cost, token_rate_s=100_000.0, mix=LengthMix.uniform(10_250.0), ttft_target_ms=1000.0
    )
    assert mean_only.engines < sizing.engines


# --- decode ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("target_ms", [10.0, 19.0, 30.0])
def test_decode_batch_limit_is_where_the_learned_iteration_crosses_the_target(target_ms: float) -> None:
    isl, osl = 2000.0, 150.0
    context = isl + osl / 2  # the batch's mean context, half-way through the outputs
    # a + n·(b + c·context) <= target: n <= (target − 5) / (0.05 + 2e-5 × 2075) = (target − 5) / 0.0915.
    hand = math.floor((target_ms - DA) / (DB + DC * context))
    assert hand == {10.0: 54, 19.0: 153, 30.0: 273}[target_ms]
    limit = decode_batch_limit(
        known_decode(), isl_tokens=isl, osl_tokens=osl, itl_target_ms=target_ms, max_kv_tokens=10_000_000
    )
    assert limit == hand


def test_decode_batch_limit_values_on_the_prior_and_a_slower_world(
    prior: LatencyModels, h200: PerfModel
) -> None:
    kv = h200.decode.max_kv_tokens

    def limit(cost: DecodeCost, target_ms: float = 19.0) -> int:
        return decode_batch_limit(
            cost, isl_tokens=2000.0, osl_tokens=150.0, itl_target_ms=target_ms, max_kv_tokens=kv
        )

    # Pinned on the cold-start prior at context 2075 for a 19 ms target (20 ms × a 0.95 margin):
    # the prior's line, 6.09 + 0.0203·n + 2.93e-5·K ms, is 19 ms at n = 158.
    got = limit(prior.decode)
    assert got == 158
    assert (
        prior.decode.iteration_ms(got, got * 2075.0)
        <= 19.0
        < prior.decode.iteration_ms(got + 1, (got + 1) * 2075.0)
    )
    # Everything 1.2× slower (a known world): 1.2·(5 + 0.0915·n) <= 19: n <= 118.4 (153 at 1.0).
    assert limit(known_decode(slower=1.2)) == math.floor((19.0 / 1.2 - DA) / (DB + DC * 2075.0)) == 118
    assert limit(known_decode()) == 153


def test_decode_batch_limit_is_kv_bound() -> None:
    # KV for exactly 20 requests of 2150 tokens (and a bit): the ITL would allow 153.
    limit = decode_batch_limit(
        known_decode(), isl_tokens=2000.0, osl_tokens=150.0, itl_target_ms=19.0, max_kv_tokens=20 * 2150 + 100
    )
    assert limit == 20


def test_decode_batch_limit_is_capped_by_max_num_seqs() -> None:
    kwargs = {"isl_tokens": 2000.0, "osl_tokens": 150.0, "itl_target_ms": 19.0, "max_kv_tokens": 10_000_000}
    assert decode_batch_limit(known_decode(), **kwargs) == 153  # type: ignore[arg-type]
    assert decode_batch_limit(known_decode(), max_num_seqs=64, **kwargs) == 64  # type: ignore[arg-type]
    assert decode_batch_limit(known_decode(), max_num_seqs=500, **kwargs) == 153  # type: ignore[arg-type]


def test_decode_batch_limit_is_one_when_even_one_request_misses(prior: LatencyModels) -> None:
    # One request at context 2075 takes 5 + 0.05 + 0.0415 ms: a 5 ms target is out of reach.
    assert known_decode().iteration_ms(1, 2075.0) > 5.0
    kwargs = {"isl_tokens": 2000.0, "osl_tokens": 150.0}
    assert decode_batch_limit(known_decode(), itl_target_ms=5.0, max_kv_tokens=10_000_000, **kwargs) == 1  # type: ignore[arg-type]
    # The prior's single request is read on its line, 6.2 ms: a 6 ms target misses.
    assert prior.decode.iteration_ms(1, 2075.0) == pytest.approx(6.1716, rel=1e-4)
    assert decode_batch_limit(prior.decode, itl_target_ms=6.0, max_kv_tokens=10_000_000, **kwargs) == 1  # type: ignore[arg-type]
    # Also when not even one request's KV fits.
    assert decode_batch_limit(known_decode(), itl_target_ms=50.0, max_kv_tokens=1000, **kwargs) == 1  # type: ignore[arg-type]


def test_decode_concurrency_is_littles_law() -> None:
    # 30 req/s, each decoding 149 tokens after its first at 20 ms: 30 × 149 × 0.02 = 89.4.
    got = decode_concurrency(request_rate_s=30.0, osl_tokens=150.0, itl_target_ms=20.0)
    assert got == pytest.approx(89.4, rel=1e-12)
    assert decode_concurrency(request_rate_s=30.0, osl_tokens=1.0, itl_target_ms=20.0) == 0.0


def test_peak_concurrency_is_the_normal_quantile_of_the_count_in_flight() -> None:
    z = NormalDist().inv_cdf(0.999)
    assert peak_concurrency(100.0, dispersion=1.0, quantile=0.999) == pytest.approx(
        100.0 + z * 10.0, rel=1e-12
    )
    assert peak_concurrency(100.0, dispersion=4.0, quantile=0.999) == pytest.approx(
        100.0 + z * 20.0, rel=1e-12
    )
    assert peak_concurrency(100.0, dispersion=0.25, quantile=0.999) == peak_concurrency(
        100.0, dispersion=1.0, quantile=0.999
    )
    assert peak_concurrency(0.0, dispersion=4.0, quantile=0.999) == 0.0


def test_decode_batch_limit_reads_the_held_context_when_longer(prior: LatencyModels) -> None:
    # A heavy-tailed output mix: the requests in decode hold more context than the arrivals'
    # mean (long outputs stay longer), and the batch is sized at what the engines hold.
    kwargs = {"itl_target_ms": 30.0, "max_kv_tokens": 945_029}
    by_mean = decode_batch_limit(prior.decode, isl_tokens=1000.0, osl_tokens=400.0, **kwargs)
    held = decode_batch_limit(
        prior.decode, isl_tokens=1000.0, osl_tokens=400.0, held_context_tokens=3000.0, **kwargs
    )
    at_held = decode_batch_limit(prior.decode, isl_tokens=3000.0 - 200.0, osl_tokens=400.0, **kwargs)
    assert held == at_held < by_mean
    # A shorter held context (a batch just admitted) does not raise the limit.
    shorter = decode_batch_limit(
        prior.decode, isl_tokens=1000.0, osl_tokens=400.0, held_context_tokens=500.0, **kwargs
    )
    assert shorter == by_mean
