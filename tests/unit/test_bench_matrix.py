"""bench/replay_quality.py's matrix helpers: the cells it runs, the halves, the per-world table
and the goal summary. No replay runs here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from app.sim.truth import WORLDS as TRUTH_WORLDS
from app.sim.workload import WORKLOADS as WORKLOAD_BUILDERS

BENCH = Path(__file__).resolve().parents[2] / "bench" / "replay_quality.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("replay_quality", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("replay_quality", module)
    spec.loader.exec_module(module)
    return module


rq = _load_bench()


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


def test_the_halves_split_the_eight_workloads_in_two_fixed_fours() -> None:
    train, test = rq.HALVES["train"], rq.HALVES["test"]
    assert set(train) == {"azure-conv-x30", "flash-crowd", "long-prompt", "diurnal"}
    assert set(test) == {"servegen-day1", "bursty-gaps", "heavy-tail-output", "mooncake-arxiv"}
    assert sorted(train + test) == sorted(rq.MATRIX_WORKLOADS) == sorted(WORKLOAD_BUILDERS)


def test_the_worlds_are_the_profile_twice_and_every_named_truth() -> None:
    assert rq.WORLDS["profile"] == (None, 1.0)
    assert rq.WORLDS["profile-1.2"] == (None, 1.2)
    named = {truth for truth, _ in rq.WORLDS.values() if truth is not None}
    assert named == set(TRUTH_WORLDS) - {"profile"}
    assert set(rq.QUICK_WORLDS) == set(rq.WORLDS) - {"profile-1.2"}
    for truth, scale in rq.WORLDS.values():
        assert rq.world_name(truth, scale) in rq.WORLDS


def test_the_default_matrix_has_144_cells_workload_major() -> None:
    cells = rq.matrix_cells(rq.MATRIX_WORKLOADS, rq.WORLDS, rq.DELAYS_S)
    assert len(cells) == 8 * 6 * 3 == 144
    assert len(set(cells)) == 144
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
