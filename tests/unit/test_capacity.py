"""The formulas of SLA scaling (`app/core/sla/capacity.py`) against hand computations on the bundled
H200 profile: every expected value below is recomputed here from the profile's interpolated
figures (`PerfModel.prefill_ttft_ms`, `PerfModel.decode_itl_ms`), not copied from a run."""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

import pytest

from app.core.perf.interpolation import PerfModel
from app.core.sla.capacity import (
    Bucket,
    LengthMix,
    PrefillSizing,
    decode_batch_limit,
    decode_concurrency,
    peak_concurrency,
    prefill_capacity_tokens_s,
    prefill_engines,
    prefill_service_s,
)
from app.sources.profile_files import load_profile

H200 = Path(__file__).resolve().parents[2] / "data" / "profiles" / "h200-llama3.1-8b-fp8"
CHUNK = 8192  # the default prefill max_num_batched_tokens (app/workers/resources.py)


@pytest.fixture(scope="module")
def h200() -> PerfModel:
    return PerfModel.from_profile(load_profile(H200))


def _hand_capacity(model: PerfModel, chunk: int, scale: float) -> float:
    """One saturated engine: a full chunk per chunk-TTFT, everything `scale` times slower."""
    return chunk / (model.prefill_ttft_ms(chunk) / 1000.0) * (1.0 / scale)


def _hand_quantile_wait_s(
    token_rate_s: float,
    engines: int,
    mix: LengthMix,
    capacity: float,
    quantile: float,
    dispersion: float = 1.0,
) -> tuple[float, float]:
    """(utilisation, quantile wait) of `engines` pooled into one M/G/1 server `engines` times as
    fast, written out from the formulas: service S/c (so E[S²]/c², times the arrivals' index of
    dispersion when above 1), Pollaczek-Khinchine mean wait, exponential tail with
    P(wait > 0) = rho."""
    rate = token_rate_s / mix.mean  # requests per second, all engines
    rho = rate * (mix.mean / capacity) / engines
    if rho >= 1:
        return rho, math.inf
    second = mix.second_moment / capacity**2 * max(dispersion, 1.0) / engines**2
    mean_wait = rate * second / (2 * (1 - rho))
    tail = 1 - quantile
    if rho <= tail:
        return rho, 0.0
    return rho, mean_wait / rho * math.log(rho / tail)


# --- prefill capacity and service time ------------------------------------------------------------


@pytest.mark.parametrize("chunk", [2048, CHUNK])
@pytest.mark.parametrize("scale", [1.0, 1.2, 0.8])
def test_prefill_capacity_is_a_chunk_per_chunk_ttft(h200: PerfModel, chunk: int, scale: float) -> None:
    got = prefill_capacity_tokens_s(h200, chunk_tokens=chunk, scale=scale)
    assert got == pytest.approx(_hand_capacity(h200, chunk, scale), rel=1e-12)


def test_prefill_capacity_of_the_default_chunk(h200: PerfModel) -> None:
    # Pinned once so that a change of the profile or its interpolation shows up here:
    # 8192 tokens in 169.99 ms on the H200 profile.
    assert prefill_capacity_tokens_s(h200, chunk_tokens=CHUNK, scale=1.0) == pytest.approx(
        48191.4174, rel=1e-8
    )


@pytest.mark.parametrize("scale", [1.0, 1.2])
def test_prefill_service_of_a_prompt_longer_than_a_chunk_is_full_chunks_plus_the_rest(
    h200: PerfModel, scale: float
) -> None:
    isl = 2 * CHUNK + 3000  # two full chunks, then 3000 tokens
    hand_ms = 2 * h200.prefill_ttft_ms(CHUNK) + h200.prefill_ttft_ms(3000)
    got = prefill_service_s(h200, isl, chunk_tokens=CHUNK, scale=scale)
    assert got == pytest.approx(hand_ms * scale / 1000.0, rel=1e-12)


def test_prefill_service_of_whole_chunks_and_of_a_short_prompt(h200: PerfModel) -> None:
    # Exactly three chunks: no rest term (a zero-token rest is not one more pass).
    assert prefill_service_s(h200, 3 * CHUNK, chunk_tokens=CHUNK, scale=1.0) == pytest.approx(
        3 * h200.prefill_ttft_ms(CHUNK) / 1000.0, rel=1e-12
    )
    # Shorter than a chunk: the prompt's own TTFT.
    assert prefill_service_s(h200, 1500, chunk_tokens=CHUNK, scale=1.0) == pytest.approx(
        h200.prefill_ttft_ms(1500) / 1000.0, rel=1e-12
    )


