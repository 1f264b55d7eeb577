"""The clairvoyant oracle: r* per interval (prefill simulated, decode by Little's law) and the
cheapest schedule over level sets with a start-up delay.

Schedules are checked against timelines worked out by hand in the comments; r* against tiny
traces whose answer follows from the truth model's own figures (asserted first, so a change in
the profile shows up as a broken premise, not a puzzling failure). The prefill answer is also
checked in the real discrete-event cluster: r* engines meet the target there, r* - 1 do not.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from app.core.perf.interpolation import PerfModel
from app.core.traces import TraceRequest
from app.sim.replay.oracle import (
    OracleSchedule,
    combine,
    decode_capacity,
    oracle_plan,
    oracle_schedule,
    required_engines,
)
from app.sim.world.cluster import Cluster
from app.sim.world.truth import TruthModel
from app.sources.profile_files import load_profile

REPO_ROOT = Path(__file__).resolve().parents[3]
H200 = REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"


@pytest.fixture(scope="module")
def truth() -> TruthModel:
    return TruthModel(PerfModel.from_profile(load_profile(H200)), scale=1.0, max_num_batched_tokens=8192)


def _integral_hours(schedule: OracleSchedule) -> float:
    """∫ count dt over [0, horizon] from the steps, in engine-hours (independent of the module)."""
    times = [t for t, _ in schedule.steps] + [schedule.horizon_s]
    return sum(count * (times[i + 1] - times[i]) for i, (_, count) in enumerate(schedule.steps)) / 3600


# --- oracle_schedule ---------------------------------------------------------------------------


def test_flat_demand_is_one_step_from_zero() -> None:
    # [2, 2, 2] over 60 s intervals: both engines needed at 0, so there from 0 (no lead time
    # before 0), kept to the horizon 180 s: 2 × 180 engine-seconds.
    s = oracle_schedule([2, 2, 2], interval_s=60, startup_delay_s=30)
    assert s.steps == [(0.0, 2)]
    assert s.initial == 2
    assert s.horizon_s == 180
    assert s.gpu_hours == pytest.approx(2 * 180 / 3600)


def test_step_up_is_ordered_one_delay_ahead() -> None:
    # [1, 1, 3, 3]: the 2 extra engines serve from 120 s, so they are ordered at 120 - 30 = 90 s
    # and billed from there to the horizon 240 s: 1 × 90 + 3 × 150 = 540 engine-seconds.
    s = oracle_schedule([1, 1, 3, 3], interval_s=60, startup_delay_s=30)
    assert s.steps == [(0.0, 1), (90.0, 3)]
    assert s.gpu_hours == pytest.approx(540 / 3600)
    assert [s.count_at(t) for t in (0, 89.9, 90, 239.9, 240, 1e6)] == [1, 1, 3, 3, 3, 3]
    assert s.count_at(-5) == 1  # before 0: the initial count


def test_short_gap_is_bridged() -> None:
    # [1, 0, 1], delay 120: the idle gap [60, 120) is 60 s < 120 s, so the engine stays on
    # (60 s billed) rather than being restarted (120 s billed): 180 engine-seconds.
    s = oracle_schedule([1, 0, 1], interval_s=60, startup_delay_s=120)
    assert s.steps == [(0.0, 1)]
    assert s.gpu_hours == pytest.approx(180 / 3600)


def test_long_gap_is_a_restart() -> None:
    # [1, 0, 1], delay 30: the gap is 60 s ≥ 30 s, so off at 60 and ordered again at
    # 120 - 30 = 90: 60 + 90 = 150 engine-seconds.
    s = oracle_schedule([1, 0, 1], interval_s=60, startup_delay_s=30)
    assert s.steps == [(0.0, 1), (60.0, 0), (90.0, 1)]
    assert s.gpu_hours == pytest.approx(150 / 3600)
    assert [s.count_at(t) for t in (59.9, 60, 89.9, 90)] == [1, 0, 0, 1]


def test_gap_equal_to_the_delay_costs_the_same_either_way() -> None:
    # Gap 60 s, delay 60 s: the restart is ordered at 120 - 60 = 60, the instant of the drop, so
    # the engine count never changes: 180 engine-seconds, as bridging would cost.
    s = oracle_schedule([1, 0, 1], interval_s=60, startup_delay_s=60)
    assert s.steps == [(0.0, 1)]
    assert s.gpu_hours == pytest.approx(180 / 3600)
    # Same with times that are not exact in binary: interval 0.1 s, delay 0.1 s.
    s = oracle_schedule([1, 0, 1], interval_s=0.1, startup_delay_s=0.1)
    assert s.steps == [(0.0, 1)]


def test_levels_decide_their_gaps_independently() -> None:
    # [3, 1, 0, 2, 3], interval 60, delay 90, horizon 300:
    # - level 1: busy [0, 120) and [180, 300), gap 60 < 90: bridged, on [0, 300);
    # - level 2: busy [0, 60) and [180, 300), gap 120 ≥ 90: off at 60, ordered at 180 - 90 = 90;
    # - level 3: busy [0, 60) and [240, 300), gap 180 ≥ 90: off at 60, ordered at 240 - 90 = 150.
    # Counts: 3 on [0, 60), 1 on [60, 90), 2 on [90, 150), 3 on [150, 300):
    # 180 + 30 + 120 + 450 = 780 engine-seconds.
    s = oracle_schedule([3, 1, 0, 2, 3], interval_s=60, startup_delay_s=90)
    assert s.steps == [(0.0, 3), (60.0, 1), (90.0, 2), (150.0, 3)]
    assert s.gpu_hours == pytest.approx(780 / 3600)


def test_drop_before_the_horizon_and_gpus_per_engine() -> None:
    # [2, 1, 0], delay 30: level 2 off at 60, level 1 off at 120, nothing after:
    # 2 × 60 + 1 × 60 = 180 engine-seconds, × 4 GPUs each.
    s = oracle_schedule([2, 1, 0], interval_s=60, startup_delay_s=30, gpus_per_engine=4)
    assert s.steps == [(0.0, 2), (60.0, 1), (120.0, 0)]
    assert s.gpu_hours == pytest.approx(4 * 180 / 3600)


def test_lead_time_is_clipped_at_zero() -> None:
    # [0, 2] with delay 120: ordering at 60 - 120 = -60 is impossible; the engines are there
    # from 0 and billed from 0: 2 × 120 engine-seconds.
    s = oracle_schedule([0, 2], interval_s=60, startup_delay_s=120)
    assert s.steps == [(0.0, 2)]
    assert s.initial == 2
    assert s.gpu_hours == pytest.approx(240 / 3600)
    # [0, 0, 1] with delay 30: ordered at 120 - 30 = 90; 90 engine-seconds.
    s = oracle_schedule([0, 0, 1], interval_s=60, startup_delay_s=30)
    assert s.steps == [(0.0, 0), (90.0, 1)]
    assert s.initial == 0
    assert s.gpu_hours == pytest.approx(90 / 3600)


def test_zero_delay_follows_demand_exactly() -> None:
    s = oracle_schedule([1, 3, 0, 2], interval_s=10, startup_delay_s=0)
    assert s.steps == [(0.0, 1), (10.0, 3), (20.0, 0), (30.0, 2)]
    assert s.gpu_hours == pytest.approx((10 + 30 + 0 + 20) / 3600)


def test_all_zero_and_empty_demand() -> None:
    s = oracle_schedule([0, 0, 0], interval_s=60, startup_delay_s=30)
    assert (s.steps, s.initial, s.gpu_hours, s.horizon_s) == ([(0.0, 0)], 0, 0.0, 180)
    s = oracle_schedule([], interval_s=60, startup_delay_s=30)
    assert (s.steps, s.initial, s.gpu_hours, s.horizon_s) == ([(0.0, 0)], 0, 0.0, 0)
    assert s.count_at(100) == 0


def test_schedule_matches_its_own_integral_on_a_random_demand() -> None:
    # No two consecutive equal counts, time-sorted, never below the demand once the delay has
    # passed, and gpu_hours equal to the step integral.
    rng = random.Random(7)
    demand = [rng.choice([0, 0, 1, 2, 3, 5, 8]) for _ in range(200)]
    s = oracle_schedule(demand, interval_s=30, startup_delay_s=75)
    times = [t for t, _ in s.steps]
    counts = [c for _, c in s.steps]
    assert times == sorted(set(times)) and times[0] == 0.0
    assert all(a != b for a, b in zip(counts, counts[1:], strict=False))
    for k, d in enumerate(demand):
        assert s.count_at(k * 30) >= d and s.count_at(k * 30 + 29.9) >= d
    assert s.gpu_hours == pytest.approx(_integral_hours(s))


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"demand": [1, -1], "interval_s": 60, "startup_delay_s": 30}, "demand"),
        ({"demand": [1.5], "interval_s": 60, "startup_delay_s": 30}, "demand"),
        ({"demand": [1], "interval_s": 0, "startup_delay_s": 30}, "interval_s"),
        ({"demand": [1], "interval_s": -60, "startup_delay_s": 30}, "interval_s"),
        ({"demand": [1], "interval_s": math.inf, "startup_delay_s": 30}, "interval_s"),
        ({"demand": [1], "interval_s": 60, "startup_delay_s": -1}, "startup_delay_s"),
        ({"demand": [1], "interval_s": 60, "startup_delay_s": 30, "gpus_per_engine": 0}, "gpus_per_engine"),
    ],
)
def test_schedule_rejects_bad_arguments(kwargs: dict, argument: str) -> None:
    demand = kwargs.pop("demand")
    with pytest.raises(ValueError, match=argument):
        oracle_schedule(demand, **kwargs)


# --- required_engines --------------------------------------------------------------------------

TARGETS = {"interval_s": 60.0, "ttft_target_ms": 1000.0, "itl_target_ms": 30.0}


def test_one_small_request_per_interval_needs_one_engine_each(truth: TruthModel) -> None:
    # A 1,000-token prompt alone takes well under the 1 s TTFT target, and 99 further tokens at
    # batch 1 well under the 30 ms ITL target: one engine of each role per interval.
    assert truth.prefill_request_s(1000) < 1.0
    assert truth.decode_iteration_s(1050, 1) * 1000 < 30
    requests = [TraceRequest(t, 1000, 100) for t in (0.0, 60.0, 125.0)]
    assert required_engines(requests, truth, **TARGETS) == {"prefill": [1, 1, 1], "decode": [1, 1, 1]}


def test_interval_without_requests_needs_none(truth: TruthModel) -> None:
    # Arrivals at 0 and 130 s: interval [60, 120) is empty, and the first request's decoding
    # (9 × 30 ms) is long over by then.
    requests = [TraceRequest(0.0, 500, 10), TraceRequest(130.0, 500, 10)]
    assert required_engines(requests, truth, **TARGETS) == {"prefill": [1, 0, 1], "decode": [1, 0, 1]}


def test_no_requests(truth: TruthModel) -> None:
    assert required_engines([], truth, **TARGETS) == {"prefill": [], "decode": []}


def test_one_token_outputs_do_not_decode(truth: TruthModel) -> None:
    requests = [TraceRequest(float(t), 800, 1) for t in range(5)]
    assert required_engines(requests, truth, **TARGETS) == {"prefill": [1], "decode": [0]}


@pytest.mark.parametrize("quantile", [0.99, 1.0])
def test_burst_of_long_prompts_needs_two_prefill_engines(truth: TruthModel, quantile: float) -> None:
    # Ten 8,192-token prompts at once: each is exactly one full chunk, one iteration of
    # `per_s` ≈ 0.17 s. On one engine the i-th is done at i × per_s, the last two at 9 and
    # 10 × per_s, both past 1 s, so the p99 (between them) and the max miss the target. On two,
    # routing alternates (5 prompts each) and the last is done at 5 × per_s < 1 s.
    per_s = truth.prefill_request_s(8192)
    assert 9 * per_s > 1.0 and 5 * per_s <= 1.0
    requests = [TraceRequest(0.0, 8192, 2) for _ in range(10)]
    assert required_engines(requests, truth, **TARGETS, quantile=quantile)["prefill"] == [2]


def test_burst_needing_more_engines(truth: TruthModel) -> None:
    # Thirty 8,192-token prompts at once with every TTFT within 0.5 s: an engine finishes at
    # most floor(0.5 / per_s) = 2 of them in time, so 15 engines (round-robin: 2 each).
    per_s = truth.prefill_request_s(8192)
    assert 2 * per_s <= 0.5 < 3 * per_s
    requests = [TraceRequest(0.0, 8192, 2) for _ in range(30)]
    result = required_engines(requests, truth, **{**TARGETS, "ttft_target_ms": 500.0}, quantile=1.0)
    assert result["prefill"] == [15]


def test_low_quantile_needs_fewer_engines_than_the_throughput_guess(truth: TruthModel) -> None:
    # 100 full-chunk prompts at once, only the 20th percentile within 1 s. On c engines
    # (round-robin) the sorted TTFTs are c × per_s, c × 2·per_s, ...; the linear quantile sits at
    # index 0.2 × 99 = 19.8: with 4 engines x19 = 5·per_s, x20 = 6·per_s, so
    # 5.8·per_s ≈ 0.99 s passes; with 3, x19 = x20 = 7·per_s fails. The search starts above
    # (all 100 within 2 s would need ceil(100·per_s / 2) = 9) and must come down to 4.
    per_s = truth.prefill_request_s(8192)
    assert 5.8 * per_s <= 1.0 < 7 * per_s
    assert math.ceil(100 * per_s / 2) > 5
    requests = [TraceRequest(0.0, 8192, 2) for _ in range(100)]
    assert required_engines(requests, truth, **TARGETS, quantile=0.2)["prefill"] == [4]


def test_unreachable_ttft_target_gives_one_engine_per_prompt_at_most(truth: TruthModel) -> None:
    # A 14,000-token prompt alone takes about 0.29 s: a 100 ms target cannot be met at all. The
    # oracle aims at the best achievable instead: alone on an engine. One prompt: one engine;
    # two at once: two engines (on one, the second would wait for the first); two a second
    # apart: one engine, as the first is done (0.29 s) before the second arrives.
    assert 0.1 < truth.prefill_request_s(14000) < 1.0
    targets = {**TARGETS, "ttft_target_ms": 100.0}
    assert required_engines([TraceRequest(0.0, 14000, 2)], truth, **targets)["prefill"] == [1]
    two = [TraceRequest(0.0, 14000, 2), TraceRequest(0.0, 14000, 2)]
    assert required_engines(two, truth, **targets, quantile=1.0)["prefill"] == [2]
    apart = [TraceRequest(0.0, 14000, 2), TraceRequest(1.0, 14000, 2)]
    assert required_engines(apart, truth, **targets, quantile=1.0)["prefill"] == [1]


def test_prefill_answer_holds_in_the_cluster(truth: TruthModel) -> None:
    # A busy minute of random prompts. Replayed in the real cluster (same engines, same routing)
    # with r* prefill engines, the p99 TTFT meets the target; with r* - 1 it does not.
    rng = random.Random(3)
    requests = sorted(
        (TraceRequest(rng.uniform(0, 20), rng.randint(200, 6000), 2) for _ in range(600)),
        key=lambda r: r.arrival_s,
    )
    needed = required_engines(requests, truth, **TARGETS)["prefill"]
    assert len(needed) == 1 and needed[0] >= 2

    def p99_ttft_s(prefill_engines: int) -> float:
        cluster = Cluster(
            truth, requests, initial={"prefill": prefill_engines, "decode": 4}, startup_delay_s=0
        )
        cluster.run_until(1e6)
        assert cluster.done
        return float(np.quantile([r.ttft_s for r in cluster.requests], 0.99))

    assert p99_ttft_s(needed[0]) <= 1.0
    assert p99_ttft_s(needed[0] - 1) > 1.0


def _brute_force_capacity(truth: TruthModel, isl: float, osl: float, itl_ms: float) -> int:
    """The definition, scanned: the largest n with the ITL and the KV need within bounds."""
    context = isl + osl / 2
    fits = [
        n
        for n in range(1, int(truth.max_kv_tokens // (isl + osl)) + 1)
        if truth.decode_iteration_s(n * context, n) * 1000 <= itl_ms
    ]
    return max(fits)


def test_decode_capacity_matches_its_definition(truth: TruthModel) -> None:
    # ITL-bound at 30 ms (a batch of a few hundred); KV-bound when the ITL target is lax:
    # 945,029 KV tokens // 1,101 tokens per request = 858.
    itl_bound = decode_capacity(truth, 1000, 101, 30.0)
    assert itl_bound == _brute_force_capacity(truth, 1000, 101, 30.0)
    assert 1 < itl_bound < truth.max_kv_tokens // 1101
    assert decode_capacity(truth, 1000, 101, 10_000.0) == truth.max_kv_tokens // 1101
    # Not even one request meets a 1 ms ITL: one per engine, the best there is.
    assert decode_capacity(truth, 1000, 101, 1.0) == 1


@pytest.mark.parametrize(("extra", "engines"), [(0, 2), (1, 3)])
def test_decode_needs_ceil_of_concurrency_over_capacity(truth: TruthModel, extra: int, engines: int) -> None:
    # 2·n_max (+1) requests arriving together, 1,000-token prompts and 101-token outputs: all of
    # them decode at once for 100 × 30 ms = 3 s, so the peak is the request count and
    # r* = ceil(count / n_max): 2 exactly at 2·n_max, 3 with one more.
    n_max = _brute_force_capacity(truth, 1000, 101, 30.0)
    requests = [TraceRequest(0.0, 1000, 101) for _ in range(2 * n_max + extra)]
    assert required_engines(requests, truth, **TARGETS)["decode"] == [engines]


def test_decoding_spills_into_quiet_intervals(truth: TruthModel) -> None:
    # A 3,001-token output decodes for 3,000 × 30 ms = 90 s from its arrival at 0: it still
    # needs a decode engine in [60, 120), where nothing arrives and no prefill engine is needed.
    requests = [TraceRequest(0.0, 1000, 3001), TraceRequest(150.0, 1000, 2)]
    assert required_engines(requests, truth, **TARGETS) == {"prefill": [1, 0, 1], "decode": [1, 1, 1]}


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"interval_s": 0.0}, "interval_s"),
        ({"ttft_target_ms": -1.0}, "ttft_target_ms"),
        ({"itl_target_ms": 0.0}, "itl_target_ms"),
        ({"quantile": 0.0}, "quantile"),
        ({"quantile": 1.5}, "quantile"),
    ],
)
def test_required_engines_rejects_bad_arguments(truth: TruthModel, kwargs: dict, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        required_engines([TraceRequest(0.0, 100, 10)], truth, **{**TARGETS, **kwargs})


def test_required_engines_rejects_negative_arrivals(truth: TruthModel) -> None:
    with pytest.raises(ValueError, match=r"requests\[1\].*arrival_s"):
        required_engines([TraceRequest(0.0, 100, 10), TraceRequest(-1.0, 100, 10)], truth, **TARGETS)


# --- oracle_plan -------------------------------------------------------------------------------


def test_plan_gpu_hours_is_the_sum_of_the_role_integrals(truth: TruthModel) -> None:
    rng = random.Random(11)
    requests = sorted(
        (TraceRequest(rng.uniform(0, 600), rng.randint(100, 8000), rng.randint(1, 400)) for _ in range(1500)),
        key=lambda r: r.arrival_s,
    )
    gpus = {"prefill": 2, "decode": 4}
    plan = oracle_plan(requests, truth, **TARGETS, startup_delay_s=120, gpus_per_engine=gpus)
    assert plan.demand == required_engines(requests, truth, **TARGETS)
    assert set(plan.schedule) == {"prefill", "decode"}
    for role, schedule in plan.schedule.items():
        assert schedule.horizon_s == len(plan.demand[role]) * 60
        assert schedule.gpu_hours == pytest.approx(_integral_hours(schedule) * gpus[role])
    expected = sum(_integral_hours(plan.schedule[role]) * gpus[role] for role in gpus)
    assert expected > 0
    assert plan.gpu_hours == pytest.approx(expected)


def test_combine_lists_every_role_at_every_change() -> None:
    prefill = oracle_schedule([1, 1, 3, 3], interval_s=60, startup_delay_s=30)  # (0,1), (90,3)
    decode = oracle_schedule([1, 0, 1, 1], interval_s=60, startup_delay_s=30)  # (0,1), (60,0), (90,1)
    timeline = combine({"prefill": prefill, "decode": decode})
    assert [(step.at_s, step.billed) for step in timeline] == [
        (0.0, {"prefill": 1, "decode": 1}),
        (60.0, {"prefill": 1, "decode": 0}),
        (90.0, {"prefill": 3, "decode": 1}),
    ]
