"""Interpolation by the reference planner's method (reference notes §3.2).

Two kinds of expected values: exact ones a reader can check by hand (measured points, clamping,
small synthetic grids whose cells sit on data points), and the figures of the copied H200 profile,
which are what Dynamo's `perf_interpolation.py` gives on the same data (same scipy calls)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from app.core.errors import ProfileError
from app.core.perf.interpolation import DecodeInterpolator, DecodePoint, PerfModel, PrefillInterpolator
from app.core.perf.profile import decode_from_mapping, prefill_from_mapping
from app.sources.profile_files import load_profile

REPO_ROOT = Path(__file__).resolve().parents[2]
H200 = REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"
MODEL = PerfModel.from_profile(load_profile(H200))
REL = 1e-9  # same scipy, same data: only floating-point noise may differ


# --- prefill --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillCase:
    name: str
    why: str
    isl_tokens: float
    ttft_ms: float
    thpt_per_gpu: float


PREFILL_CASES = [
    PrefillCase("first-point", "a cubic spline passes through its data", 100, 19.525209, 5121.58410186544),
    PrefillCase(
        "measured-3151", "a measured ISL gives the measured values", 3151, 63.214755, 49845.95764074385
    ),
    PrefillCase("last-point", "the other end of the data", 16372, 375.482618, 43602.55099744724),
    PrefillCase("below-range", "ISL is clamped to the smallest measured", 50, 19.525209, 5121.58410186544),
    PrefillCase(
        "above-range", "ISL is clamped to the largest measured", 20000, 375.482618, 43602.55099744724
    ),
    PrefillCase(
        "isl-3000",
        "the sanity scenario's ISL, between measured points",
        3000,
        60.45866867507649,
        49481.093527696125,
    ),
    PrefillCase("isl-8000", "another interpolated point", 8000, 165.06175779108486, 48548.63663710674),
]


@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: c.name)
def test_prefill(case: PrefillCase) -> None:
    assert MODEL.prefill.ttft_ms(case.isl_tokens) == pytest.approx(case.ttft_ms, rel=REL), case.why
    assert MODEL.prefill.thpt_per_gpu(case.isl_tokens) == pytest.approx(case.thpt_per_gpu, rel=REL), case.why
    assert MODEL.prefill_ttft_ms(case.isl_tokens) == MODEL.prefill.ttft_ms(case.isl_tokens)
    assert MODEL.prefill_thpt_per_gpu(case.isl_tokens) == MODEL.prefill.thpt_per_gpu(case.isl_tokens)


def test_prefill_cubic_reproduces_a_cubic() -> None:
    # A not-a-knot cubic spline through samples of a cubic polynomial is that polynomial.
    isl = np.array([100.0, 500.0, 1000.0, 2000.0, 4000.0])
    ttft = 10 + 0.01 * isl + 1e-6 * isl**2 + 1e-10 * isl**3
    data = prefill_from_mapping(
        {"prefill_isl": isl, "prefill_ttft": ttft, "prefill_thpt_per_gpu": isl * 2}, path="mem"
    )
    interpolator = PrefillInterpolator(data)
    assert interpolator.ttft_ms(3000) == pytest.approx(10 + 30 + 9 + 2.7, rel=1e-9)
    assert interpolator.thpt_per_gpu(3000) == pytest.approx(6000, rel=1e-9)


@pytest.mark.parametrize("isl", [float("nan"), float("inf"), float("-inf")])
def test_prefill_refuses_non_finite_isl(isl: float) -> None:
    with pytest.raises(ValueError, match="isl_tokens must be finite"):
        MODEL.prefill.ttft_ms(isl)


# --- decode on a 3x3 grid whose cells are data points ---------------------------------------------
#
# resolution 3: kv usage axis [0, 0.5, 1], context axis [0, 1000, 2000]. Rows 1000 and 2000 are data;
# the context-0 row lies outside the data's hull, so it is filled from the nearest point (row 1000).
# ITL on row 1000 is not monotonic in KV usage: 10, 100, 20 ms.

SMALL = decode_from_mapping(
    {
        "x_kv_usage": [0, 0.5, 1, 0, 0.5, 1],
        "y_context_length": [1000, 1000, 1000, 2000, 2000, 2000],
        "z_itl": [10, 100, 20, 15, 120, 130],
        "z_thpt_per_gpu": [100, 5000, 9000, 200, 6000, 7000],
        "max_kv_tokens": 10000,
    },
    path="small.json",
)
SMALL_GRID = DecodeInterpolator(SMALL, resolution=3)


def test_small_grid_cells() -> None:
    assert SMALL_GRID.kv_usage_axis.tolist() == [0.0, 0.5, 1.0]
    assert SMALL_GRID.context_axis.tolist() == [0.0, 1000.0, 2000.0]
    assert SMALL_GRID.itl_grid_ms.tolist() == [[10, 100, 20], [10, 100, 20], [15, 120, 130]]
    assert SMALL_GRID.thpt_grid_per_gpu.tolist() == [
        [100, 5000, 9000],
        [100, 5000, 9000],
        [200, 6000, 7000],
    ]


@dataclass(frozen=True)
class BestCase:
    name: str
    why: str
    itl_ms: float
    context_tokens: float
    expected: DecodePoint


SMALL_BEST = [
    BestCase(
        "scan-from-the-top",
        "the 20 ms cell at full KV usage counts although the middle cell misses (no binary search)",
        25,
        1000,
        DecodePoint(9000, 20, 1.0),
    ),
    BestCase("only-the-bottom-cell", "130 and 120 ms miss, 15 ms meets", 16, 2000, DecodePoint(200, 15, 0.0)),
    BestCase("target-equal-to-itl", "the comparison is <=", 120, 2000, DecodePoint(6000, 120, 0.5)),
    BestCase(
        "nothing-qualifies",
        "no cell meets 5 ms: the KV-usage-0 cell, its ITL above the target",
        5,
        1000,
        DecodePoint(100, 10, 0.0),
    ),
    BestCase(
        "nearest-filled-row",
        "context 400 rounds to the context-0 row, filled from row 1000",
        25,
        400,
        DecodePoint(9000, 20, 1.0),
    ),
    BestCase(
        "rounds-to-nearest-row", "context 1600 rounds to row 2000", 200, 1600, DecodePoint(7000, 130, 1.0)
    ),
    BestCase(
        "context-beyond-data",
        "the row index is clipped to the last row",
        200,
        50000,
        DecodePoint(7000, 130, 1.0),
    ),
    BestCase(
        "nan-target", "NaN meets nothing, as in the reference", float("nan"), 1000, DecodePoint(100, 10, 0.0)
    ),
]


@pytest.mark.parametrize("case", SMALL_BEST, ids=lambda c: c.name)
def test_small_grid_best_throughput(case: BestCase) -> None:
    assert SMALL_GRID.best_throughput_per_gpu(case.itl_ms, case.context_tokens) == case.expected, case.why


@dataclass(frozen=True)
class LookupCase:
    name: str
    why: str
    concurrency: float
    context_tokens: float
    cell: tuple[int, int]  # (ix, iy)
    itl_ms: float
    thpt_per_gpu: float


SMALL_LOOKUPS = [
    LookupCase("half-cache", "5 x 1000 tokens = 50% of 10000", 5, 1000, (1, 1), 100, 5000),
    LookupCase("full-cache", "10 x 1000 tokens = 100%", 10, 1000, (2, 1), 20, 9000),
    LookupCase("rounds-down", "7.4 x 1000 = 74% rounds to the 50% cell", 7.4, 1000, (1, 1), 100, 5000),
    LookupCase("rounds-up", "7.6 x 1000 = 76% rounds to the 100% cell", 7.6, 1000, (2, 1), 20, 9000),
    LookupCase("over-full", "more than the cache holds clips to the last cell", 100, 2000, (2, 2), 130, 7000),
    LookupCase("idle", "no requests: the KV-usage-0 cell", 0, 2000, (0, 2), 15, 200),
]


@pytest.mark.parametrize("case", SMALL_LOOKUPS, ids=lambda c: c.name)
def test_small_grid_lookup(case: LookupCase) -> None:
    assert SMALL_GRID.grid_index(case.concurrency, case.context_tokens) == case.cell, case.why
    assert SMALL_GRID.itl_ms(case.concurrency, case.context_tokens) == case.itl_ms
    assert SMALL_GRID.thpt_per_gpu(case.concurrency, case.context_tokens) == case.thpt_per_gpu


def test_cubic_scattered_interpolation_reproduces_a_plane() -> None:
    # Clough-Tocher (griddata "cubic") is exact on linear data inside the hull; below the lowest
    # measured context the nearest point fills in.
    kv, ctx = np.meshgrid([0, 0.25, 0.5, 0.75, 1], [1000, 2000, 3000, 4000])
    kv, ctx = kv.ravel(), ctx.ravel()
    data = decode_from_mapping(
        {
            "x_kv_usage": kv,
            "y_context_length": ctx,
            "z_itl": 5 + 40 * kv + 0.002 * ctx,
            "z_thpt_per_gpu": 1000 * kv,
            "max_kv_tokens": 100000,
        },
        path="plane",
    )
    grid = DecodeInterpolator(data, resolution=9)  # kv step 0.125, context step 500
    assert grid.itl_grid_ms[3, 3] == pytest.approx(5 + 40 * 0.375 + 0.002 * 1500, abs=1e-6)
    assert grid.itl_grid_ms[7, 5] == pytest.approx(5 + 40 * 0.625 + 0.002 * 3500, abs=1e-6)
    assert grid.itl_grid_ms[0, 8] == 47.0  # context 0, kv 1: nearest data point is (1, 1000)
    # ITL 40 ms at context 3000: 5 + 40 kv + 6 <= 40 -> kv <= 0.725 -> the 0.625 cell.
    best = grid.best_throughput_per_gpu(40, 3000)
    assert best.kv_usage == 0.625
    assert (best.itl_ms, best.thpt_per_gpu) == (pytest.approx(36, abs=1e-5), pytest.approx(625, abs=1e-5))


# --- decode on the H200 profile (the reference figures) -------------------------------------------

H200_BEST = [
    BestCase(
        "itl-50-context-3075",
        "the sanity scenario: ISL 3000 + OSL 150/2, ITL 50 ms; met at full KV usage",
        50,
        3075,
        DecodePoint(6794.772011902521, 41.70781893771626, 1.0),
    ),
    BestCase(
        "itl-10-context-3075",
        "a tight target stops at 15% KV usage",
        10,
        3075,
        DecodePoint(4679.638896044765, 9.740428116692607, 15 / 99),
    ),
    BestCase(
        "itl-1-context-3075",
        "nothing meets 1 ms: the KV-usage-0 cell",
        1,
        3075,
        DecodePoint(223.73375762472148, 4.427375, 0.0),
    ),
    BestCase(
        "itl-20-context-8000",
        "a longer context",
        20,
        8000,
        DecodePoint(2842.6318292868928, 19.99894910485894, 48 / 99),
    ),
    BestCase(
        "context-beyond-profile",
        "contexts past 13585 tokens use the last row",
        50,
        100000,
        DecodePoint(1758.2197145433702, 36.16897458208955, 1.0),
    ),
]


@pytest.mark.parametrize("case", H200_BEST, ids=lambda c: c.name)
def test_h200_best_decode_throughput(case: BestCase) -> None:
    got = MODEL.best_decode_throughput_per_gpu(case.itl_ms, case.context_tokens)
    assert got.thpt_per_gpu == pytest.approx(case.expected.thpt_per_gpu, rel=REL), case.why
    assert got.itl_ms == pytest.approx(case.expected.itl_ms, rel=REL), case.why
    assert got.kv_usage == pytest.approx(case.expected.kv_usage, rel=1e-12), case.why


H200_LOOKUPS = [
    LookupCase(
        "10-requests",
        "10 x 3075 / 945029 = 3.3% KV",
        10,
        3075,
        (3, 22),
        5.400129114222324,
        1153.5868177777322,
    ),
    LookupCase(
        "100-requests",
        "100 x 3075 / 945029 = 32.5% KV",
        100,
        3075,
        (32, 22),
        16.021360700026662,
        6064.492072588541,
    ),
    LookupCase(
        "1000-requests",
        "beyond the cache: the last cell",
        1000,
        3075,
        (99, 22),
        41.70781893771626,
        6794.772011902521,
    ),
]


@pytest.mark.parametrize("case", H200_LOOKUPS, ids=lambda c: c.name)
def test_h200_decode_lookup(case: LookupCase) -> None:
    assert MODEL.decode.grid_index(case.concurrency, case.context_tokens) == case.cell, case.why
    assert MODEL.decode_itl_ms(case.concurrency, case.context_tokens) == pytest.approx(case.itl_ms, rel=REL)
    assert MODEL.decode.thpt_per_gpu(case.concurrency, case.context_tokens) == pytest.approx(
        case.thpt_per_gpu, rel=REL
    )


def test_h200_grid_shape() -> None:
    decode = MODEL.decode
    assert decode.itl_grid_ms.shape == decode.thpt_grid_per_gpu.shape == (100, 100)
    assert (decode.context_axis[0], decode.context_axis[-1]) == (0.0, 13585.0)
    assert (decode.kv_usage_axis[0], decode.kv_usage_axis[-1]) == (0.0, 1.0)
    assert not np.isnan(decode.itl_grid_ms).any() and not np.isnan(decode.thpt_grid_per_gpu).any()
    assert decode.itl_grid_ms.flags.writeable is False


def test_collinear_decode_points_are_a_profile_error() -> None:
    # Every point at one context length: no triangle, so no 2-D interpolation.
    data = decode_from_mapping(
        {
            "x_kv_usage": [0.1, 0.5, 0.9],
            "y_context_length": [1000, 1000, 1000],
            "z_itl": [5, 10, 20],
            "z_thpt_per_gpu": [100, 200, 300],
            "max_kv_tokens": 1000,
        },
        path="flat.npz",
    )
    with pytest.raises(ProfileError) as caught:
        DecodeInterpolator(data)
    assert (caught.value.path, caught.value.key) == ("flat.npz", "z_itl")
    assert caught.value.reason.startswith("cannot interpolate over (x_kv_usage, y_context_length): ")


@pytest.mark.parametrize(
    ("concurrency", "context_tokens", "name"),
    [(float("nan"), 1000, "concurrency"), (1, float("inf"), "context_tokens")],
)
def test_decode_refuses_non_finite_lookups(concurrency: float, context_tokens: float, name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} must be finite"):
        SMALL_GRID.itl_ms(concurrency, context_tokens)