# --- LengthMix ------------------------------------------------------------------------------------


def test_uniform_mix_second_moment_is_the_mean_squared() -> None:
    mix = LengthMix.uniform(2000.0)
    assert (mix.mean, mix.second_moment, mix.quantile) == (2000.0, 4_000_000.0, 2000.0)


def test_single_bucket_histogram_is_uniform_at_the_mean() -> None:
    # One bucket: its middle is rescaled to the mean, so E[isl²] = mean² (no spread is known).
    mix = LengthMix.from_histogram([(4096.0, 50.0)], 2000.0, 0.5)
    assert mix.mean == 2000.0
    assert mix.second_moment == pytest.approx(2000.0**2, rel=1e-12)
    # The median of (0, 4096] interpolated: 2048; above the mean, so kept.
    assert mix.quantile == pytest.approx(2048.0, rel=1e-12)


def test_histogram_mean_is_exact_and_moments_rescale_the_bucket_middles() -> None:
    buckets: list[Bucket] = [(1000.0, 6.0), (2000.0, 3.0), (4000.0, 1.0)]
    mean = 1400.0
    mix = LengthMix.from_histogram(buckets, mean, 0.95)
    assert mix.mean == mean  # the frontend's exact mean, not the buckets' estimate
    # By hand: middles 500, 1500, 3000; their mean (6·500 + 3·1500 + 1·3000)/10 = 1050;
    # every middle scaled by 1400/1050 so the mean is the exact one.
    k = mean / 1050.0
    hand_second = (6 * (500 * k) ** 2 + 3 * (1500 * k) ** 2 + 1 * (3000 * k) ** 2) / 10
    assert mix.second_moment == pytest.approx(hand_second, rel=1e-12)
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
    # Middles 500 and 1500: raw mean (8·500 + 2·1500)/10 = 700, scaled by 1200/700.
    k = 1200.0 / 700.0
    assert mix.second_moment == pytest.approx((8 * (500 * k) ** 2 + 2 * (1500 * k) ** 2) / 10, rel=1e-12)


def test_empty_histogram_is_uniform() -> None:
    assert LengthMix.from_histogram([(1000.0, 0.0)], 700.0, 0.99) == LengthMix.uniform(700.0)


# --- prefill_engines ------------------------------------------------------------------------------


def test_prefill_engines_is_the_smallest_count_meeting_the_budget(h200: PerfModel) -> None:
    # 80,000 prompt tokens/s of 2000-token prompts, TTFT 300 ms: the utilisation cap alone would
    # allow 2 engines (80000 / (48191 × 0.9) = 1.84), the queueing budget needs more.
    mix, rate, target = LengthMix.uniform(2000.0), 80_000.0, 300.0
    sizing = prefill_engines(
        h200, token_rate_s=rate, mix=mix, ttft_target_ms=target, chunk_tokens=CHUNK, scale=1.0
    )
    capacity = _hand_capacity(h200, CHUNK, 1.0)
    service = h200.prefill_ttft_ms(2000.0) / 1000.0
    budget = target / 1000.0 - service
    assert sizing.capacity_tokens_s == pytest.approx(capacity, rel=1e-12)
    assert sizing.service_s == pytest.approx(service, rel=1e-12)
    assert sizing.meets_target is True
    assert sizing.engines == 3

    rho, wait = _hand_quantile_wait_s(rate, sizing.engines, mix, capacity, 0.99)
    assert sizing.utilisation == pytest.approx(rho, rel=1e-12)
    assert sizing.utilisation == pytest.approx(rate / (3 * capacity), rel=1e-12)
    assert sizing.wait_s == pytest.approx(wait, rel=1e-12)
    assert sizing.wait_s <= budget
    assert sizing.utilisation <= 0.9

    # One engine fewer: under the utilisation cap, but its quantile wait does not fit the budget.
    rho_less, wait_less = _hand_quantile_wait_s(rate, sizing.engines - 1, mix, capacity, 0.99)
    assert rho_less <= 0.9
    assert wait_less > budget
    fewer = prefill_engines(
        h200,
        token_rate_s=rate,
        mix=mix,
        ttft_target_ms=target,
        chunk_tokens=CHUNK,
        scale=1.0,
        max_engines=sizing.engines - 1,
    )
    assert (fewer.engines, fewer.meets_target) == (2, False)
    assert fewer.wait_s == pytest.approx(wait_less, rel=1e-12)


