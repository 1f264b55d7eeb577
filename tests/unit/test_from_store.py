"""`planner replay --from-store`'s pieces without a store: the workload rebuilt from tick
observations, the engine-hours of a schedule, the recorded policy."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import NamedTuple

import pytest

from app.core.types import TrafficObservation
from app.sim.replay import store_run
from app.sim.replay.from_store import (
    BURST_SPREAD_S,
    RecordedPolicy,
    StoredTick,
    burst_sizes,
    engine_seconds,
    requests_from_ticks,
)

HIST = ((256.0, 10.0), (512.0, 30.0), (math.inf, 0.0))


def tick(
    end_s: float, num_req: float | None, isl: float | None = 300.0, osl: float | None = 50.0
) -> StoredTick:
    return StoredTick(end_s, TrafficObservation(5.0, num_req, isl, osl, isl_buckets=HIST))


def stored_history(
    ticks: list[StoredTick],
    decisions: list[tuple[float, dict[str, int]]],
    initial: dict[str, int],
    *,
    end_s: float,
) -> store_run.History:
    """A window of the demo deployment as the store would give it."""
    return store_run.History(
        deployment="demo",
        start=datetime(2026, 1, 1, tzinfo=UTC),
        ticks=ticks,
        decisions=decisions,
        initial=initial,
        end_s=end_s,
        source={},
    )


class CountCase(NamedTuple):
    name: str
    ticks: list[StoredTick]
    per_tick: list[int]  # requests arriving within each tick's interval, counted by hand
    why: str


COUNT_CASES = [
    CountCase(
        "whole_counts",
        [tick(5, 3), tick(10, 0), tick(15, 7)],
        [3, 0, 7],
        "each tick's arrivals inside its own interval",
    ),
    CountCase(
        "fractions_carried",
        [tick(5, 0.5), tick(10, 0.5), tick(15, 0.5), tick(20, 0.5)],
        [0, 1, 0, 1],
        "0.5 a tick is one request every other tick, not zero (rounded) or four (ceiled)",
    ),
    CountCase(
        "unknown_count_skipped",
        [tick(5, None), tick(10, 2)],
        [0, 2],
        "an unknown count is no traffic we could rebuild, not zero carried",
    ),
    CountCase(
        "no_observation",
        [StoredTick(5, None), tick(10, 4)],
        [0, 4],
        "a tick without traffic (pruned, or the seed algorithm's) adds nothing",
    ),
]


@pytest.mark.parametrize("case", COUNT_CASES, ids=lambda c: c.name)
def test_requests_arrive_in_the_tick_that_counted_them(case: CountCase) -> None:
    requests = requests_from_ticks(case.ticks, seed=0)
    counted = [sum(1 for r in requests if t.end_s - 5.0 <= r.arrival_s <= t.end_s) for t in case.ticks]
    assert counted == case.per_tick, case.why
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)


class LengthCase(NamedTuple):
    name: str
    ticks: list[StoredTick]
    isl: float  # the mean the rebuilt requests must have
    osl: float
    why: str


LENGTH_CASES = [
    LengthCase("own_means", [tick(5, 400, isl=300, osl=50)], 300, 50, "the tick's stored means"),
    LengthCase(
        "long_prompts",
        [tick(5, 400, isl=480, osl=7)],
        480,
        7,
        "a mean near the histogram's top bucket is met by scaling, not by the buckets alone",
    ),
    LengthCase(
        "lengths_from_the_tick_before",
        [tick(5, 0, isl=200, osl=20), tick(10, 400, isl=None, osl=None)],
        200,
        20,
        "arrivals whose lengths no completion showed yet take the last known ones",
    ),
    LengthCase(
        "lengths_from_the_tick_after",
        [tick(5, 400, isl=None, osl=None), tick(10, 0, isl=250, osl=40)],
        250,
        40,
        "at the window's start, the first lengths known",
    ),
]


@pytest.mark.parametrize("case", LENGTH_CASES, ids=lambda c: c.name)
def test_the_rebuilt_lengths_have_the_stored_means(case: LengthCase) -> None:
    requests = requests_from_ticks(case.ticks, seed=3)
    assert len(requests) == 400
    isl = sum(r.isl_tokens for r in requests) / len(requests)
    osl = sum(r.osl_tokens for r in requests) / len(requests)
    # Whole tokens: each length rounded by at most half a token.
    assert abs(isl - case.isl) <= 0.5, case.why
    assert abs(osl - case.osl) <= 0.5, case.why
    assert min(r.osl_tokens for r in requests) >= 1


def test_isl_follows_the_histogram_shape() -> None:
    # 10 of 40 in (0, 256] and 30 in (256, 512]: uniform draws inside them average
    # (10 × 128 + 30 × 384) / 40 = 320, so a stored mean of 320 leaves the draws unscaled.
    requests = requests_from_ticks([tick(5, 4000, isl=320, osl=10)], seed=1)
    below = sum(1 for r in requests if r.isl_tokens <= 256) / len(requests)
    assert 0.22 <= below <= 0.28  # a quarter of the stored counts, within sampling noise
    assert max(r.isl_tokens for r in requests) <= 512 * 1.05  # no draw from the empty open bucket


class BurstCase(NamedTuple):
    name: str
    counts: list[float]
    sizes: int
    why: str


BURST_CASES = [
    BurstCase("steady", [100.0] * 9, 1, "counts that never vary: Poisson at most, one request at a time"),
    BurstCase(
        "alternating",
        [100.0, 120.0] * 4 + [100.0],
        4,
        "differences ±20: sigma 1.4826 × 20 = 29.65, Var ÷ mean = 879.3 ÷ 2 ÷ 108.9 = 4.04, so 4",
    ),
    BurstCase("too_few_ticks", [100.0, 140.0, 100.0], 1, "three ticks say nothing about burstiness"),
]


@pytest.mark.parametrize("case", BURST_CASES, ids=lambda c: c.name)
def test_burst_sizes_are_the_counts_dispersion(case: BurstCase) -> None:
    ticks = [tick(5.0 * (i + 1), n) for i, n in enumerate(case.counts)]
    assert burst_sizes(ticks) == [case.sizes] * len(ticks), case.why


def test_a_burst_arrives_together_as_distinct_requests() -> None:
    # Counts 10 and 40 by turns: differences of ±30, sigma 1.4826 × 30 = 44.5, Var ÷ mean =
    # 1978 ÷ 2 ÷ 23.3 = 42, so each tick's requests come as one burst of all of them.
    counts = [10.0, 40.0] * 4 + [10.0]
    ticks = [tick(5.0 * (i + 1), n) for i, n in enumerate(counts)]
    assert burst_sizes(ticks) == [42] * len(ticks)
    arrivals = sorted(r.arrival_s for r in requests_from_ticks(ticks, seed=0))
    # Arrivals more than a burst's width apart belong to different bursts.
    bursts: list[list[float]] = [[arrivals[0]]]
    for a in arrivals[1:]:
        if a - bursts[-1][0] > 2 * BURST_SPREAD_S:
            bursts.append([])
        bursts[-1].append(a)
    assert [len(b) for b in bursts] == [int(n) for n in counts], "one burst per tick, each within ±0.5 s"
    # Together in time, not copies of one request: each request draws its own lengths.
    requests = requests_from_ticks(ticks, seed=0)
    first = [r for r in requests if r.arrival_s <= bursts[0][-1]]
    assert len({(r.isl_tokens, r.osl_tokens) for r in first}) == len(first) == 10


def test_the_same_seed_rebuilds_the_same_workload() -> None:
    ticks = [tick(5.0 * (i + 1), 50.0 + i) for i in range(10)]
    assert requests_from_ticks(ticks, seed=7) == requests_from_ticks(ticks, seed=7)
    assert requests_from_ticks(ticks, seed=7) != requests_from_ticks(ticks, seed=8)


class HoursCase(NamedTuple):
    name: str
    start: dict[str, int]
    steps: list[tuple[float, dict[str, int]]]
    end_s: float
    expected: dict[str, float]
    why: str


HOURS_CASES = [
    HoursCase(
        "two_steps",
        {"prefill": 2, "decode": 1},
        [(10.0, {"prefill": 4}), (30.0, {"decode": 3})],
        40.0,
        {"prefill": 2 * 10 + 4 * 30, "decode": 1 * 30 + 3 * 10},
        "a step naming one role keeps the other's count",
    ),
    HoursCase(
        "step_after_the_end",
        {"prefill": 1, "decode": 1},
        [(50.0, {"prefill": 9, "decode": 9})],
        40.0,
        {"prefill": 40, "decode": 40},
        "a decision after the window costs nothing in it",
    ),
    HoursCase(
        "no_steps", {"prefill": 3, "decode": 2}, [], 10.0, {"prefill": 30, "decode": 20}, "the start held"
    ),
]


@pytest.mark.parametrize("case", HOURS_CASES, ids=lambda c: c.name)
def test_engine_seconds_of_a_schedule(case: HoursCase) -> None:
    assert engine_seconds(case.steps, start=case.start, end_s=case.end_s) == case.expected, case.why


class _Cluster:
    def __init__(self, targets: dict[str, int]) -> None:
        self.targets = targets


def test_recorded_policy_orders_each_decision_when_it_was_made() -> None:
    policy = RecordedPolicy(
        {"prefill": 2, "decode": 1},
        [(12.0, {"prefill": 3, "decode": 1}), (4.0, {"prefill": 2, "decode": 2}), (12.0, {"decode": 5})],
    )
    assert policy.initial() == {"prefill": 2, "decode": 1}
    assert policy.first_tick_s() == 4.0
    first = policy.tick(4.0, _Cluster({"prefill": 2, "decode": 1}))  # type: ignore[arg-type]
    assert first.target == {"prefill": 2, "decode": 2} and first.next_tick_s == 12.0
    # Both decisions made at 12 s, in the order they were taken: the later one wins.
    second = policy.tick(12.0, _Cluster({"prefill": 2, "decode": 2}))  # type: ignore[arg-type]
    assert second.target == {"prefill": 3, "decode": 5} and second.next_tick_s == math.inf


class WindowCase(NamedTuple):
    name: str
    counts: list[float | None]
    message: str | None  # None: the window is replayed
    why: str


WINDOW_CASES = [
    WindowCase("some_requests", [3.0, 4.0], None, "seven requests to replay"),
    WindowCase("less_than_one", [0.5, None], "observed no request", "half a request rebuilds none"),
    WindowCase(
        "too_many", [60.0, 50.0], "the window holds 110 requests, more than the 100", "memory is bounded"
    ),
]


@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: c.name)
def test_the_window_holds_one_to_max_requests(case: WindowCase, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.config import ConfigError

    monkeypatch.setattr(store_run, "MAX_REQUESTS", 100)
    ticks = [tick(5.0 * (i + 1), n) for i, n in enumerate(case.counts)]
    history = stored_history(ticks, [], {"prefill": 1, "decode": 1}, end_s=5.0 * len(case.counts))
    if case.message is None:
        store_run.check_window(history)
        return
    with pytest.raises(ConfigError, match=case.message):
        store_run.check_window(history)


class PeakCase(NamedTuple):
    name: str
    initial: dict[str, int]
    decisions: list[tuple[float, dict[str, int]]]
    peak: dict[str, int]
    why: str


PEAK_CASES = [
    PeakCase(
        "each_role_its_own_highest",
        {"prefill": 2, "decode": 2},
        [(10.0, {"prefill": 6, "decode": 3}), (70.0, {"prefill": 4, "decode": 5})],
        {"prefill": 6, "decode": 5},
        "the roles peak at different times; each keeps its own highest",
    ),
    PeakCase(
        "the_start_counts",
        {"prefill": 5, "decode": 9},
        [(30.0, {"prefill": 3, "decode": 4})],
        {"prefill": 5, "decode": 9},
        "what was in force when the window started was ordered too",
    ),
    PeakCase(
        "a_decision_naming_one_role",
        {"prefill": 1, "decode": 1},
        [(5.0, {"decode": 7})],
        {"prefill": 1, "decode": 7},
        "a decision that names one role leaves the other's peak alone",
    ),
]


@pytest.mark.parametrize("case", PEAK_CASES, ids=lambda c: c.name)
def test_peak_holds_the_highest_count_each_role_was_ordered(case: PeakCase) -> None:
    history = stored_history([tick(5.0, 10.0)], case.decisions, case.initial, end_s=100.0)
    assert store_run.peak_counts(history) == case.peak, case.why
