"""The decision-quality matrix's report (bench/replay_quality.py): one markdown table per world,
the goal and how many cells meet it, and the planner against its cell's fixed counts
(bench/fixed_frontier.py)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path

from bench.fixed_frontier import (
    FRONTIER_COLUMNS,
    fixed_summary,
    format_fixed_summary,
    frontier_entries,
)

# The goal, for the planner in one cell: SLO attainment at least GOAL_ATTAINMENT (or within
# GOAL_ORACLE_SLACK of the oracle's, for cells where some requests cannot be served at all) at
# GPU-hours at most GOAL_COST_RATIO times the oracle's.
GOAL_ATTAINMENT = 0.99
GOAL_ORACLE_SLACK = 0.005
GOAL_COST_RATIO = 1.15
LOW_ATTAINMENT = 0.95


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def world_table(rows: Sequence[dict], world: str, policies: Sequence[str]) -> str:
    """One world's markdown table: a row per (workload, delay), a column `attainment / ÷ oracle`
    per policy; for `fixed`, the FRONTIER_COLUMNS of bench/fixed_frontier.py instead."""
    cells: dict[tuple[str, float], dict[str, dict]] = {}
    for r in rows:
        if r["world"] == world:
            cells.setdefault((r["workload"], r["delay_s"]), {})[r["policy"]] = r
    frontier = "fixed" in policies
    policies = [p for p in policies if p != "fixed"]
    extra = FRONTIER_COLUMNS if frontier else ()
    head = ["workload", "delay", "oracle GPU-h", "unservable", *policies, *extra]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|---:|" + "---|" * (len(policies) + len(extra))]
    for (name, delay_s), by_policy in cells.items():
        any_row = next(iter(by_policy.values()))
        unservable = any_row.get("unservable_requests")
        entries = [
            f"{_pct(by_policy[p]['slo_attainment'])} / {_ratio(by_policy[p]['gpu_hours_over_oracle'])}"
            if p in by_policy
            else "–"
            for p in policies
        ]
        if frontier:
            entries += frontier_entries(by_policy)
        lines.append(
            f"| {name} | {delay_s:g} s | {any_row['oracle_gpu_hours']:.2f} "
            f"| {'–' if unservable is None else unservable} | " + " | ".join(entries) + " |"
        )
    return "\n".join(lines)


def meets_goal(planner: dict, oracle: dict | None) -> bool:
    attainment, ratio = planner["slo_attainment"], planner["gpu_hours_over_oracle"]
    if attainment is None or ratio is None:
        return False
    good_enough = attainment >= GOAL_ATTAINMENT or (
        oracle is not None
        and oracle["slo_attainment"] is not None
        and attainment >= oracle["slo_attainment"] - GOAL_ORACLE_SLACK
    )
    return good_enough and ratio <= GOAL_COST_RATIO


def goal_summary(rows: Sequence[dict]) -> dict[str, list[str]]:
    """The planner's cells, by the goal: `met` (≥ 99% attainment, or ≥ the oracle's - 0.5
    points, at ≤ 1.15x the oracle's GPU-hours), `missed` (the rest), `below_95` (attainment under
    95%), `worse_than_static` (lower attainment and more GPU-hours than static). Cells are named
    `workload world delay`; empty lists without planner rows. `no_static` names the planner's
    cells that ran no static row (`--policies planner`): they are not compared with static.
    `below_95_servable` names the cells below 95% that reach it over the requests some engine
    count could serve: the others every policy misses, the oracle too. The planner against its
    cell's fixed counts: `beaten_by_fixed`, `no_dearer_than_fixed`, `dearer_than_fixed` and
    `no_fixed` (bench/fixed_frontier.py's `fixed_summary`)."""
    by_cell: dict[tuple[str, str, float], dict[str, dict]] = {}
    for r in rows:
        by_cell.setdefault((r["workload"], r["world"], r["delay_s"]), {})[r["policy"]] = r
    out: dict[str, list[str]] = {
        "met": [],
        "missed": [],
        "below_95": [],
        "worse_than_static": [],
        "no_static": [],
        "below_95_servable": [],
    }
    for (name, world, delay_s), by_policy in by_cell.items():
        planner = by_policy.get("planner")
        if planner is None:
            continue
        label = f"{name} {world} {delay_s:g} s"
        out["met" if meets_goal(planner, by_policy.get("oracle")) else "missed"].append(label)
        attainment = planner["slo_attainment"]
        if attainment is not None and attainment < LOW_ATTAINMENT:
            out["below_95"].append(f"{label} ({attainment:.1%})")
            servable = _servable_attainment(planner)
            if servable is not None and servable >= LOW_ATTAINMENT:
                out["below_95_servable"].append(f"{label} ({servable:.1%} of the servable)")
        static = by_policy.get("static")
        if static is None:
            out["no_static"].append(label)
        elif (
            attainment is not None
            and static["slo_attainment"] is not None
            and attainment < static["slo_attainment"]
            and planner["gpu_hours"] > static["gpu_hours"]
        ):
            out["worse_than_static"].append(
                f"{label} ({attainment:.1%} vs {static['slo_attainment']:.1%}, "
                f"{planner['gpu_hours']:.2f} vs {static['gpu_hours']:.2f} GPU-h)"
            )
    return {**out, **fixed_summary(rows, LOW_ATTAINMENT)}


def _servable_attainment(row: dict) -> float | None:
    """SLO attainment over the requests some engine count could serve (the unservable ones all
    miss: they are late even alone on an idle engine). None where the row does not say."""
    requests, unservable = row.get("requests"), row.get("unservable_requests")
    if not requests or unservable is None or unservable >= requests or row["slo_attainment"] is None:
        return None
    return row["slo_attainment"] * requests / (requests - unservable)


def format_summary(summary: dict[str, list[str]]) -> str:
    total = len(summary["met"]) + len(summary["missed"])
    if not total:
        return "No planner rows: no goal summary."
    lines = [
        f"Goal: planner SLO attainment ≥ {GOAL_ATTAINMENT:.0%} (or ≥ the oracle's − "
        f"{GOAL_ORACLE_SLACK * 100:g} points) at ≤ {GOAL_COST_RATIO:g}x the oracle's GPU-hours.",
        f"- met in {len(summary['met'])} of {total} cells",
        f"- missed in {len(summary['missed'])}: {'; '.join(summary['missed']) or 'none'}",
        f"- below {LOW_ATTAINMENT:.0%} attainment: {len(summary['below_95'])}: "
        f"{'; '.join(summary['below_95']) or 'none'}",
        f"  of them at or above {LOW_ATTAINMENT:.0%} of the requests some engine count could serve: "
        f"{len(summary['below_95_servable'])}: {'; '.join(summary['below_95_servable']) or 'none'}",
        f"- worse than static on both axes: {len(summary['worse_than_static'])}: "
        f"{'; '.join(summary['worse_than_static']) or 'none'}",
    ]
    if summary["no_static"]:
        n = len(summary["no_static"])
        lines[-1] += f" (not compared in {n} cell{'s' * (n != 1)}: no static row in this run)"
    return "\n".join(lines + format_fixed_summary(summary, LOW_ATTAINMENT))


def stamp(command: Sequence[str]) -> dict[str, str]:
    """What a results file is from: the command, the commit (with `+changes` if the tree differs
    from it), the UTC date and the machine."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no", "--", "app", "bench", "examples", "data"):
        commit += "+changes"
    return {
        "command": " ".join(command),
        "commit": commit,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}",
    }


def markdown_file(report: str, made: dict[str, str]) -> str:
    """The report as docs/benchmarks/results.md: what it is from at its top."""
    return (
        "# Decision-quality matrix: results\n\n"
        "Generated, not edited: re-run the command below to replace this file "
        "([benchmarks.md](../benchmarks.md) says what the columns mean).\n\n"
        f"- command: `{made['command']}`\n"
        f"- commit: {made['commit']}\n"
        f"- date: {made['date']}\n"
        f"- machine: {made['machine']}\n\n"
        f"{report.strip()}\n"
    )