def test_prefill_engines_never_plans_past_the_utilisation_cap(h200: PerfModel) -> None:
    # A loose TTFT (10 s) puts no pressure on the wait: the cap decides, ceil(rate / (cap × 0.9)).
    rate = 200_000.0
    sizing = prefill_engines(
        h200,
        token_rate_s=rate,
        mix=LengthMix.uniform(2000.0),
        ttft_target_ms=10_000.0,
        chunk_tokens=CHUNK,
        scale=1.0,
        max_utilisation=0.9,
    )
    capacity = _hand_capacity(h200, CHUNK, 1.0)
    assert sizing.engines == math.ceil(rate / (capacity * 0.9)) == 5
    assert sizing.utilisation == pytest.approx(rate / (5 * capacity), rel=1e-12)
    assert sizing.utilisation <= 0.9
    assert rate / (4 * capacity) > 0.9  # one fewer would run above the cap
    # A lower cap asks for more engines for the same traffic.
    lower = prefill_engines(
        h200,
        token_rate_s=rate,
        mix=LengthMix.uniform(2000.0),
        ttft_target_ms=10_000.0,
        chunk_tokens=CHUNK,
        scale=1.0,
        max_utilisation=0.5,
    )
    assert lower.engines == math.ceil(rate / (capacity * 0.5)) == 9


def test_prefill_engines_for_a_slower_world_are_more(h200: PerfModel) -> None:
    kwargs = dict(
        token_rate_s=80_000.0, mix=LengthMix.uniform(2000.0), ttft_target_ms=300.0, chunk_tokens=CHUNK
    )
    base = prefill_engines(h200, scale=1.0, **kwargs)  # type: ignore[arg-type]
    slow = prefill_engines(h200, scale=1.5, **kwargs)  # type: ignore[arg-type]
    assert slow.capacity_tokens_s == pytest.approx(base.capacity_tokens_s / 1.5, rel=1e-12)
    assert (base.engines, slow.engines) == (3, 4)


def test_prefill_engines_for_zero_traffic_is_zero(h200: PerfModel) -> None:
    for rate, mix in ((0.0, LengthMix.uniform(2000.0)), (5000.0, LengthMix.uniform(0.0))):
        sizing = prefill_engines(
            h200, token_rate_s=rate, mix=mix, ttft_target_ms=300.0, chunk_tokens=CHUNK, scale=1.0
        )
        assert (sizing.engines, sizing.utilisation, sizing.wait_s) == (0, 0.0, 0.0)


def test_prefill_engines_when_even_the_prompt_alone_misses_the_target(h200: PerfModel) -> None:
    # A 16k-token prompt takes longer than a 100 ms target by itself: no count meets it, the
    # answer is max_engines, flagged.
    sizing = prefill_engines(
        h200,
        token_rate_s=10_000.0,
        mix=LengthMix.uniform(16_000.0),
        ttft_target_ms=100.0,
        chunk_tokens=CHUNK,
        scale=1.0,
        max_engines=7,
    )
    assert sizing.service_s > 0.1
    assert (sizing.engines, sizing.meets_target) == (7, False)


# --- decode ---------------------------------------------------------------------------------------


def _meets(model: PerfModel, n: int, context: float, scale: float, target_ms: float) -> bool:
    return model.decode_itl_ms(n, context) * scale <= target_ms


@pytest.mark.parametrize("target_ms", [10.0, 19.0, 30.0])
def test_decode_batch_limit_is_where_the_itl_surface_crosses_the_target(
    h200: PerfModel, target_ms: float
) -> None:
    isl, osl = 2000.0, 150.0
    context = isl + osl / 2  # the batch's mean context, half-way through the outputs
    kv = h200.decode.max_kv_tokens
    limit = decode_batch_limit(
        h200, isl_tokens=isl, osl_tokens=osl, itl_target_ms=target_ms, scale=1.0, max_kv_tokens=kv
    )
    assert limit < kv // (isl + osl)  # not KV-bound at these targets
    assert _meets(h200, limit, context, 1.0, target_ms)
    assert not _meets(h200, limit + 1, context, 1.0, target_ms)


