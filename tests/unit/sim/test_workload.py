"""Workloads: a trace at K times its rate, and arrivals synthesised from a rate curve."""

from __future__ import annotations

from collections import Counter

import pytest

from app.core.traces import TraceRequest
from app.sim.world.workload import RateWindow, expand_rate, read_rate_curve, synthesize

TRACE = [TraceRequest(0.2, 100, 10), TraceRequest(5.0, 200, 20), TraceRequest(9.0, 300, 30)]


def test_each_request_becomes_k_with_its_lengths_within_half_a_second() -> None:
    out = expand_rate(TRACE, 30, seed=1)
    assert len(out) == 90
    assert Counter((r.isl_tokens, r.osl_tokens) for r in out) == {(100, 10): 30, (200, 20): 30, (300, 30): 30}
    for r in out:
        source = next(s for s in TRACE if s.isl_tokens == r.isl_tokens)
        assert max(0.0, source.arrival_s - 0.5) <= r.arrival_s <= source.arrival_s + 0.5
    assert [r.arrival_s for r in out] == sorted(r.arrival_s for r in out)
    assert min(r.arrival_s for r in out) >= 0.0  # the first request's copies are clipped at 0


def test_expansion_is_seeded() -> None:
    assert expand_rate(TRACE, 5, seed=3) == expand_rate(TRACE, 5, seed=3)
    assert expand_rate(TRACE, 5, seed=3) != expand_rate(TRACE, 5, seed=4)


def test_scale_one_is_the_trace_itself_and_fractions_copy_on_average() -> None:
    assert expand_rate(TRACE, 1, seed=0) == TRACE
    many = [TraceRequest(float(i), 10, 10) for i in range(2000)]
    assert 2900 <= len(expand_rate(many, 1.5, seed=0)) <= 3100


@pytest.mark.parametrize("k", [0, -1, float("nan"), float("inf")])
def test_bad_scale_is_refused(k: float) -> None:
    with pytest.raises(ValueError, match="rate scale"):
        expand_rate(TRACE, k, seed=0)


def test_synthesised_arrivals_follow_the_compressed_curve() -> None:
    windows = [RateWindow(0, 10.0), RateWindow(600, 0.0), RateWindow(1200, 40.0)]
    out = synthesize(windows, TRACE, compress=24, seed=0)
    # 600 s windows last 25 s: about 250 requests, none, then about 1000 (Poisson).
    first = [r for r in out if r.arrival_s < 25]
    second = [r for r in out if 25 <= r.arrival_s < 50]
    third = [r for r in out if r.arrival_s >= 50]
    assert 200 <= len(first) <= 300
    assert second == []
    assert 900 <= len(third) <= 1100
    assert max(r.arrival_s for r in out) < 75
    assert {(r.isl_tokens, r.osl_tokens) for r in out} == {(100, 10), (200, 20), (300, 30)}
    assert synthesize(windows, TRACE, compress=24, seed=0) == out


def test_the_rate_file_is_read_and_a_bad_one_named(tmp_path) -> None:
    good = tmp_path / "rate.csv"
    good.write_text("window_start_s,total_rate_rps,active_clients\n0,1.5,3\n600,2.5,4\n")
    assert read_rate_curve(good) == [RateWindow(0, 1.5), RateWindow(600, 2.5)]
    bad = tmp_path / "bad.csv"
    bad.write_text("window_start_s,total_rate_rps\n0,x\n")
    with pytest.raises(ValueError, match=r"bad.csv:2: expected numeric"):
        read_rate_curve(bad)
    with pytest.raises(ValueError, match="cannot read"):
        read_rate_curve(tmp_path / "missing.csv")
