"""The benchmark's workloads beyond the two the planner was tuned on: each generator keeps the
pattern its docstring promises, the same seed gives the same requests, and the registry builds
every workload of the matrix (and `planner replay --workload` replays one by name)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from app.cli import main as planner_main
from app.core.traces import TraceRequest
from app.sim.workload import (
    AZURE_CONV,
    DATA_DIR,
    MAX_CONTEXT_TOKENS,
    MOONCAKE_SYNTHETIC,
    WORKLOADS,
    build_workload,
    bursty_gaps,
    diurnal,
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
