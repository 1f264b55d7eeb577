"""bench/miss_causes.py: a planner replay's misses and GPU-hours taken apart, on a hand-made
replay whose every number is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.core.perf.interpolation import PerfModel
from app.sim.replay.request_table import request_table
from app.sim.replay.results import OracleStep, ReplayResult
from app.sim.world.cluster import ReplicaSample
from app.sim.world.engines import SimRequest
from app.sim.world.truth import TruthModel
from app.sources.profile_files import load_profile
from bench import miss_causes as mc

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"


@pytest.fixture(scope="module")
def truth() -> TruthModel:
    return TruthModel(PerfModel.from_profile(load_profile(H200)))


def sample(at_s: float, role: str, target: int, ready: int) -> ReplicaSample:
    return ReplicaSample(at_s, role, target, billed=target, ready=ready, starting=target - ready, draining=0)


def served(
    i: int, arrival_s: float, ttft_s: float, itl_s: float, isl: int = 1000, osl: int = 11
) -> SimRequest:
    r = SimRequest(i, arrival_s, isl, osl)
    r.first_token_s = arrival_s + ttft_s
    r.finish_s = r.first_token_s + itl_s * (osl - 1)
    return r


def replay(
    requests: list[SimRequest], timeline: list[ReplicaSample], oracle: list[OracleStep], **kw
) -> ReplayResult:
    fields = dict(
        policy="planner",
        trace="t",
        ttft_target_ms=1000.0,
        itl_target_ms=30.0,
        startup_delay_s=30.0,
        truth_scale=1.0,
        gpus_per_engine={"prefill": 1, "decode": 1},
        requests=requests,
        timeline=timeline,
        decisions=[],
        gpu_hours=0.0,
        oracle_gpu_hours=0.0,
        oracle_timeline=oracle,
        end_s=100.0,
        wall_s=0.0,
    )
    fields.update(kw)
    return ReplayResult(**fields)


# Prefill: 1 engine, then 2 ordered at 5 s that serve from 40 s. Decode: 1, then 2 ordered at 45 s
# that serve from 60 s.
TIMELINE = [
    sample(0.0, "prefill", 1, 1),
    sample(0.0, "decode", 1, 1),
    sample(5.0, "prefill", 2, 1),
    sample(40.0, "prefill", 2, 2),
    sample(45.0, "decode", 2, 1),
    sample(60.0, "decode", 2, 2),
]


def test_each_miss_is_counted_once_by_its_cause(truth: TruthModel) -> None:
    requests = [
        served(0, 10.0, 2.0, 0.01),  # TTFT missed while prefill's second engine started: starting
        served(1, 50.0, 2.0, 0.01),  # TTFT missed with both engines serving: serving
        served(2, 50.0, 0.1, 0.05),  # ITL missed from 50.1 s, decode's second engine starting: starting
        served(3, 70.0, 0.1, 0.05),  # ITL missed at 70.1 s with both decode engines serving: serving
        served(4, 10.0, 0.1, 0.01),  # met, while short: not a miss
        served(5, 10.0, 2.0, 0.01, isl=60_000),  # 1.25 s alone on an idle engine: unservable
        SimRequest(6, 80.0, 1000, 11),  # never served, both roles complete: serving
    ]
    result = replay(requests, TIMELINE, [])
    table = request_table(requests, 1000.0, 30.0)
    assert mc.miss_causes(result, table, truth) == {"unservable": 1, "starting": 2, "serving": 3}


def test_a_miss_before_the_first_sample_is_not_read_as_short(truth: TruthModel) -> None:
    requests = [served(0, 0.0, 2.0, 0.01)]
    result = replay(requests, [sample(1.0, "prefill", 3, 1)], [])
    table = request_table(requests, 1000.0, 30.0)
    assert mc.miss_causes(result, table, truth) == {"unservable": 0, "starting": 0, "serving": 1}


def test_cost_by_role_bills_the_oracle_up_to_its_implicit_horizon() -> None:
    # The planner: prefill 1 engine for 5 s then 2 until 100 s (195 engine-s), decode 1 until
    # 45 s then 2 (155 engine-s). The oracle: prefill 1 and decode 1 from 0, prefill 2 from 50 s;
    # its 0.0875 GPU-hours (315 GPU-s) put its horizon at 50 + (315 - 100) / 3 = 121.67 s.
    oracle = [OracleStep(0.0, {"prefill": 1, "decode": 1}), OracleStep(50.0, {"prefill": 2, "decode": 1})]
    result = replay([], TIMELINE, oracle, oracle_gpu_hours=315.0 / 3600.0)
    prefill_oracle_s = 50.0 + 2 * (315.0 - 100.0) / 3
    decode_oracle_s = 50.0 + (315.0 - 100.0) / 3
    assert prefill_oracle_s + decode_oracle_s == pytest.approx(315.0)
    cost = mc.cost_by_role(result)
    assert cost["prefill"] == pytest.approx(195.0 / prefill_oracle_s)
    assert cost["decode"] == pytest.approx(155.0 / decode_oracle_s)
    assert mc.cost_by_role(replay([], TIMELINE, [])) == {"prefill": None, "decode": None}


def sla_record(prefill_needed: int, token_rate_s: float, level_tokens_s: float) -> dict:
    """An SLA tick's record as `present_need` reads it, prefill only: the load now is the level
    (`request_rate_s` × `isl_mean`) against the `token_rate_s` the wish was sized for."""
    return {
        "demand": {
            "request_rate_s": level_tokens_s / 1000.0,
            "isl_mean": 1000.0,
            "token_rate_s": token_rate_s,
        },
        "roles": {"prefill": {"needed": prefill_needed, "backlog_tokens_s": 0.0}},
    }


def test_beyond_the_load_now_is_the_share_of_targeted_engine_seconds_above_it() -> None:
    ticks = [
        # 10 s at a target of 4 for a wish sized for twice the load now: 2 engines above it.
        {"at_s": 0.0, "target": {"prefill": 4}, "sla": sla_record(4, 200_000.0, 100_000.0)},
        # 10 s with no sizing (no traffic): left out of both sides.
        {"at_s": 10.0, "target": {"prefill": 4}, "sla": {"reason": "no_traffic_data"}},
        # 5 s at a target of 4 that the load now needs whole.
        {"at_s": 20.0, "target": {"prefill": 4}, "sla": sla_record(4, 100_000.0, 100_000.0)},
        {"at_s": 25.0, "target": {"prefill": 4}, "sla": sla_record(4, 100_000.0, 100_000.0)},
    ]
    assert mc.beyond_load_now(ticks, itl_target_ms=30.0) == pytest.approx((2 * 10) / (4 * 10 + 4 * 5))
    assert mc.beyond_load_now(ticks[1:2], itl_target_ms=30.0) is None


def cell_row(workload: str, policy: str, requests: int, attainment: float, ratio: float, why=None) -> dict:
    """A matrix row as bench/replay_quality.py writes it, in the `profile` world at 30 s."""
    row = {
        "workload": workload,
        "world": "profile",
        "delay_s": 30,
        "policy": policy,
        "requests": requests,
        "slo_attainment": attainment,
        "gpu_hours_over_oracle": ratio,
        "gpu_hours": ratio,
    }
    return row if why is None else {**row, "why": why}


def test_the_table_lists_only_the_missed_planner_cells() -> None:
    why = {
        "misses": {"unservable": 10, "starting": 80, "serving": 10},
        "cost_by_role": {"prefill": 1.5, "decode": None},
        "beyond_load_now": 0.25,
    }
    rows = [
        cell_row("a", "planner", 1000, 0.9, 1.3, why),
        cell_row("a", "static", 1000, 0.9, 1.3),
        cell_row("b", "planner", 1000, 0.9, 1.3, why),
    ]
    lines = mc.format_why(rows, ["a profile 30 s"]).splitlines()
    assert lines[2:] == ["| a profile 30 s | 90.0% / 1.30 | 1.0% / 8.0% / 1.0% | 1.50 / – | 25% |"]


def test_run_alone_it_prints_the_table_from_a_saved_matrix(tmp_path: Path, capsys) -> None:
    why = {
        "misses": {"unservable": 0, "starting": 5, "serving": 1},
        "cost_by_role": {},
        "beyond_load_now": None,
    }
    rows = [cell_row("a", "planner", 100, 0.94, 1.2, why), cell_row("b", "planner", 100, 0.995, 1.1)]
    saved = tmp_path / "matrix.json"
    saved.write_text(json.dumps({"rows": rows}))
    assert mc.main([str(saved)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"1 planner cells miss the goal in {saved}:"
    assert out[-1] == "| a profile 30 s | 94.0% / 1.20 | 0.0% / 5.0% / 1.0% | – / – | – |"
    assert mc.main([str(tmp_path / "missing.json")]) == 0
    assert capsys.readouterr().out.startswith("no matrix results at")
    saved.write_text("[]")
    assert mc.main([str(saved)]) == 2
