"""The fleet's oracle (app/sim/fleet/oracle.py) and `planner replay --fleet-policy oracle`: each
deployment's r* as the single oracle computes it, cut to the budget by the fleet step's rules."""

from __future__ import annotations

import json

import pytest

from app.config import REPO_ROOT
from app.sim.fleet.config import load_fleet_config, load_fleet_requests
from app.sim.fleet.oracle import fleet_oracle
from app.sim.replay.oracle import oracle_plan
from app.sim.replay.run import load_models

PROFILE = REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"


def _deployment(name: str) -> str:
    return (
        f"{{name: {name}, connector: {{type: virtual}}, sla: {{ttft_ms: 1000, itl_ms: 30}}, "
        f"profile: {PROFILE}, scaling: {{algorithm: sla}}}}"
    )


def fleet_file(tmp_path, budget: int):
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "deployments:\n"
        f"  - {_deployment('chat')}\n"
        f"  - {_deployment('batch')}\n"
        "fleet:\n"
        f"  budget_gpus: {{h200: {budget}}}\n"
        "  deployments: {chat: {priority: 2}, batch: {priority: 1}}\n"
        "simulation:\n"
        "  startup_delay_s: 30\n"
        "  oracle: {interval_s: 30}\n"
        "  traces:\n"
        "    chat: {workload: flash-crowd, rate_scale: 0.2, duration_s: 120}\n"
        "    batch: {workload: diurnal, rate_scale: 0.2, duration_s: 120}\n"
    )
    return path


def oracle_of(path):
    config = load_fleet_config(path)
    requests = {d.name: load_fleet_requests(config, d.name) for d in config.deployments}
    truths = {d.name: load_models(config.replay_config(d))[1] for d in config.deployments}
    sim = config.simulation
    oracle = fleet_oracle(
        config.deployments,
        config.fleet,
        requests,
        truths,
        interval_s=sim.oracle.interval_s,
        startup_delay_s=sim.startup_delay_s,
        quantile=sim.oracle.quantile,
    )
    return config, requests, truths, oracle


def test_a_loose_budget_leaves_each_deployment_its_own_oracle(tmp_path) -> None:
    config, requests, truths, oracle = oracle_of(fleet_file(tmp_path, budget=200))
    assert oracle.cut_intervals == 0
    sim = config.simulation
    for d in config.deployments:
        single = oracle_plan(
            requests[d.name],
            truths[d.name],
            interval_s=sim.oracle.interval_s,
            ttft_target_ms=d.sla.ttft_ms,
            itl_target_ms=d.sla.itl_ms,
            startup_delay_s=sim.startup_delay_s,
            gpus_per_engine={"prefill": 1, "decode": 1},
            quantile=sim.oracle.quantile,
        )
        assert oracle.fitted[d.name] == single.demand == oracle.demand[d.name]
        assert oracle.gpu_hours[d.name] == pytest.approx(single.gpu_hours)
        assert oracle.unbounded_gpu_hours[d.name] == pytest.approx(single.gpu_hours)


def test_a_tight_budget_cuts_the_lower_priority_first(tmp_path) -> None:
    _, _, _, loose = oracle_of(fleet_file(tmp_path, budget=200))
    need = [
        sum(loose.demand[n][r][k] for n in ("chat", "batch") for r in ("prefill", "decode"))
        for k in range(len(loose.demand["chat"]["prefill"]))
    ]
    budget = max(need) - 1  # binds at the busiest interval, by one GPU
    _, _, _, oracle = oracle_of(fleet_file(tmp_path, budget=budget))
    assert oracle.cut_intervals >= 1
    for k in range(len(need)):
        fitted = {n: sum(oracle.fitted[n][r][k] for r in ("prefill", "decode")) for n in ("chat", "batch")}
        assert sum(fitted.values()) <= budget
        # chat (priority 2) keeps its r* whenever it fits alone; batch gives first.
        assert oracle.fitted["chat"]["prefill"][k] == loose.demand["chat"]["prefill"][k]
        assert oracle.fitted["chat"]["decode"][k] == loose.demand["chat"]["decode"][k]
    assert oracle.total_gpu_hours < sum(oracle.unbounded_gpu_hours.values())


def test_planner_replay_runs_the_fleet_oracle(tmp_path, capsys) -> None:
    from app.cli import main as planner_main

    path = fleet_file(tmp_path, budget=6)
    for policy in ("oracle", "fleet"):
        out = tmp_path / policy
        code = planner_main(["replay", "--config", str(path), "--out", str(out), "--fleet-policy", policy])
        assert code == 0, capsys.readouterr().err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["policy"] == policy
        assert summary["oracle_gpu_hours"] > 0
        assert summary["gpu_hours_over_oracle"] == pytest.approx(
            summary["gpu_hours"] / summary["oracle_gpu_hours"]
        )
        for d in summary["deployments"].values():
            assert d["requests"] > 0 and d["oracle_gpu_hours"] > 0