def test_decode_batch_limit_values_and_a_slower_world(h200: PerfModel) -> None:
    kv = h200.decode.max_kv_tokens

    def limit(scale: float) -> int:
        return decode_batch_limit(
            h200, isl_tokens=2000.0, osl_tokens=150.0, itl_target_ms=19.0, scale=scale, max_kv_tokens=kv
        )

    # Pinned on the H200 profile at context 2075 for a 19 ms target (20 ms × the 0.95 margin).
    assert (limit(1.0), limit(1.2)) == (108, 85)
    assert _meets(h200, 85, 2075.0, 1.2, 19.0) and not _meets(h200, 86, 2075.0, 1.2, 19.0)


def test_decode_batch_limit_is_kv_bound(h200: PerfModel) -> None:
    # KV for exactly 20 requests of 2150 tokens (and a bit): the ITL would allow more.
    kv = 20 * 2150 + 100
    limit = decode_batch_limit(
        h200, isl_tokens=2000.0, osl_tokens=150.0, itl_target_ms=19.0, scale=1.0, max_kv_tokens=kv
    )
    assert limit == 20


def test_decode_batch_limit_is_one_when_even_one_request_misses(h200: PerfModel) -> None:
    # The profile's single-request ITL is ~4.4 ms: a 3 ms target is out of reach.
    assert h200.decode_itl_ms(1, 2075.0) > 3.0
    limit = decode_batch_limit(
        h200,
        isl_tokens=2000.0,
        osl_tokens=150.0,
        itl_target_ms=3.0,
        scale=1.0,
        max_kv_tokens=h200.decode.max_kv_tokens,
    )
    assert limit == 1
    # Also when not even one request's KV fits.
    assert (
        decode_batch_limit(
            h200, isl_tokens=2000.0, osl_tokens=150.0, itl_target_ms=50.0, scale=1.0, max_kv_tokens=1000
        )
        == 1
    )


def test_decode_concurrency_is_littles_law() -> None:
    # 30 req/s, each decoding 149 tokens after its first at 20 ms: 30 × 149 × 0.02 = 89.4.
    got = decode_concurrency(request_rate_s=30.0, osl_tokens=150.0, itl_target_ms=20.0)
    assert got == pytest.approx(89.4, rel=1e-12)
    assert decode_concurrency(request_rate_s=30.0, osl_tokens=1.0, itl_target_ms=20.0) == 0.0


# --- burstiness -----------------------------------------------------------------------------------


def test_prefill_engines_for_bursty_arrivals(h200: PerfModel) -> None:
    # Arrivals in bursts (index of dispersion 6) wait as if E[S²] were 6× larger.
    mix, rate, target = LengthMix.uniform(2000.0), 80_000.0, 300.0
    capacity = _hand_capacity(h200, CHUNK, 1.0)
    budget = target / 1000.0 - h200.prefill_ttft_ms(2000.0) / 1000.0

    def sizing(dispersion: float, max_engines: int = 1024) -> PrefillSizing:
        return prefill_engines(
            h200,
            token_rate_s=rate,
            mix=mix,
            ttft_target_ms=target,
            chunk_tokens=CHUNK,
            scale=1.0,
            max_engines=max_engines,
            dispersion=dispersion,
        )

    calm, bursty = sizing(1.0), sizing(6.0)
    assert (calm.engines, bursty.engines) == (3, 4)
    _, wait = _hand_quantile_wait_s(rate, bursty.engines, mix, capacity, 0.99, dispersion=6.0)
    assert bursty.wait_s == pytest.approx(wait, rel=1e-12)
    assert bursty.wait_s <= budget
    _, wait_less = _hand_quantile_wait_s(rate, bursty.engines - 1, mix, capacity, 0.99, dispersion=6.0)
    assert wait_less > budget
    assert sizing(6.0, max_engines=bursty.engines - 1).meets_target is False
    # Below 1 (smoother than Poisson) is taken as Poisson.
    assert sizing(0.5) == calm


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
