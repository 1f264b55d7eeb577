"""FPM regressions (reference §3.4): fits, the bucketed window, refusals, estimates, bootstrap."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from app.core.perf.fpm import ForwardPassMetrics
from app.core.seed.averages import MovingAverage
from app.core.seed.engine_capacity import best_agg_rps, best_decode_rps, best_prefill_rps
from app.core.seed.load_models import bootstrap_fpms_from_profile
from app.core.seed.regression import (
    AggRegression,
    DecodeRegression,
    PrefillRegression,
    clamp_kv_hit_rate,
)
from app.sources.profile_files import load_profile
from tests.support_fpm import fpm as make_fpm

H200 = Path(__file__).resolve().parents[2] / "data" / "profiles" / "h200-llama3.1-8b-fp8"


def fpm(wall_s: float, *, worker: str = "w0", **fields: int) -> ForwardPassMetrics:
    return make_fpm(worker, wall_s=wall_s, **fields)


def prefill_fpm(tokens: int, wall_s: float, requests: int = 1) -> ForwardPassMetrics:
    return fpm(wall_s, prefill_tokens=tokens, prefill_requests=requests)


def decode_fpm(requests: int, kv: int, wall_s: float) -> ForwardPassMetrics:
    return fpm(wall_s, decode_kv=kv, decode_requests=requests)


def trained_prefill(slope: float = 1e-5, intercept: float = 1e-3, **kwargs: int) -> PrefillRegression:
    model = PrefillRegression(**kwargs)
    model.observe_many(prefill_fpm(t, slope * t + intercept) for t in (500, 1000, 1500, 2000, 2500))
    return model


def trained_decode() -> DecodeRegression:
    """wall = 1 ms + 0.1 ms per request + 10 us per KV token, with the two inputs varying apart."""
    model = DecodeRegression()
    points = [(1, 1000), (4, 1000), (2, 8000), (8, 8000), (3, 20000), (10, 20000)]
    model.observe_many(decode_fpm(n, kv, 1e-3 + 1e-4 * n + 1e-5 * kv) for n, kv in points)
    return model


# --- fits ---------------------------------------------------------------------------------------


def test_prefill_fit_recovers_the_line() -> None:
    model = trained_prefill(slope=2e-5, intercept=3e-3)
    assert model.ready and model.not_ready_reason is None
    coefficients = model.coefficients()
    assert coefficients is not None
    assert coefficients["intercept_s"] == pytest.approx(3e-3, rel=1e-9)
    assert coefficients["sum_prefill_tokens_s"] == pytest.approx(2e-5, rel=1e-9)
    assert coefficients["clipped"] == []
    assert model.predict_wall_s(4000) == pytest.approx(3e-3 + 2e-5 * 4000)


def test_decode_fit_recovers_both_slopes() -> None:
    coefficients = trained_decode().coefficients()
    assert coefficients is not None
    assert coefficients["intercept_s"] == pytest.approx(1e-3, rel=1e-9)
    assert coefficients["num_decode_requests_s"] == pytest.approx(1e-4, rel=1e-9)
    assert coefficients["sum_decode_kv_tokens_s"] == pytest.approx(1e-5, rel=1e-9)
    assert coefficients["rank"] == 2


def test_agg_fit_recovers_both_slopes() -> None:
    model = AggRegression()
    points = [(100, 5000), (200, 15000), (300, 25000), (400, 35000), (500, 45000), (200, 30000)]
    model.observe_many(
        fpm(1e-4 * p + 1e-5 * d + 1e-3, prefill_tokens=p, prefill_requests=1, decode_kv=d, decode_requests=10)
        for p, d in points
    )
    coefficients = model.coefficients()
    assert coefficients is not None
    assert coefficients["intercept_s"] == pytest.approx(1e-3, rel=1e-9)
    assert coefficients["sum_prefill_tokens_s"] == pytest.approx(1e-4, rel=1e-9)
    assert coefficients["sum_decode_kv_tokens_s"] == pytest.approx(1e-5, rel=1e-9)


def test_collinear_decode_inputs_resolve_to_the_minimum_norm_slopes() -> None:
    """The reference's decode training set has kv = 1000 x requests: the split between the two
    slopes is not identifiable. Centred least squares (sklearn's answer) puts almost all of it on
    the KV tokens, and predictions along the data stay exact."""
    model = DecodeRegression()
    points = [(5, 5000), (10, 10000), (20, 20000), (30, 30000), (40, 40000)]
    model.observe_many(decode_fpm(n, kv, 1e-5 * kv + 1e-3) for n, kv in points)
    coefficients = model.coefficients()
    assert coefficients is not None
    assert coefficients["rank"] == 1
    # min |(a, b)| with a + 1000 b = 0.01 s per (request + 1000 tokens): (a, b) = 0.01 (1, 1000) / (1 + 1e6)
    assert coefficients["num_decode_requests_s"] == pytest.approx(0.01 / 1_000_001, rel=1e-6)
    assert coefficients["sum_decode_kv_tokens_s"] == pytest.approx(10.0 / 1_000_001, rel=1e-6)
    assert model.predict_wall_s(25, 25000) == pytest.approx(0.251, rel=1e-9)


# --- refusals -----------------------------------------------------------------------------------


def test_too_few_observations_is_not_ready() -> None:
    model = PrefillRegression()
    model.observe_many(prefill_fpm(t, 1e-5 * t) for t in (100, 200, 300, 400))
    assert not model.has_sufficient_data()
    assert (model.ready, model.not_ready_reason) == (False, "too few observations (4 of 5)")
    assert model.coefficients() is None
    assert model.estimate_next_ttft(1000, 2048) is None
    assert best_prefill_rps(model, 100, 1000, 2048) == (0.0, 0.0)
    model.observe(prefill_fpm(500, 5e-3))
    assert model.ready


def test_negative_prefill_slope_is_rejected() -> None:
    model = PrefillRegression()
    model.observe_many(prefill_fpm(t, 0.1 - 1e-5 * t) for t in (500, 1000, 1500, 2000, 2500))
    assert model.has_sufficient_data() and not model.ready
    assert model.not_ready_reason == (
        "negative coefficient for sum_prefill_tokens (-1e-05 s per unit): more work would take less time"
    )
    assert model.estimate_next_ttft(1000, 2048) is None
    assert model.predict_wall_s(1000) is None


def test_negative_kv_slope_is_rejected_but_negative_request_slope_is_clipped() -> None:
    points = [(1, 1000), (4, 1000), (2, 8000), (8, 8000), (3, 20000), (10, 20000)]
    rejected = DecodeRegression()
    rejected.observe_many(decode_fpm(n, kv, 0.5 + 1e-4 * n - 1e-5 * kv) for n, kv in points)
    assert not rejected.ready
    assert rejected.not_ready_reason is not None
    assert rejected.not_ready_reason.startswith("negative coefficient for sum_decode_kv_tokens")

    clipped = DecodeRegression()
    clipped.observe_many(decode_fpm(n, kv, 0.01 - 1e-4 * n + 1e-5 * kv) for n, kv in points)
    assert clipped.ready
    coefficients = clipped.coefficients()
    assert coefficients is not None
    assert coefficients["clipped"] == ["num_decode_requests"]
    assert coefficients["num_decode_requests_s"] == 0.0
    # The refit on the KV tokens alone is the least-squares answer under "request slope = 0":
    # mean request count 14/3 per KV level, so the intercept absorbs -1e-4 x (per-level mean n).
    assert coefficients["sum_decode_kv_tokens_s"] > 0
    assert clipped.predict_wall_s(100, 8000) == pytest.approx(clipped.predict_wall_s(1, 8000))


def test_a_feature_that_never_varied_cannot_be_learned() -> None:
    model = PrefillRegression()
    model.observe_many(prefill_fpm(2048, 0.02 + i * 1e-4) for i in range(6))
    assert not model.ready
    assert model.not_ready_reason == (
        "sum_prefill_tokens was 2048 in all 6 samples: its effect on wall time cannot be learned"
    )


def test_predictions_are_floored_at_a_microsecond() -> None:
    model = trained_prefill(slope=1e-5, intercept=-4e-3)
    assert model.predict_wall_s(0) == 1e-6
    assert model.predict_wall_s(1000) == pytest.approx(6e-3)


# --- observations -------------------------------------------------------------------------------


def test_heartbeats_are_ignored() -> None:
    model = trained_prefill()
    before = (model.num_observations, model.avg_isl_tokens, model.coefficients())
    assert model.observe(ForwardPassMetrics("w0", 0, 0.0)) is False
    assert model.observe(fpm(0.0, prefill_tokens=9000, prefill_requests=3)) is False
    assert (model.num_observations, model.avg_isl_tokens, model.coefficients()) == before
    assert model.diagnostics()["heartbeats_ignored"] == 2


def test_unusable_wall_times_are_counted_not_used() -> None:
    model = PrefillRegression()
    assert model.observe(prefill_fpm(100, math.nan)) is False
    assert model.observe(prefill_fpm(100, -0.5)) is False
    assert model.num_observations == 0
    assert model.diagnostics()["invalid_ignored"] == 2


def test_moving_average_skips_leading_zeros_and_keeps_a_window() -> None:
    avg = MovingAverage(3)
    for v in (0, 0, 4, 0, 2, 6, 10):
        avg.add(v)
    # leading zeros skipped; the zero after 4 kept; window of 3 -> (2 + 6 + 10) / 3
    assert (len(avg), avg.value) == (3, 6.0)
    assert MovingAverage(5).value == 0.0


def test_averages_follow_the_scheduled_batches() -> None:
    model = AggRegression(max_samples=4)
    model.observe(fpm(0.01, prefill_tokens=1000, prefill_requests=2, decode_kv=6000, decode_requests=3))
    model.observe(fpm(0.01, prefill_tokens=0, decode_kv=8000, decode_requests=4))
    assert model.avg_isl_tokens == 500  # only iterations that prefilled something count
    assert model.avg_decode_length_tokens == 2000
    assert model.avg_prefill_tokens_per_iteration == 500  # (1000 + 0) / 2


# --- bucketed window ----------------------------------------------------------------------------


def test_the_window_never_exceeds_max_samples() -> None:
    rng = random.Random(7)
    model = DecodeRegression(max_samples=20)
    for _ in range(500):
        n = rng.randint(1, 64)
        kv = n * rng.randint(200, 4000)
        model.observe(decode_fpm(n, kv, 1e-3 + 1e-5 * kv))
        assert model.num_observations <= 20
    assert model.num_observations == 20


def test_flooding_one_operating_point_keeps_the_rest_of_the_range() -> None:
    """16 points spread over 16 buckets, then 200 iterations at 700 tokens: a FIFO window would
    hold only 700s; the bucketed one retires from the fullest bucket and keeps every other point."""
    model = PrefillRegression(max_samples=64)
    spread = list(range(0, 1600, 100))
    model.observe_many(prefill_fpm(t, 1e-3 + 1e-5 * t) for t in spread)
    model.observe_many(prefill_fpm(700, 1e-3 + 1e-5 * 700) for _ in range(200))
    kept = [s.x[0] for s in model.samples]
    assert len(kept) == 64
    assert sorted(set(kept)) == spread  # every original operating point is still there
    assert kept.count(700) == 64 - 15
    assert len(model.bucket_counts()) == 16


def test_widened_bounds_rebucket_old_samples() -> None:
    """Range 0..10 puts {0, 1} and {10, 9} in different buckets; a sample at 1000 widens the range
    so all four share bucket 0, which is then the fullest and loses its oldest (0). Keeping the old
    bucket keys would have retired 10 instead."""
    model = PrefillRegression(max_samples=4, buckets=4)
    model.observe_many(prefill_fpm(t, 1e-3 + 1e-5 * t) for t in (0, 10, 1, 9))
    assert model.bucket_counts() == {(0,): 2, (3,): 2}
    model.observe(prefill_fpm(1000, 1e-3 + 1e-2))
    assert [s.x[0] for s in model.samples] == [10, 1, 9, 1000]
    assert model.bucket_counts() == {(0,): 3, (3,): 1}


def test_two_dimensional_models_use_a_square_grid() -> None:
    assert DecodeRegression().buckets_per_axis == 4
    assert PrefillRegression().buckets_per_axis == 16
    with pytest.raises(ValueError, match="perfect-power"):
        AggRegression(buckets=15)


def test_samples_and_coefficients_for_diagnostics() -> None:
    model = trained_prefill()
    assert [(s.x, s.wall_time_s) for s in model.samples][:2] == [((500.0,), 0.006), ((1000.0,), 0.011)]
    d = model.diagnostics()
    assert (d["observations"], d["ready"], d["axis_bounds"]) == (5, True, {"sum_prefill_tokens": [500, 2500]})
    assert d["averages"] == {"isl_tokens": 1500.0, "num_prefill_requests": 1.0}


# --- estimates ----------------------------------------------------------------------------------


def test_next_ttft_is_chunked_prefill_of_queue_plus_own_request() -> None:
    model = trained_prefill()  # wall = 1 ms + 10 us/token, avg ISL 1500
    # 3000 queued + 1500 own = 4500 tokens: chunks 2048, 2048, 404
    expected = 2 * (1e-3 + 1e-5 * 2048) + (1e-3 + 1e-5 * 404)
    assert model.estimate_next_ttft(3000, 2048) == pytest.approx(expected)
    # an empty queue: the request's own 1500 tokens in one chunk
    assert model.estimate_next_ttft(0, 2048) == pytest.approx(1e-3 + 1e-5 * 1500)
    assert model.estimate_next_ttft(0, 0) is None  # chunk size unknown


def test_kv_hit_rate_discounts_prefill_work_up_to_95_percent() -> None:
    model = trained_prefill()
    assert model.estimate_next_ttft(2500, 2048, kv_hit_rate=0.5) == pytest.approx(1e-3 + 1e-5 * 2000)
    assert model.estimate_next_ttft(2500, 2048, kv_hit_rate=1.0) == pytest.approx(1e-3 + 1e-5 * 200)
    assert [clamp_kv_hit_rate(v) for v in (None, math.nan, -0.2, 0.3, 0.99)] == [0, 0, 0, 0.3, 0.95]


def test_next_itl_adds_one_average_request() -> None:
    model = trained_decode()
    avg_n = (1 + 4 + 2 + 8 + 3 + 10) / 6
    avg_len = (1000 + 250 + 4000 + 1000 + 20000 / 3 + 2000) / 6
    expected = 1e-3 + 1e-4 * (avg_n + 1) + 1e-5 * (5000 + 1000 + avg_len)
    assert model.estimate_next_itl(5000, 1000) == pytest.approx(expected)


def test_agg_estimates_share_the_iteration_with_decode() -> None:
    model = AggRegression()
    points = [(100, 5000), (200, 15000), (300, 25000), (400, 35000), (500, 45000), (200, 30000)]
    model.observe_many(
        fpm(1e-4 * p + 1e-5 * d + 1e-3, prefill_tokens=p, prefill_requests=1, decode_kv=d, decode_requests=10)
        for p, d in points
    )
    avg_isl = 1700 / 6
    # 3000 queued + avg ISL in chunks of 2048, each beside 10 000 decode KV tokens
    total = 3000 + avg_isl
    expected = (1e-3 + 1e-4 * 2048 + 0.1) + (1e-3 + 1e-4 * (total - 2048) + 0.1)
    assert model.estimate_next_ttft(3000, 2048, 10_000) == pytest.approx(expected)
    avg_len = (500 + 1500 + 2500 + 3500 + 4500 + 3000) / 6
    assert model.estimate_next_itl(7000, 1000) == pytest.approx(
        1e-3 + 1e-4 * avg_isl + 1e-5 * (8000 + avg_len)
    )


def test_prefill_capacity() -> None:
    model = trained_prefill()  # wall = 1 ms + 10 us/token
    rps, ttft_ms = best_prefill_rps(model, 100, 1000, 2048)
    assert (rps, ttft_ms) == (pytest.approx(1 / 0.011), pytest.approx(11.0))
    # 5000 tokens over chunks of 2048: 2 full + 904
    wall = 2 * (1e-3 + 2048e-5) + (1e-3 + 904e-5)
    assert best_prefill_rps(model, 10, 5000, 2048) == (
        pytest.approx(1 / wall),
        pytest.approx(wall * 1e3),
    )
    assert best_prefill_rps(model, 100, 0, 2048) == (0.0, 0.0)


def test_decode_capacity_by_littles_law() -> None:
    model = DecodeRegression()
    points = [(1, 1000), (4, 1000), (2, 8000), (8, 8000), (3, 20000), (10, 20000)]
    model.observe_many(decode_fpm(n, kv, 1e-3 + 1e-5 * kv) for n, kv in points)  # no per-request cost
    # ctx 1000: wall(bs) = 1 ms + 10 ms x bs <= 50 ms -> bs 4 (41 ms); 4 / (100 x 0.041)
    assert best_decode_rps(model, 50, 1000, 100) == (pytest.approx(4 / 4.1), pytest.approx(41.0))
    # the KV cache holds 3 such requests
    assert best_decode_rps(model, 50, 1000, 100, max_kv_tokens=3000) == (
        pytest.approx(3 / 3.1),
        pytest.approx(31.0),
    )
    assert best_decode_rps(model, 50, 1000, 100, max_num_seqs=2)[0] == pytest.approx(2 / 2.1)
    # even one request misses 5 ms: still answered, at batch 1
    assert best_decode_rps(model, 5, 1000, 100) == (pytest.approx(1 / 1.1), pytest.approx(11.0))
    assert best_decode_rps(model, 50, 0, 100) == (0.0, 0.0)


def test_agg_capacity_sweeps_the_batch_under_both_targets() -> None:
    model = AggRegression()
    points = [(100, 5000), (200, 15000), (300, 25000), (400, 35000), (500, 45000), (200, 30000)]
    model.observe_many(
        fpm(1e-4 * p + 1e-5 * d + 1e-3, prefill_tokens=p, prefill_requests=1, decode_kv=d, decode_requests=10)
        for p, d in points
    )
    # ISL 1000, OSL 100: per batch slot 10 prefill tokens and 1050 KV tokens per iteration:
    # wall = 1 ms + 11.5 ms x bs <= 50 ms -> bs 4 (47 ms)
    rps, ttft_ms, itl_ms = best_agg_rps(model, 1000, 100, 2048, 1e6, 50)
    assert (rps, itl_ms) == (pytest.approx(4 / (100 * 0.047)), pytest.approx(47.0))
    assert ttft_ms > 0
    # ITL 10 ms: even batch 1 (12.5 ms) misses; answered at batch 1
    rps, _, itl_ms = best_agg_rps(model, 1000, 100, 2048, 1e6, 10)
    assert (rps, itl_ms) == (pytest.approx(1 / (100 * 0.0125)), pytest.approx(12.5))


# --- bootstrap from the profile -----------------------------------------------------------------


@pytest.fixture(scope="module")
def h200_models() -> tuple[PrefillRegression, DecodeRegression]:
    profile = load_profile(H200)
    prefill_fpms, decode_fpms = bootstrap_fpms_from_profile(profile)
    prefill, decode = PrefillRegression(), DecodeRegression()
    assert prefill.observe_many(prefill_fpms) == 17
    assert decode.observe_many(decode_fpms) == 41
    return prefill, decode


def test_bootstrap_fpms_follow_the_profile() -> None:
    profile = load_profile(H200)
    prefill_fpms, decode_fpms = bootstrap_fpms_from_profile(profile)
    first = prefill_fpms[0]
    assert (first.scheduled.sum_prefill_tokens, first.scheduled.num_prefill_requests) == (100, 1)
    assert first.wall_time_s == pytest.approx(profile.prefill.ttft_ms[0] / 1000)
    d = profile.decode
    kv = round(float(d.kv_usage[1]) * d.max_kv_tokens)
    assert decode_fpms[1].scheduled.sum_decode_kv_tokens == kv
    assert decode_fpms[1].scheduled.num_decode_requests == max(1, round(kv / float(d.context_tokens[1])))
    assert decode_fpms[1].wall_time_s == pytest.approx(float(d.itl_ms[1]) / 1000)
    assert all(f.scheduled.num_decode_requests >= 1 for f in decode_fpms)


def test_bootstrap_makes_both_models_ready(h200_models: tuple[PrefillRegression, DecodeRegression]) -> None:
    prefill, decode = h200_models
    assert prefill.ready and decode.ready
    assert prefill.estimate_next_ttft(0, 8192) is not None
    assert decode.estimate_next_itl(0, 0) is not None


def test_bootstrapped_prefill_predicts_the_profile_ttft(
    h200_models: tuple[PrefillRegression, DecodeRegression],
) -> None:
    """A straight line through the H200 TTFT curve (observed fit: 22.1 us/token, intercept -1.6 ms).
    From ISL 2134 up it is within 11% of every profiled point (observed worst 10.3% at 7219); below
    that the profile's fixed ~18 ms overhead is not linear and the line underestimates (0.6 ms vs
    19.5 ms at ISL 100): the absolute error stays under 19 ms everywhere."""
    prefill, _ = h200_models
    profile = load_profile(H200).prefill
    for isl, ttft_ms in zip(profile.isl_tokens, profile.ttft_ms, strict=True):
        predicted_ms = prefill.predict_wall_s(float(isl)) * 1000
        assert abs(predicted_ms - ttft_ms) < 19.0, isl
        if isl >= 2000:
            assert predicted_ms == pytest.approx(ttft_ms, rel=0.11), isl
    for isl, expected_ms in ((3151, 63.2), (8236, 171.0), (16372, 375.5)):
        assert prefill.predict_wall_s(isl) * 1000 == pytest.approx(expected_ms, rel=0.11)


def test_bootstrapped_decode_predicts_the_profile_itl(
    h200_models: tuple[PrefillRegression, DecodeRegression],
) -> None:
    """The plane through the H200 decode grid (observed: 6.1 ms + 20.3 us per request + 0.029 us
    per KV token). For contexts of 2997 tokens and more it stays within 4.5 ms of every profiled
    ITL (observed worst 4.33 ms at context 2997, 92% KV); the short-context row (350 tokens, up to
    1573 requests) is less linear: within 12.5 ms (observed worst 12.32 ms)."""
    _, decode = h200_models
    profile = load_profile(H200)
    _, decode_fpms = bootstrap_fpms_from_profile(profile)
    for record, ctx, itl_ms in zip(
        decode_fpms, profile.decode.context_tokens, profile.decode.itl_ms, strict=True
    ):
        s = record.scheduled
        predicted_ms = decode.predict_wall_s(s.num_decode_requests, s.sum_decode_kv_tokens) * 1000
        assert abs(predicted_ms - itl_ms) < (4.5 if ctx >= 2997 else 12.5), (ctx, s)
