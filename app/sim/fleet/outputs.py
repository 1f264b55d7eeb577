"""What a fleet replay produced, and its outputs: summary.json and grants.csv."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.sim.fleet.config import FleetReplayConfig
from app.sim.fleet.oracle import FleetOracle
from app.sim.replay.outputs import summarize
from app.sim.replay.results import ReplayResult


@dataclass
class FleetRunResult:
    policy: str
    results: dict[str, ReplayResult]
    grant_changes: dict[str, int]
    peak_wish_gpus: dict[str, int]
    peak_billed_gpus: dict[str, int]  # per GPU type
    grants_log: list[dict[str, Any]]  # one row per (tick, deployment, role) whose grant changed
    wall_s: float
    oracle: FleetOracle | None = None
    # Deployments with hardware variants: GPU-hours per variant, and their cost at its price.
    variant_gpu_hours: dict[str, dict[str, float]] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)


def fleet_summary(config: FleetReplayConfig, run: FleetRunResult) -> dict[str, Any]:
    deployments: dict[str, Any] = {}
    met = total = 0
    for name, result in run.results.items():
        s = summarize(result)
        entry = config.fleet.member(name)
        deployments[name] = {
            "trace": result.trace,
            "priority": entry.priority,
            "gpu_type": entry.gpu_type,
            "guaranteed_gpus": entry.guaranteed_gpus,
            "max_gpus": entry.max_gpus,
            "requests": s["requests"],
            "slo_attainment": s["slo_attainment"],
            "ttft_attainment": s["ttft_attainment"],
            "itl_attainment": s["itl_attainment"],
            "gpu_hours": s["gpu_hours"],
            "oracle_gpu_hours": result.oracle_gpu_hours,
            "grant_changes": run.grant_changes[name],
            "scaling_actions": s["scaling_actions"],
            "peak_wish_gpus": run.peak_wish_gpus[name],
            **(
                {"gpu_hours_by_variant": run.variant_gpu_hours[name], "cost": run.cost[name]}
                if name in run.cost
                else {}
            ),
            "simulated_s": s["simulated_s"],
        }
        if "scale_to_zero" in s:  # only a deployment that may scale to zero: its wake-ups
            deployments[name]["scale_to_zero"] = s["scale_to_zero"]
        met += round((s["slo_attainment"] or 0.0) * s["requests"])
        total += s["requests"]
    oracle_hours = sum(d["oracle_gpu_hours"] for d in deployments.values())
    return {
        "policy": run.policy,
        "config": str(config.path),
        "budget_gpus": dict(config.fleet.budget_gpus),
        "peak_billed_gpus": run.peak_billed_gpus,
        "margin": config.fleet.margin,
        "hold_s": config.fleet.hold_s,
        "slo_attainment": met / total if total else None,
        "gpu_hours": sum(d["gpu_hours"] for d in deployments.values()),
        # The fleet oracle's plan (scheduled GPU-hours, as the single replay's oracle_gpu_hours).
        "oracle_gpu_hours": oracle_hours,
        "gpu_hours_over_oracle": (
            sum(d["gpu_hours"] for d in deployments.values()) / oracle_hours if oracle_hours else None
        ),
        "oracle_cut_intervals": run.oracle.cut_intervals if run.oracle is not None else None,
        "grant_changes": sum(run.grant_changes.values()),
        "deployments": deployments,
        "wall_s": run.wall_s,
    }


def write_fleet_outputs(config: FleetReplayConfig, run: FleetRunResult, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    summary = fleet_summary(config, run)
    paths = {"summary": out / "summary.json", "grants": out / "grants.csv"}
    paths["summary"].write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
    with paths["grants"].open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(
            f, fieldnames=("at_s", "deployment", "role", "wish", "grant", "reason", "cut_by")
        )
        writer.writeheader()
        writer.writerows(run.grants_log)
    return paths
