"""bench/replay_quality.py's matrix helpers: the cells it runs, the halves, the per-world table
and the goal summary; bench/fixed_frontier.py's fixed-count sweep and frontier. One tiny replay
(a fixed count on a two-minute trace); everything else on hand-made rows."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from app.core.traces import TraceRequest
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
from app.sim.replay.policies import FixedPolicy
from app.sim.replay.run import build_world, make_policy, run_policy
from app.sim.world.truth import WORLDS as TRUTH_WORLDS
from app.sim.world.workload import WORKLOADS as WORKLOAD_BUILDERS
from bench import fixed_frontier as ff
from bench import replay_quality as rq


def row(workload: str, policy: str, attainment: float, ratio: float, *, world: str = "profile", delay_s=120):
    return {
        "workload": workload,
        "world": world,
        "delay_s": delay_s,
        "policy": policy,
        "slo_attainment": attainment,
        "gpu_hours_over_oracle": ratio,
        "gpu_hours": 10.0 * ratio,
        "oracle_gpu_hours": 10.0,
        "unservable_requests": 7,
    }


def test_the_halves_split_the_twelve_workloads_and_the_code_bursts_are_only_reported_on() -> None:
    # Tuning never sees the code-completion bursts: they are the traffic the planner must get right
    # without having been fitted to it.
    train, test = rq.HALVES["train"], rq.HALVES["test"]
    assert set(train) == {"azure-conv-x30", "flash-crowd", "long-prompt", "diurnal"}
    assert set(test) == {
        "servegen-day1",
        "bursty-gaps",
        "heavy-tail-output",
        "mooncake-arxiv",
        "code-bursts-clustered",
        "code-bursts-spread",
        "code-bursts-clustered-s1",
        "code-bursts-spread-s1",
    }
    assert sorted(train + test) == sorted(rq.MATRIX_WORKLOADS) == sorted(WORKLOAD_BUILDERS)


def test_the_worlds_are_the_profile_twice_and_every_named_truth() -> None:
    assert rq.WORLDS["profile"] == (None, 1.0)
    assert rq.WORLDS["profile-1.2"] == (None, 1.2)
    named = {truth for truth, _ in rq.WORLDS.values() if truth is not None}
    assert named == set(TRUTH_WORLDS) - {"profile"}
    assert set(rq.QUICK_WORLDS) == set(rq.WORLDS) - {"profile-1.2"}
    for truth, scale in rq.WORLDS.values():
        assert rq.world_name(truth, scale) in rq.WORLDS


def test_the_default_matrix_has_216_cells_workload_major() -> None:
    cells = rq.matrix_cells(rq.MATRIX_WORKLOADS, rq.WORLDS, rq.DELAYS_S)
    assert len(cells) == 12 * 6 * 3 == 216
    assert len(set(cells)) == 216
    # A workload's cells are consecutive: a worker builds each workload once.
    assert [c[0] for c in cells[:18]] == ["azure-conv-x30"] * 18


def test_names_are_checked_and_keep_their_order() -> None:
    assert rq.parse_names("diurnal, bursty-gaps", rq.MATRIX_WORKLOADS, "--workloads") == (
        "diurnal",
        "bursty-gaps",
    )
    with pytest.raises(SystemExit, match=r"--worlds: unknown moon; choose from profile, profile-1.2"):
        rq.parse_names("profile,moon", tuple(rq.WORLDS), "--worlds")
    assert rq.parse_delays("30,120") == (30.0, 120.0)
    with pytest.raises(SystemExit, match="--delays"):
        rq.parse_delays("-5")


def test_one_table_per_world_with_an_attainment_and_cost_pair_per_policy() -> None:
    rows = [
        row("diurnal", "oracle", 1.0, 1.0),
        row("diurnal", "planner", 0.991, 1.12),
        row("diurnal", "planner", 0.5, 3.0, world="smooth"),
    ]
    table = rq.world_table(rows, "profile", ("oracle", "static", "planner")).splitlines()
    assert table[0] == "| workload | delay | oracle GPU-h | unservable | oracle | static | planner |"
    assert table[2] == "| diurnal | 120 s | 10.00 | 7 | 100.0% / 1.00 | – | 99.1% / 1.12 |"
    assert len(table) == 3


def test_the_goal_summary_sorts_the_planners_cells() -> None:
    rows = [
        # Met: 99% at 1.10x.
        row("a", "oracle", 1.0, 1.0),
        row("a", "static", 0.9, 1.5),
        row("a", "planner", 0.99, 1.10),
        # Met: under 99%, but within half a point of an oracle that cannot do better.
        row("b", "oracle", 0.86, 1.0),
        row("b", "planner", 0.857, 1.15),
        # Missed on cost; below 95%; worse than static on both axes.
        row("c", "oracle", 1.0, 1.0),
        row("c", "static", 0.95, 1.2),
        row("c", "planner", 0.90, 1.3),
        # No planner: not counted.
        row("d", "oracle", 1.0, 1.0),
    ]
    # b's prompts are long: 140 of its 1,000 no engine count serves (857 of the 860 others met it);
    # c has 7 such among 1,000 (900 of 993).
    for r in rows:
        r["requests"] = 1000
    rows[3]["unservable_requests"] = rows[4]["unservable_requests"] = 140
    summary = rq.goal_summary(rows)
    assert summary["met"] == ["a profile 120 s", "b profile 120 s"]
    assert summary["missed"] == ["c profile 120 s"]
    assert summary["below_95"] == ["b profile 120 s (85.7%)", "c profile 120 s (90.0%)"]
    assert summary["below_95_servable"] == ["b profile 120 s (99.7% of the servable)"]
    assert summary["worse_than_static"] == ["c profile 120 s (90.0% vs 95.0%, 13.00 vs 12.00 GPU-h)"]
    # b ran no static row: not compared, and the summary says so rather than "none".
    assert summary["no_static"] == ["b profile 120 s"]
    text = rq.format_summary(summary)
    assert "met in 2 of 3 cells" in text
    assert "worse than static on both axes: 1: c profile 120 s" in text
    assert "could serve: 1: b profile 120 s (99.7% of the servable)" in text
    assert text.endswith("(not compared in 1 cell: no static row in this run)")
    assert rq.format_summary(rq.goal_summary([row("d", "oracle", 1.0, 1.0)])).startswith("No planner rows")


# --- the fixed-count frontier (bench/fixed_frontier.py) -------------------------------------------


def fixed(prefill: int, decode: int, attainment: float, gpu_hours: float, *, workload: str = "a") -> dict:
    r = row(workload, f"fixed {prefill}/{decode}", attainment, gpu_hours / 10.0)
    return {**r, "gpu_hours": gpu_hours, "fixed": {"prefill": prefill, "decode": decode}}


@dataclass(frozen=True)
class BeatCase:
    name: str
    why: str
    attainment: float | None  # the fixed run's; the planner's is 99.0% at 10 GPU-h
    gpu_hours: float
    beaten: bool


BEAT_CASES = [
    BeatCase("both_edges", "exactly 0.1 point lower at exactly 3% fewer GPU-hours counts", 0.989, 9.7, True),
    BeatCase("not_cheap_enough", "0.1 point lower needs 3% off; 2.9% is not", 0.989, 9.71, False),
    BeatCase("too_low", "a hundredth of a point past the 0.1-point slack", 0.9889, 5.0, False),
    BeatCase("same_cheaper", "the same attainment for 3% less", 0.99, 9.7, True),
    BeatCase("gain_edge", "exactly 0.3 point more at exactly the same GPU-hours", 0.993, 10.0, True),
    BeatCase("gain_short", "0.29 point more is not enough at the same cost", 0.9929, 10.0, False),
    BeatCase("gain_dearer", "0.3 point more, but dearer than the planner", 0.993, 10.01, False),
    BeatCase("equal", "the planner's own numbers do not beat it", 0.99, 10.0, False),
    BeatCase("dominant", "better and cheaper", 0.999, 8.0, True),
    BeatCase("no_attainment", "a run without an attainment beats nothing", None, 1.0, False),
]


@pytest.mark.parametrize("case", BEAT_CASES, ids=lambda c: c.name)
def test_a_fixed_count_beats_the_planner_on_both_axes(case: BeatCase) -> None:
    planner = row("a", "planner", 0.99, 1.0)  # 10 GPU-h
    assert ff.beats(fixed(5, 5, case.attainment, case.gpu_hours), planner) is case.beaten, case.why


# Cheapest first: 4/6, 5/6 and 6/7 each buy attainment; 6/6 and 5/7 buy none over 5/6, 7/7
# none over 6/7, 9/9 none over 8/9.
SWEPT = [
    fixed(4, 6, 0.90, 5.0),
    fixed(5, 6, 0.97, 5.5),
    fixed(6, 6, 0.96, 6.0),
    fixed(5, 7, 0.97, 6.0),
    fixed(6, 7, 0.995, 6.5),
    fixed(7, 7, 0.995, 7.0),
    fixed(8, 9, 1.0, 8.5),
    fixed(9, 9, 1.0, 9.0),
]


def test_the_pareto_set_keeps_the_runs_nothing_cheaper_matches() -> None:
    assert [r["policy"] for r in ff.pareto(SWEPT)] == ["fixed 4/6", "fixed 5/6", "fixed 6/7", "fixed 8/9"]
    # The best: the highest attainment, the cheaper of the two at 100%.
    assert ff.best(SWEPT)["policy"] == "fixed 8/9"
    assert ff.pareto([]) == [] and ff.best([]) is None


@dataclass(frozen=True)
class ReachCase:
    name: str
    why: str
    attainment: float
    expected: str | None


REACH_CASES = [
    ReachCase("between", "99% first reached by 6/7", 0.99, "fixed 6/7"),
    ReachCase("exactly", "reaching is at least equal: 6/7 has exactly 99.5%", 0.995, "fixed 6/7"),
    ReachCase("just_above", "a hair above 99.5% takes 8/9, not 7/7", 0.9951, "fixed 8/9"),
    ReachCase("top", "100%: the cheaper of 8/9 and 9/9", 1.0, "fixed 8/9"),
    ReachCase("low", "anything reaches 50%: the cheapest run", 0.5, "fixed 4/6"),
    ReachCase("unreached", "nothing swept reaches more than 100%", 1.0001, None),
]


@pytest.mark.parametrize("case", REACH_CASES, ids=lambda c: c.name)
def test_the_cheapest_fixed_count_reaching_an_attainment(case: ReachCase) -> None:
    found = ff.cheapest_reaching(SWEPT, case.attainment)
    assert (None if found is None else found["policy"]) == case.expected, case.why


@dataclass(frozen=True)
class CellCase:
    name: str
    why: str
    planner: tuple[float, float] | None  # attainment, GPU-hours
    reaching: str | None  # the cheapest fixed count reaching the planner's attainment
    beaten_by: str | None
    no_dearer: bool | None


CELL_CASES = [
    CellCase(
        "beaten",
        "6/7 has the planner's 99.5% for 6.5 GPU-h, 7% less than its 7.0",
        (0.995, 7.0),
        "fixed 6/7",
        "fixed 6/7",
        False,
    ),
    CellCase(
        "dearer_not_beaten",
        "6/7 reaches 99.5% for 1.5% less: dearer, but not beaten",
        (0.995, 6.6),
        "fixed 6/7",
        None,
        False,
    ),
    CellCase(
        "cheaper",
        "100% for 6.0 GPU-h; the cheapest fixed count reaching 100% needs 8.5",
        (1.0, 6.0),
        "fixed 8/9",
        None,
        True,
    ),
    CellCase(
        "gain",
        "93% at 5.5: 5/6 has 4 points more at the same cost: no dearer, and beating it",
        (0.93, 5.5),
        "fixed 5/6",
        "fixed 5/6",
        True,
    ),
    CellCase("no_planner", "without a planner row, only the frontier", None, None, None, None),
]


@pytest.mark.parametrize("case", CELL_CASES, ids=lambda c: c.name)
def test_a_cells_frontier_against_its_planner(case: CellCase) -> None:
    by_policy = {r["policy"]: r for r in SWEPT}
    if case.planner is not None:
        by_policy["planner"] = {**row("a", "planner", case.planner[0], 1.0), "gpu_hours": case.planner[1]}
    frontier = ff.cell_frontier(by_policy)
    assert frontier is not None
    assert frontier["swept"] == 8
    assert [p["policy"] for p in frontier["pareto"]] == ["fixed 4/6", "fixed 5/6", "fixed 6/7", "fixed 8/9"]
    assert frontier["best"]["policy"] == "fixed 8/9"
    reaching, beaten = frontier["cheapest_reaching_planner"], frontier["beaten_by"]
    assert (reaching and reaching["policy"], beaten and beaten["policy"]) == (
        case.reaching,
        case.beaten_by,
    ), case.why
    assert frontier["planner_no_dearer"] is case.no_dearer, case.why


def test_the_table_and_the_summary_show_the_frontier() -> None:
    rows = [
        row("a", "oracle", 1.0, 1.0),
        {**row("a", "planner", 0.995, 0.70), "gpu_hours": 7.0},
        *SWEPT,
        # b: the planner alone reaches 99.9%; its one fixed run does not.
        {**row("b", "planner", 0.999, 0.5), "gpu_hours": 5.0},
        fixed(3, 3, 0.99, 4.0, workload="b"),
        # c: no fixed sweep.
        row("c", "planner", 0.99, 1.0),
    ]
    table = rq.world_table(rows, "profile", ("oracle", "planner", "fixed")).splitlines()
    assert table[0] == (
        "| workload | delay | oracle GPU-h | unservable | oracle | planner "
        "| cheapest fixed ≥ planner | best fixed | beaten by fixed |"
    )
    assert table[2].endswith("| 99.5% / 0.70 | 6/7: 99.5% / 0.65 | 8/9: 100.0% / 0.85 | 6/7: 99.5% / 0.65 |")
    assert table[3].endswith("| none of 1 | 3/3: 99.0% / 0.40 | - |")
    assert table[4].endswith("| 99.0% / 1.00 | – | – | – |")
    summary = rq.goal_summary(rows)
    assert summary["beaten_by_fixed"] == [
        "a profile 120 s (fixed 6/7: 99.5% at 6.50 GPU-h vs 99.5% at 7.00 GPU-h)"
    ]
    assert summary["no_dearer_than_fixed"] == [
        "b profile 120 s (no fixed count of the 1 swept reaches 99.9%)"
    ]
    assert summary["dearer_than_fixed"] == ["a profile 120 s (7.00 vs 6.50 GPU-h for fixed 6/7)"]
    assert summary["no_fixed"] == ["c profile 120 s"]
    text = rq.format_summary(summary)
    assert "fewer GPU-hours, or ≥ 0.3 point more at no more): 1 of 2 cells: a profile 120 s" in text
    assert "(not compared in 1 cell: no fixed sweep in this run)" in text
    assert "reaching the same attainment: 1 of 2 cells: b profile 120 s" in text
    assert text.endswith("  not: 1: a profile 120 s (7.00 vs 6.50 GPU-h for fixed 6/7)")


def _separable(ttft_from: int, itl_from: int):
    """A fake replay: prefill counts from `ttft_from` meet every TTFT (90% below), decode counts
    from `itl_from` every ITL (95% below); a GPU-hour per engine. It records what it ran."""
    ran: list[tuple[int, int]] = []

    def replay(p: int, d: int) -> dict:
        ran.append((p, d))
        ttft, itl = (1.0 if p >= ttft_from else 0.9), (1.0 if d >= itl_from else 0.95)
        r = fixed(p, d, min(ttft, itl), float(p + d))
        return {**r, "ttft_attainment": ttft, "itl_attainment": itl}

    return replay, ran


@dataclass(frozen=True)
class SweepCase:
    name: str
    why: str
    target: float
    planner_gpu_hours: float | None
    budget: int
    reach: float
    cheapest: str  # the cheapest swept count reaching `reach`
    last: tuple[int, int]  # the last count replayed


SWEEP_CASES = [
    SweepCase(
        "knee", "each axis bisected to its knee, 6/8 replayed last", 1.0, None, 14, 1.0, "fixed 6/8", (6, 8)
    ),
    SweepCase(
        "top_target",
        "at 100% no fixed count has 0.3 point more: no climbing",
        1.0,
        100.0,
        14,
        1.0,
        "fixed 6/8",
        (6, 8),
    ),
    SweepCase(
        "dear_planner",
        "95% at 6/5; with the planner's cost far off, climb to 100% at 6/8",
        0.95,
        100.0,
        14,
        1.0,
        "fixed 6/8",
        (6, 8),
    ),
    SweepCase(
        "cheap_planner",
        "95% at 6/5 for 11 GPU-h; one more engine is dearer than the planner",
        0.95,
        11.0,
        14,
        0.95,
        "fixed 6/5",
        (6, 5),
    ),
    SweepCase(
        "budget",
        "three replays: the top, then prefill 7 (passes) and 5 (fails)",
        1.0,
        None,
        3,
        1.0,
        "fixed 7/20",
        (5, 20),
    ),
]


@pytest.mark.parametrize("case", SWEEP_CASES, ids=lambda c: c.name)
def test_the_sweep_bisects_each_axis_then_climbs(case: SweepCase) -> None:
    replay, ran = _separable(6, 8)
    ranges = {"prefill": (3, 12), "decode": (5, 20)}
    rows = ff.sweep(
        replay, ranges, target=case.target, planner_gpu_hours=case.planner_gpu_hours, budget=case.budget
    )
    assert len(rows) == len(ran) == len(set(ran)) <= case.budget, "each count replayed once, within budget"
    assert ran[0] == (12, 20), "the top of both ranges first"
    found = ff.cheapest_reaching(rows, case.reach)
    assert (found and found["policy"], ran[-1]) == (case.cheapest, case.last), case.why


def test_the_sweep_ranges_span_the_oracles_mean_to_half_again_its_peak() -> None:
    @dataclass
    class Schedule:
        steps: list[tuple[float, int]]
        horizon_s: float

    # Prefill: 2 engines for 600 s, 8 for 300 s, 4 for 900 s: mean 4.0, peak 8 -> 4..12;
    # decode: always 3, capped by max_replicas 4.
    schedules = {
        "prefill": Schedule([(0.0, 2), (600.0, 8), (900.0, 4)], 1800.0),
        "decode": Schedule([(0.0, 3)], 1800.0),
    }
    assert ff.sweep_ranges(schedules, {"prefill": (1, 32), "decode": (1, 4)}) == {
        "prefill": (4, 12),
        "decode": (3, 4),
    }


def _poisson(rate_rps: float, end_s: float, seed: int) -> list[TraceRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    while (t := t + rng.expovariate(rate_rps)) < end_s:
        out.append(TraceRequest(t, 1000, 100))
    return out


def test_a_fixed_count_starts_where_the_planner_does_and_its_new_engines_serve_a_delay_later() -> None:
    config = with_overrides(load_replay_config(DEFAULT_REPLAY_CONFIG), startup_delay_s=30)
    world = build_world(config, _poisson(20, 120, 0))
    planner = make_policy("planner", world)
    initial, first_tick_s = planner.initial(), planner.first_tick_s()
    target = {"prefill": initial["prefill"] + 2, "decode": initial["decode"] + 1}
    policy = FixedPolicy(initial, target, first_tick_s=first_tick_s)
    result = run_policy(world, policy, trace_name="poisson")
    assert policy.name == f"fixed {target['prefill']}/{target['decode']}"
    assert [(d.at_s, d.target) for d in result.decisions] == [(first_tick_s, target)], "one order, then held"
    for role in ("prefill", "decode"):
        samples = [s for s in result.timeline if s.role == role]
        assert (samples[0].at_s, samples[0].ready) == (0.0, initial[role]), "the planner's start"
        ordered = next(s for s in samples if s.billed == target[role])
        full = next(s for s in samples if s.ready == target[role])
        assert ordered.at_s == first_tick_s
        assert full.at_s - ordered.at_s == pytest.approx(config.simulation.startup_delay_s)
        assert all(s.ready == initial[role] for s in samples if s.at_s < full.at_s), role


def test_the_results_file_says_what_it_is_from_at_its_top() -> None:
    made = rq.stamp(["bench/replay_quality.py", "--quick"])
    assert made["command"] == "bench/replay_quality.py --quick"
    assert made["commit"] not in ("", "unknown")  # the tests run in the repository's clone
    text = rq.markdown_file("| a | b |\n|---|---|\n", made)
    head = text.splitlines()[:9]
    assert head[0] == "# Decision-quality matrix: results"
    for field in ("command", "commit", "date", "machine"):
        assert any(line.startswith(f"- {field}: ") and made[field] in line for line in head), field
    assert text.rstrip().endswith("|---|---|")
