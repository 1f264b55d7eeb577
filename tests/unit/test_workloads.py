"""The benchmark's workloads beyond the two the planner was tuned on: each generator keeps the
pattern its docstring promises, the same seed gives the same requests, and the registry builds
every workload of the matrix (and `planner replay --workload` replays one by name)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from app.cli import main as planner_main
from app.config import ConfigError
from app.core.traces import TraceRequest
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
from app.sim.world.bursts import code_bursts, completion_lengths, traffic_stats
from app.sim.world.workload import (
    AZURE_CONV,
    DATA_DIR,
    MAX_CONTEXT_TOKENS,
    MOONCAKE_SYNTHETIC,
    WORKLOADS,
    build_workload,
    bursty_gaps,
    diurnal,
    expand_rate,
    flash_crowd,
    heavy_tail_output,
    long_prompt,
)
from app.sources.traces import load_trace

# A small stand-in for a real trace's lengths, where the lengths themselves are not the point.
LENGTHS = [TraceRequest(0.0, 1000, 100), TraceRequest(0.0, 2000, 200), TraceRequest(0.0, 500, 50)]


@pytest.fixture(scope="module")
def azure() -> list[TraceRequest]:
    return load_trace(DATA_DIR / AZURE_CONV)


@pytest.fixture(scope="module")
def mooncake_synthetic() -> list[TraceRequest]:
    return load_trace(DATA_DIR / MOONCAKE_SYNTHETIC)


def arrivals(requests: list[TraceRequest]) -> np.ndarray:
    return np.array([r.arrival_s for r in requests])


def per_second(requests: list[TraceRequest]) -> np.ndarray:
    """Arrivals counted in 1 s bins from 0 to the last arrival."""
    return np.bincount(arrivals(requests).astype(int))


def rate_rps(requests: list[TraceRequest], start_s: float, end_s: float) -> float:
    a = arrivals(requests)
    return float(((a >= start_s) & (a < end_s)).sum() / (end_s - start_s))


def test_bursty_gaps_is_silent_most_of_the_time_with_gaps_of_one_to_four_minutes() -> None:
    requests = bursty_gaps(seed=0)
    bins = per_second(requests)
    assert 20 * 60 <= len(bins) <= 40 * 60
    assert 0.5 <= (bins == 0).mean() <= 0.75  # silent about 60% of the time
    gaps = np.diff(arrivals(requests))
    idle = gaps[gaps > 30]
    assert len(idle) >= 5
    # Within a burst arrivals are milliseconds apart: an idle gap is the drawn gap, give or take.
    assert idle.min() >= 59.5 and idle.max() <= 240.5
    # Bursts of hundreds of requests per second, for tens of seconds.
    busy = bins[bins > 0]
    assert np.median(busy) >= 150 and busy.max() <= 550
    starts = np.concatenate([[0.0], arrivals(requests)[1:][gaps > 30]])
    ends = np.concatenate([arrivals(requests)[:-1][gaps > 30], [arrivals(requests)[-1]]])
    lasted = (ends - starts)[:-1]  # the last burst is cut off at the end of the run
    assert (lasted >= 15).all() and (lasted <= 121).all()
    # Code completion: short prompts and very short outputs.
    isl = np.array([r.isl_tokens for r in requests])
    osl = np.array([r.osl_tokens for r in requests])
    assert 1000 <= np.median(isl) <= 2000 and isl.max() <= 8192
    assert 10 <= np.median(osl) <= 50 and osl.max() <= 512


def test_flash_crowd_jumps_tenfold_within_30_s_and_stays_for_minutes() -> None:
    requests = flash_crowd(LENGTHS, seed=0)
    base = rate_rps(requests, 0, 600)
    assert base == pytest.approx(40, rel=0.05)
    # 10x within 30 s of the jump's start, at 600 s.
    assert rate_rps(requests, 620, 630) / rate_rps(requests, 540, 600) == pytest.approx(10, rel=0.15)
    assert rate_rps(requests, 590, 600) < 60  # no warning before it
    # Several minutes high, then back down.
    assert rate_rps(requests, 630, 920) / base == pytest.approx(10, rel=0.05)
    assert rate_rps(requests, 1500, 1800) < 1.5 * base
    assert {(r.isl_tokens, r.osl_tokens) for r in requests} == {(1000, 100), (2000, 200), (500, 50)}


def test_diurnal_is_a_smooth_day_with_a_ninefold_swing() -> None:
    requests = diurnal(LENGTHS, seed=0)
    assert 20 * 60 <= arrivals(requests)[-1] <= 40 * 60
    minutes = np.bincount((arrivals(requests) // 60).astype(int)) / 60.0
    assert len(minutes) == 30
    assert minutes[0] == pytest.approx(30, rel=0.2)  # the night
    assert minutes[14:16].mean() == pytest.approx(270, rel=0.05)  # the afternoon, half-way
    assert minutes[-1] == pytest.approx(30, rel=0.25)
    # Smooth: no minute differs from the next by more than a sixth of the peak.
    assert np.abs(np.diff(minutes)).max() < 45
    assert np.argmax(np.convolve(minutes, np.ones(5) / 5, "valid")) in range(10, 16)


def test_long_prompt_has_a_mean_above_10k_and_a_p99_near_90k(mooncake_synthetic) -> None:
    requests = long_prompt(mooncake_synthetic, seed=0)
    isl = np.array([r.isl_tokens for r in requests])
    assert isl.mean() > 10_000
    assert 70_000 <= np.percentile(isl, 99) <= 110_000
    assert max(r.isl_tokens + r.osl_tokens for r in requests) <= MAX_CONTEXT_TOKENS
    # A moderate rate: 8 to 16 req/s over 30 minutes.
    assert 20 * 60 <= arrivals(requests)[-1] <= 40 * 60
    assert 10 <= len(requests) / arrivals(requests)[-1] <= 14
    assert rate_rps(requests, 0, 120) < rate_rps(requests, 840, 960)


def test_heavy_tail_output_has_a_p99_of_thousands_at_azure_prompt_lengths(azure) -> None:
    requests = heavy_tail_output(azure, seed=0)
    osl = np.array([r.osl_tokens for r in requests])
    isl = np.array([r.isl_tokens for r in requests])
    assert np.median(osl) == pytest.approx(180, rel=0.1)
    assert 2_000 <= np.percentile(osl, 99) <= 8_000
    assert osl.max() <= 16_384
    assert np.percentile(osl, 99) / np.median(osl) > 10  # the heavy tail
    azure_isl = np.array([r.isl_tokens for r in azure])
    assert isl.mean() == pytest.approx(azure_isl.mean(), rel=0.05)
    assert 20 * 60 <= arrivals(requests)[-1] <= 40 * 60


GENERATORS: dict[str, Callable[[int], list[TraceRequest]]] = {
    "bursty_gaps": lambda seed: bursty_gaps(duration_s=600, burst_rps=(20.0, 50.0), seed=seed),
    "flash_crowd": lambda seed: flash_crowd(
        LENGTHS, base_rps=4, jump_at_s=60, hold_s=60, duration_s=300, seed=seed
    ),
    "diurnal": lambda seed: diurnal(LENGTHS, trough_rps=3, peak_rps=27, duration_s=300, seed=seed),
    "long_prompt": lambda seed: long_prompt(LENGTHS, duration_s=300, seed=seed),
    "heavy_tail_output": lambda seed: heavy_tail_output(
        LENGTHS, low_rps=5, high_rps=11, duration_s=300, seed=seed
    ),
    "code_bursts": lambda seed: code_bursts(duration_s=600, seed=seed),
}


@pytest.mark.parametrize("name", GENERATORS)
def test_the_same_seed_gives_the_same_requests_sorted_by_arrival(name: str) -> None:
    generate = GENERATORS[name]
    first = generate(0)
    assert first == generate(0)
    assert first != generate(1)
    assert len(first) > 100
    assert [r.arrival_s for r in first] == sorted(r.arrival_s for r in first)
    assert all(r.arrival_s >= 0 and r.isl_tokens >= 1 and r.osl_tokens >= 1 for r in first)


def test_the_registry_names_every_workload_of_the_matrix() -> None:
    assert list(WORKLOADS) == [
        "azure-conv-x30",
        "servegen-day1",
        "mooncake-arxiv",
        "bursty-gaps",
        "flash-crowd",
        "diurnal",
        "long-prompt",
        "heavy-tail-output",
        "code-bursts-clustered",
        "code-bursts-spread",
        "code-bursts-clustered-s1",
        "code-bursts-spread-s1",
    ]


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_each_workload_builds_from_the_bundled_traces(name: str) -> None:
    requests = build_workload(name)  # determinism: the generators' test above
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
    end_s = requests[-1].arrival_s
    if name in ("azure-conv-x30", "servegen-day1"):
        assert 3400 <= end_s <= 3600  # the tuned-on hours, as they were
    elif name == "mooncake-arxiv":
        assert len(requests) == 2000 and 170 <= end_s <= 180  # real timing, at 2x
    else:
        assert 20 * 60 <= end_s <= 40 * 60


def test_an_unknown_workload_is_refused_with_the_names() -> None:
    with pytest.raises(ValueError, match=r"unknown workload 'nope' \(choose from azure-conv-x30, "):
        build_workload("nope")


def test_replay_takes_a_workload_by_name(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    code = planner_main(["replay", "--workload", "mooncake-arxiv", "--policy", "static", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == 2000
    # The workload is written next to the outputs: --trace on it repeats the run (times are
    # relative to the first request, as in any trace file).
    written, built = load_trace(out / "mooncake-arxiv.jsonl"), build_workload("mooncake-arxiv")
    assert [(r.isl_tokens, r.osl_tokens) for r in written] == [(r.isl_tokens, r.osl_tokens) for r in built]
    origin = built[0].arrival_s
    assert arrivals(written) == pytest.approx(arrivals(built) - origin, abs=1e-9)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "nope"], "--workload: unknown workload 'nope' (choose from azure-conv-x30, "),
        (["--workload", "diurnal", "--trace", "x.jsonl"], "not allowed with argument"),
        ([], "one of the arguments --trace --workload is required"),
    ],
)
def test_a_bad_workload_flag_is_one_line(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    try:
        code = planner_main(["replay", *args, "--out", str(tmp_path / "out")])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("planner: error: ")
    assert message in lines[0]


# --- Copies of a request: within ±spread_s of it ---------------------------------------------------

TWO = [TraceRequest(0.2, 100, 10), TraceRequest(5.0, 200, 20)]


@pytest.mark.parametrize("spread_s", [0.0, 0.5, 30.0])
def test_each_copy_lands_within_the_spread_of_its_request(spread_s: float) -> None:
    trace = [TraceRequest(40.0, 100, 10), TraceRequest(100.0, 200, 20), TraceRequest(10.0, 300, 30)]
    out = expand_rate(trace, 20, seed=3, spread_s=spread_s)
    assert len(out) == 60
    for source in trace:
        copies = arrivals([r for r in out if r.isl_tokens == source.isl_tokens])
        assert len(copies) == 20
        assert (copies >= max(0.0, source.arrival_s - spread_s)).all()
        assert (copies <= source.arrival_s + spread_s).all()
        if spread_s:  # spread over the window, not bunched at its centre
            assert copies.max() - copies.min() > spread_s
    assert [r.arrival_s for r in out] == sorted(r.arrival_s for r in out)


def test_the_default_spread_is_half_a_second_and_gives_the_same_requests_as_before() -> None:
    default = expand_rate(TWO, 2.5, seed=7)
    assert default == expand_rate(TWO, 2.5, seed=7, spread_s=0.5)
    # Pinned: what expand_rate gave before the spread was a parameter.
    assert [r.arrival_s for r in default] == pytest.approx([0.0, 0.0, 0.350934, 4.557999, 4.865689], abs=1e-6)
    assert expand_rate(TWO, 3, seed=1, spread_s=0) == [TWO[0]] * 3 + [TWO[1]] * 3


@pytest.mark.parametrize("spread_s", [-0.1, float("nan"), float("inf"), float("-inf")])
def test_a_bad_spread_is_refused(spread_s: float) -> None:
    with pytest.raises(ValueError, match=r"rate spread must be a finite number of seconds >= 0"):
        expand_rate(TWO, 2, seed=0, spread_s=spread_s)


def test_the_replay_takes_the_spread_from_the_flag_or_the_file(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "three.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": t * 1000.0, "input_length": 1000, "output_length": 20}) + "\n"
            for t in (0, 100, 200)
        )
    )
    out = tmp_path / "out"
    args = ["--trace", str(trace), "--policy", "static", "--rate-scale", "10", "--rate-spread-s", "30"]
    assert planner_main(["replay", *args, "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    served = np.loadtxt(out / "requests.csv.gz", delimiter=",", skiprows=1, usecols=1)
    middle = served[(served > 50) & (served < 150)]
    assert len(served) == 30 and len(middle) == 10
    assert 70 <= middle.min() and middle.max() <= 130 and middle.max() - middle.min() > 1
    config = load_replay_config(DEFAULT_REPLAY_CONFIG)
    assert config.simulation.rate_spread_s == 0.5
    assert with_overrides(config, rate_spread_s=30).simulation.rate_spread_s == 30
    assert with_overrides(config).simulation.rate_spread_s == 0.5


def test_a_bad_spread_in_the_replay_file_names_the_field(tmp_path: Path) -> None:
    raw = DEFAULT_REPLAY_CONFIG.read_text().replace("rate_spread_s: 0.5", "rate_spread_s: -1", 1)
    assert "rate_spread_s: -1" in raw
    path = tmp_path / "replay.yaml"
    path.write_text(raw.replace("../data/", str(DEFAULT_REPLAY_CONFIG.parents[1] / "data") + "/"))
    with pytest.raises(
        ConfigError, match=r"simulation\.rate_spread_s: Input should be greater than or equal"
    ):
        load_replay_config(path)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("-1", "a negative half-width is no window"),
        ("x", "not a number"),
        ("nan", "not a finite number"),
        ("inf", "not a finite number"),
        ("1e6", "beyond a day, like the other durations' bound"),
    ],
)
def test_a_bad_rate_spread_flag_is_one_line(tmp_path: Path, capsys, value: str, why: str) -> None:
    try:
        code = planner_main(
            ["replay", "--workload", "diurnal", "--rate-spread-s", value, "--out", str(tmp_path)]
        )
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2, why
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"planner: error: argument --rate-spread-s: must be a number >= 0 and <= 86400, got {value!r}"
    ], why


# --- Code completion: bursts out of silence ---------------------------------------------------------


@dataclass(frozen=True)
class StatsCase:
    name: str
    why: str
    requests: list[TraceRequest]
    duration_s: float
    expected: dict[str, float]


STATS_CASES = [
    StatsCase(
        "three_minutes",
        "minutes of 3, 1 and 2 requests; two gaps of a minute; lengths 100..600 and 1..6",
        [TraceRequest(t, 100 * (i + 1), i + 1) for i, t in enumerate([0.0, 1.0, 2.0, 65.0, 130.0, 131.0])],
        180.0,
        {
            "requests": 6,
            "rate_rps": 6 / 180,
            "minute_mean": 2,
            "minute_max": 3,
            "minute_cv": (2 / 3) ** 0.5 / 2,
            "minute_empty": 0,
            "minute_empty_share": 0,
            # 10 s windows: 3 in the first, 1 in the 7th, 2 in the 14th, 15 of 18 empty.
            "window10s_mean": 1 / 3,
            "window10s_max": 3,
            "window10s_cv": 6**0.5,
            "window10s_empty": 15,
            "window10s_empty_share": 15 / 18,
            # Rises 1/3 and 2/1: the 90th percentile interpolates between them.
            "rise_p90": 1 / 3 + 0.9 * (2 - 1 / 3),
            "gaps_30s": 2,
            "longest_gap_s": 65,
            "isl_mean": 350,
            "isl_p50": 350,
            "osl_mean": 3.5,
            "osl_p50": 3.5,
        },
    ),
    StatsCase(
        "silent_minutes",
        "two empty minutes between two requests: no rise out of an empty minute, one 190 s gap",
        [TraceRequest(10.0, 1, 1), TraceRequest(200.0, 1, 1)],
        240.0,
        {
            "minute_empty": 2,
            "minute_empty_share": 0.5,
            "minute_max": 1,
            "rise_p90": 0,
            "gaps_30s": 1,
            "longest_gap_s": 190,
        },
    ),
    StatsCase(
        "partial_last_minute",
        "90 s: one whole minute and nine 10 s windows; the request at 100 s counts in the gaps only",
        [TraceRequest(5.0, 1, 1), TraceRequest(70.0, 1, 1), TraceRequest(100.0, 1, 1)],
        90.0,
        {
            "minute_mean": 1,
            "minute_cv": 0,
            "rise_p90": 0,
            "window10s_empty": 7,
            "gaps_30s": 2,
            "longest_gap_s": 65,
            "rate_rps": 3 / 90,
        },
    ),
    StatsCase(
        "no_request",
        "an empty minute: zeros, not a division by zero",
        [],
        60.0,
        {
            "requests": 0,
            "minute_mean": 0,
            "minute_cv": 0,
            "minute_empty": 1,
            "window10s_empty": 6,
            "rise_p90": 0,
            "gaps_30s": 0,
            "longest_gap_s": 0,
            "isl_mean": 0,
        },
    ),
]


@pytest.mark.parametrize("case", STATS_CASES, ids=lambda c: c.name)
def test_traffic_stats_counts_known_requests(case: StatsCase) -> None:
    stats = traffic_stats(case.requests, case.duration_s)
    for key, value in case.expected.items():
        assert stats[key] == pytest.approx(value), f"{case.why}: {key}"


def test_traffic_stats_needs_a_whole_minute() -> None:
    with pytest.raises(ValueError, match="at least a minute"):
        traffic_stats([], 59.0)


# The real code-completion trace at its own rate (58 minutes), and the range `code_bursts` is held
# to at 1x over the same 58 minutes. The ranges are about the 10th to 90th percentiles of 40 seeds
# (seeds 0 and 1 are tested): a 58-minute draw of bursty traffic varies, most of all the rise
# (5x to 65x from seed to seed: it rests on a handful of minutes).
REAL_TRACE_S = 58 * 60
REAL_TRACE = {
    "rate_rps": (2.53, 2.0, 3.1),
    "minute_max": (632, 400, 1000),
    "minute_cv": (1.03, 0.8, 1.4),
    "minute_empty": (12, 3, 20),
    "window10s_cv": (1.67, 1.4, 2.2),
    "window10s_empty_share": (0.56, 0.45, 0.7),
    "gaps_30s": (24, 18, 36),
    "longest_gap_s": (210, 100, 240),
    "rise_p90": (23, 10, math.inf),
}
# Lengths: within 15% of the trace's (one lognormal cannot match a median, a mean and a p99 at once).
REAL_LENGTHS = {
    "isl_p50": 1469,
    "isl_mean": 2048,
    "isl_p99": 7436,
    "osl_p50": 13,
    "osl_mean": 28,
    "osl_p99": 252,
}


@pytest.mark.parametrize("seed", [0, 1])
def test_code_bursts_has_the_real_traces_statistics(seed: int) -> None:
    stats = traffic_stats(code_bursts(duration_s=REAL_TRACE_S, seed=seed), REAL_TRACE_S)
    for key, (real, low, high) in REAL_TRACE.items():
        assert low <= stats[key] <= high, f"{key}: {stats[key]:.3g}, the real trace's {real}"
    for key, real in REAL_LENGTHS.items():
        assert stats[key] == pytest.approx(real, rel=0.15), key


def test_code_bursts_starts_bursts_out_of_silence_at_full_rate() -> None:
    requests = code_bursts(seed=0)
    a = arrivals(requests)
    assert a[0] >= 2  # a gap first
    seconds = np.bincount(a.astype(int))
    # Burst onsets: a second with 5+ requests after 10 s with at most one.
    onsets = [s for s in range(10, len(seconds)) if seconds[s] >= 5 and seconds[s - 10 : s].sum() <= 1]
    assert len(onsets) >= 10  # many times in half an hour


def test_completion_lengths_are_clipped() -> None:
    rng = random.Random(0)
    pairs = np.array([completion_lengths(rng) for _ in range(20_000)])
    assert pairs[:, 0].min() >= 16 and pairs[:, 0].max() <= 8192
    assert pairs[:, 1].min() >= 1 and pairs[:, 1].max() <= 1024


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"duration_s": 0}, "duration"),
        ({"duration_s": float("inf")}, "duration"),
        ({"short_gap_s": (0.0, 30.0)}, "gaps"),
        ({"max_gap_s": 20.0}, "gaps"),
        ({"long_gap_share": 1.5}, "share"),
        ({"rate_median_rps": 0}, "positive"),
    ],
)
def test_code_bursts_refuses_bad_parameters(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        code_bursts(**kwargs)


@pytest.mark.parametrize("seed", [0, 1])
def test_code_bursts_at_20x_clustered_or_spread(seed: int) -> None:
    suffix = "-s1" if seed else ""
    base = code_bursts(duration_s=1800, seed=seed)
    clustered = build_workload(f"code-bursts-clustered{suffix}")
    spread = build_workload(f"code-bursts-spread{suffix}")
    assert len(clustered) == len(spread) == 20 * len(base)
    assert 60_000 <= len(clustered) <= 120_000
    lengths = sorted((r.isl_tokens, r.osl_tokens) for r in base for _ in range(20))
    assert sorted((r.isl_tokens, r.osl_tokens) for r in spread) == lengths
    # The same minutes, within the 30 s the copies move.
    assert abs(rate_rps(clustered, 0, 1800) - rate_rps(spread, 0, 1800)) < 0.05 * rate_rps(clustered, 0, 1800)
    # Clustered copies keep the silence and make one-second bursts of 20; spread ones fill the
    # short gaps and smooth the seconds.
    tight, wide = traffic_stats(clustered, 1800), traffic_stats(spread, 1800)
    assert tight["window10s_empty_share"] >= 0.4 and wide["window10s_empty_share"] <= 0.25
    assert tight["gaps_30s"] >= 10 > wide["gaps_30s"]
    assert np.percentile(per_second(clustered), 99) > 1.5 * np.percentile(per_second(spread), 99)
