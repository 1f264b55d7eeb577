"""The fixed-count frontier of a matrix cell, and whether a fixed count beats the planner.

A fixed count `P/D` (P prefill engines, D decode) is replayed as `app.sim.policies.FixedPolicy`:
the run starts from the same allocation as every other policy of the cell (the oracle's initial
counts, `make_policy`'s start), and at the planner's own first tick (`EmbeddedPlanner.
initial_tick_s()`: t = 5 s with examples/replay.yaml, SLA scaling's interval) it orders P/D and
holds it to the end. Engines above the start serve a start-up delay after that tick; engines
beyond P/D go at once. The same tick as the planner, rather than t = 0, so that a fixed count
and the planner order their first engines at the same instant.

**The sweep** (`sweep`), at most MAX_FIXED_REPLAYS replays per cell. Each role's range runs from
its oracle's time-weighted mean count (fewer engines than the mean cannot keep up on average)
to SPAN_OVER_PEAK times its oracle's peak (`sweep_ranges`). In a disaggregated simulator the
roles are nearly separable: a request's TTFT depends on the prefill count and its ITL on the
decode count. So:

1. `P_hi/D_hi`, the top of both ranges: the best attainment a fixed count reaches here.
2. The prefill axis with decode held at D_hi (plenty): bisection for the fewest prefill
   engines whose TTFT attainment reaches the target less BEATEN_ATTAINMENT_SLACK; then the
   decode axis with prefill held at P_hi, on ITL attainment. SLO attainment is at most either
   of the two, so (as long as more engines of the other role do not lower it) no fixed count
   with fewer engines of a role comes within that slack of the target: `P*/D*` is a lower
   bound. About log2(range) replays per axis (1 to 5 on the matrix's workloads).
3. An ascent from `P*/D*`: replay it, and while its SLO attainment is below the target add one
   engine to the role that misses more (prefill if its TTFT attainment is the lower, decode
   otherwise). Once the target is reached, keep climbing while the next step is still no
   dearer than the planner and the gain is under BEATEN_ATTAINMENT_GAIN (when step 1 shows that
   much more is to be had), to find a fixed count with more attainment at the planner's cost.

The target is the planner's attainment in the cell (the oracle's without a planner row). Every
number reported is a replay's; the sweep only chooses which counts to replay, so an ascent
that misses a cheaper neighbour (one engine less of the other role) can only favour the
planner. Replays are cached in-process per cell and count (`bench/replay_quality.py`).

Run alone, this prints the frontier columns again from a saved matrix:

    .venv/bin/python -m bench.fixed_frontier [bench/results/replay_quality.json]
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.sim.replay.policies import FixedPolicy
from app.sim.replay.results import ReplayResult
from app.sim.replay.run import World, make_policy, run_policy
from bench.matrix_results import saved_rows

# "Beaten on both axes": a fixed count with attainment at most BEATEN_ATTAINMENT_SLACK lower
# than the planner's at BEATEN_COST_SAVING fewer GPU-hours or more, or BEATEN_ATTAINMENT_GAIN
# higher at no more GPU-hours. These are decision thresholds: 0.1 point (a fifth of the goal's
# 0.5-point oracle slack) is a loss worth taking for 3% of the GPUs, and 0.3 point more for
# nothing is a gain worth taking; gaps smaller than these are no case for holding a fixed count
# instead of autoscaling.
BEATEN_ATTAINMENT_SLACK = 0.001
BEATEN_COST_SAVING = 0.03
BEATEN_ATTAINMENT_GAIN = 0.003
# Replays per cell. A fixed replay takes 4 to 18 s of CPU (diurnal to servegen-day1, the
# largest workload); measured sweeps: diurnal 8 replays in 40 s, servegen-day1 10 in 158 s, about
# as much again as the cell's five policies.
MAX_FIXED_REPLAYS = 14
# The top of a role's range, over its oracle's peak count.
SPAN_OVER_PEAK = 1.5
# Float tolerance for the predicates: exactly 0.1 point lower or exactly 3% cheaper counts.
_EPS = 1e-9

FIXED_PREFIX = "fixed "
ROLES = ("prefill", "decode")

Replay = Callable[[int, int], dict]  # (prefill, decode) -> the run's matrix row


def is_fixed(row: Mapping[str, Any]) -> bool:
    return str(row.get("policy", "")).startswith(FIXED_PREFIX)


# --- the sweep ----------------------------------------------------------------------------------


def sweep_ranges(
    schedules: Mapping[str, Any], bounds: Mapping[str, tuple[int, int]] | None = None
) -> dict[str, tuple[int, int]]:
    """Per role, (low, high) counts to sweep: from the oracle schedule's time-weighted mean
    count (floored) to SPAN_OVER_PEAK times its peak (ceiled), within the role's min/max
    replicas. `schedules`: role -> `app.sim.oracle.OracleSchedule` (steps, horizon_s)."""
    out = {}
    for role in ROLES:
        s = schedules[role]
        ends = [t for t, _ in s.steps[1:]] + [s.horizon_s]
        engine_s = sum(count * max(0.0, end - t) for (t, count), end in zip(s.steps, ends, strict=True))
        mean = engine_s / s.horizon_s if s.horizon_s > 0 else 0.0
        peak = max((count for _, count in s.steps), default=0)
        low, high = max(1, math.floor(mean)), math.ceil(SPAN_OVER_PEAK * peak)
        if bounds is not None and role in bounds:
            min_replicas, max_replicas = bounds[role]
            low, high = max(low, min_replicas), min(high, max_replicas)
        out[role] = (low, max(low, high))
    return out


def sweep(
    replay: Replay,
    ranges: Mapping[str, tuple[int, int]],
    *,
    target: float,
    planner_gpu_hours: float | None = None,
    gpus_per_engine: Mapping[str, int] | None = None,
    budget: int = MAX_FIXED_REPLAYS,
) -> list[dict]:
    """The fixed counts the module docstring's three steps replay, at most `budget` of them;
    their rows in replay order. `replay(prefill, decode)` runs one (or answers from a cache)."""
    runs: dict[tuple[int, int], dict] = {}
    gpus = {role: (gpus_per_engine or {}).get(role, 1) for role in ROLES}

    def run(p: int, d: int) -> dict | None:
        if (p, d) not in runs:
            if len(runs) >= budget:
                return None
            runs[(p, d)] = replay(p, d)
        return runs[(p, d)]

    (p_lo, p_hi), (d_lo, d_hi) = ranges["prefill"], ranges["decode"]
    top = run(p_hi, d_hi)
    if top is None:
        return []
    # Climbing past the target for BEATEN_ATTAINMENT_GAIN more is pointless where the top of
    # both ranges does not have that much.
    gain_reachable = (top["slo_attainment"] or 0.0) >= target + BEATEN_ATTAINMENT_GAIN - _EPS
    floor = target - BEATEN_ATTAINMENT_SLACK - _EPS

    def fewest(low: int, high: int, at: Callable[[int], tuple[int, int]], metric: str) -> int:
        # The smallest count in [low, high] whose `metric` reaches `floor`, assuming it rises with
        # the count; `high` when even the top misses, or when the budget ends the search.
        at_high = runs[at(high)][metric]
        if at_high is None or at_high < floor:
            return high
        while low < high:
            mid = (low + high) // 2
            r = run(*at(mid))
            if r is None:
                break
            if r[metric] is not None and r[metric] >= floor:
                high = mid
            else:
                low = mid + 1
        return high

    p = fewest(p_lo, p_hi, lambda n: (n, d_hi), "ttft_attainment")
    d = fewest(d_lo, d_hi, lambda n: (p_hi, n), "itl_attainment")
    while (r := run(p, d)) is not None:
        attainment = r["slo_attainment"] or 0.0
        ttft, itl = r["ttft_attainment"] or 0.0, r["itl_attainment"] or 0.0
        # The role that misses more first; the other when it is at the top of its range.
        order = ("prefill", "decode") if ttft <= itl else ("decode", "prefill")
        role = next((x for x in order if (p if x == "prefill" else d) < ranges[x][1]), None)
        if role is None:
            break
        if attainment >= target - _EPS:
            gained = attainment >= target + BEATEN_ATTAINMENT_GAIN - _EPS
            if planner_gpu_hours is None or gained or not gain_reachable:
                break
            engine_gpus = p * gpus["prefill"] + d * gpus["decode"]
            next_cost = r["gpu_hours"] * (engine_gpus + gpus[role]) / max(engine_gpus, 1)
            if next_cost > planner_gpu_hours * (1 + _EPS):
                break
        p, d = (p + 1, d) if role == "prefill" else (p, d + 1)
    return list(runs.values())


# Fixed-count rows already replayed in this process, by cell, start and counts.
_FIXED_RUNS: dict[tuple, dict] = {}


def fixed_rows(
    world: World,
    base: Mapping[str, Any],
    make_row: Callable[[str, ReplayResult, float], dict],
    *,
    cell_rows: Sequence[Mapping[str, Any]],
    start: tuple[dict[str, int], float] | None,
    no_reference: float,
) -> list[dict]:
    """One cell's sweep, its rows sorted by prefill then decode count, each with the counts under
    `fixed` and how the sweep went under `sweep`. `base`: the cell's row fields (workload, world,
    delay_s, ...); `make_row(policy, result, cpu_s)`: a run's matrix row; `cell_rows`: the cell's
    other rows (the target is the planner's attainment, else the oracle's, else `no_reference`);
    `start`: the planner's initial counts and first tick (None: built here, as the planner's)."""
    started, cpu_started = time.perf_counter(), time.process_time()
    if start is None:
        planner_policy = make_policy("planner", world)
        start = (planner_policy.initial(), planner_policy.first_tick_s())
    initial, first_tick_s = start
    by_policy = {r["policy"]: r for r in cell_rows}
    planner = by_policy.get("planner")
    reference = planner or by_policy.get("oracle")
    target = no_reference if reference is None else reference["slo_attainment"] or 0.0
    cell = (base["workload"], base["world"], base["delay_s"], tuple(sorted(initial.items())), first_tick_s)

    def replay(prefill: int, decode: int) -> dict:
        if (*cell, prefill, decode) not in _FIXED_RUNS:
            cpu_s = time.process_time()
            policy = FixedPolicy(initial, {"prefill": prefill, "decode": decode}, first_tick_s=first_tick_s)
            result = run_policy(world, policy, trace_name=base["workload"])
            row = make_row(policy.name, result, time.process_time() - cpu_s)
            _FIXED_RUNS[(*cell, prefill, decode)] = {**row, "fixed": dict(policy.target)}
        return dict(_FIXED_RUNS[(*cell, prefill, decode)])

    d = world.config.deployment
    bounds = {role: (d.role(role).min_replicas, d.role(role).max_replicas) for role in ROLES}
    ranges = sweep_ranges(world.oracle.schedule, bounds)
    swept = sweep(
        replay,
        ranges,
        target=target,
        planner_gpu_hours=None if planner is None else planner["gpu_hours"],
        gpus_per_engine=world.gpus_per_engine,
    )
    how = {
        "target": target,
        "ranges": {role: list(span) for role, span in ranges.items()},
        "first_tick_s": first_tick_s,
        "replays": len(swept),
        "wall_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu_started,
    }
    swept.sort(key=lambda r: (r["fixed"]["prefill"], r["fixed"]["decode"]))
    return [{**r, "sweep": how} for r in swept]


# --- the frontier of a cell ----------------------------------------------------------------------


def beats(fixed: Mapping[str, Any], planner: Mapping[str, Any]) -> bool:
    """Does the fixed run beat the planner's on both axes (the BEATEN_* constants)?"""
    a, b = fixed.get("slo_attainment"), planner.get("slo_attainment")
    cost, planner_cost = fixed.get("gpu_hours"), planner.get("gpu_hours")
    if a is None or b is None or cost is None or planner_cost is None:
        return False
    cheaper = (
        a >= b - BEATEN_ATTAINMENT_SLACK - _EPS and cost <= planner_cost * (1 - BEATEN_COST_SAVING) + _EPS
    )
    better = a >= b + BEATEN_ATTAINMENT_GAIN - _EPS and cost <= planner_cost + _EPS
    return cheaper or better


def pareto(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The runs no other run matches on attainment at no more GPU-hours, cheapest first."""
    out: list[Mapping[str, Any]] = []
    ranked = sorted(
        (r for r in rows if r.get("slo_attainment") is not None),
        key=lambda r: (r["gpu_hours"], -r["slo_attainment"]),
    )
    for r in ranked:
        if not out or r["slo_attainment"] > out[-1]["slo_attainment"]:
            out.append(r)
    return out


def cheapest_reaching(rows: Sequence[Mapping[str, Any]], attainment: float) -> Mapping[str, Any] | None:
    """The cheapest run with SLO attainment at least `attainment` (None: none reaches it)."""
    reaching = [r for r in rows if r.get("slo_attainment") is not None and r["slo_attainment"] >= attainment]
    return min(reaching, key=lambda r: (r["gpu_hours"], -r["slo_attainment"]), default=None)


def best(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The run with the highest SLO attainment, the cheapest of equals."""
    ranked = [r for r in rows if r.get("slo_attainment") is not None]
    return min(ranked, key=lambda r: (-r["slo_attainment"], r["gpu_hours"]), default=None)


def _point(row: Mapping[str, Any] | None) -> dict | None:
    if row is None:
        return None
    keys = ("policy", "slo_attainment", "gpu_hours", "gpu_hours_over_oracle")
    return {k: row.get(k) for k in keys}


def cell_frontier(by_policy: Mapping[str, Mapping[str, Any]]) -> dict | None:
    """One cell's fixed runs against its planner (rows by policy name; None: no fixed runs).
    `cheapest_reaching_planner` and `beaten_by` are None without a planner row; `beaten_by` is
    the cheapest fixed run that beats it; `planner_no_dearer` says whether the planner's GPU-hours
    are at most those of the cheapest fixed run reaching its attainment (True when none does)."""
    fixed = [r for r in by_policy.values() if is_fixed(r)]
    if not fixed:
        return None
    out: dict[str, Any] = {
        "swept": len(fixed),
        "pareto": [_point(r) for r in pareto(fixed)],
        "best": _point(best(fixed)),
        "cheapest_reaching_planner": None,
        "beaten_by": None,
        "planner_no_dearer": None,
        "sweep": fixed[0].get("sweep"),
    }
    planner = by_policy.get("planner")
    if planner is not None and planner.get("slo_attainment") is not None:
        reaching = cheapest_reaching(fixed, planner["slo_attainment"])
        beating = [r for r in fixed if beats(r, planner)]
        out["cheapest_reaching_planner"] = _point(reaching)
        out["beaten_by"] = _point(min(beating, key=lambda r: r["gpu_hours"], default=None))
        out["planner_no_dearer"] = reaching is None or planner["gpu_hours"] <= reaching["gpu_hours"] + _EPS
    return out


def by_cell(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, float], dict[str, Mapping[str, Any]]]:
    cells: dict[tuple[str, str, float], dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["workload"], r["world"], r["delay_s"]), {})[r["policy"]] = r
    return cells


def frontiers(rows: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Every cell's `cell_frontier`, for the JSON record (cells without fixed runs left out)."""
    out = []
    for (name, world, delay_s), by_policy in by_cell(rows).items():
        frontier = cell_frontier(by_policy)
        if frontier is not None:
            out.append({"workload": name, "world": world, "delay_s": delay_s, **frontier})
    return out


# --- the report ----------------------------------------------------------------------------------

FRONTIER_COLUMNS = ("cheapest fixed ≥ planner", "best fixed", "beaten by fixed")


def _count(point: Mapping[str, Any]) -> str:
    return str(point["policy"]).removeprefix(FIXED_PREFIX)


def _pair(row: Mapping[str, Any]) -> str:
    """`attainment / ÷ oracle`, as bench/replay_quality.py's tables show a run."""
    attainment, ratio = row.get("slo_attainment"), row.get("gpu_hours_over_oracle")
    return (
        f"{'–' if attainment is None else f'{attainment:.1%}'} / {'–' if ratio is None else f'{ratio:.2f}'}"
    )


def _at(point: Mapping[str, Any]) -> str:
    return f"{_count(point)}: {_pair(point)}"


def frontier_entries(by_policy: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A cell's FRONTIER_COLUMNS entries (`P/D: attainment / ÷ oracle`); `–` where there is
    nothing to say, `none of N` when no fixed run of the N swept reaches the planner."""
    frontier = cell_frontier(by_policy)
    if frontier is None:
        return ["–"] * len(FRONTIER_COLUMNS)
    has_planner = "planner" in by_policy
    reaching, beaten = frontier["cheapest_reaching_planner"], frontier["beaten_by"]
    return [
        _at(reaching) if reaching else (f"none of {frontier['swept']}" if has_planner else "–"),
        _at(frontier["best"]) if frontier["best"] else "–",
        _at(beaten) if beaten else "-",
    ]


FIXED_SUMMARY_KEYS = ("beaten_by_fixed", "no_dearer_than_fixed", "dearer_than_fixed", "no_fixed")


def fixed_summary(rows: Sequence[Mapping[str, Any]], low_attainment: float) -> dict[str, list[str]]:
    """The planner's cells against their fixed runs: `beaten_by_fixed` (labels with both runs),
    `no_dearer_than_fixed` (the planner at or above `low_attainment` at no more GPU-hours than
    the cheapest fixed run reaching its attainment), `dearer_than_fixed` (the other compared
    cells, and why), `no_fixed` (planner cells without fixed runs)."""
    out: dict[str, list[str]] = {key: [] for key in FIXED_SUMMARY_KEYS}
    for (name, world, delay_s), by_policy in by_cell(rows).items():
        planner = by_policy.get("planner")
        if planner is None:
            continue
        label = f"{name} {world} {delay_s:g} s"
        frontier = cell_frontier(by_policy)
        if frontier is None:
            out["no_fixed"].append(label)
            continue
        attainment = planner["slo_attainment"]
        if attainment is None:
            out["dearer_than_fixed"].append(f"{label} (no attainment)")
            continue
        mine = f"{attainment:.1%} at {planner['gpu_hours']:.2f} GPU-h"
        beaten = frontier["beaten_by"]
        if beaten is not None:
            out["beaten_by_fixed"].append(
                f"{label} ({beaten['policy']}: {beaten['slo_attainment']:.1%} at "
                f"{beaten['gpu_hours']:.2f} GPU-h vs {mine})"
            )
        reaching = frontier["cheapest_reaching_planner"]
        versus = (
            f"no fixed count of the {frontier['swept']} swept reaches {attainment:.1%}"
            if reaching is None
            else f"{planner['gpu_hours']:.2f} vs {reaching['gpu_hours']:.2f} GPU-h for {reaching['policy']}"
        )
        if attainment >= low_attainment and frontier["planner_no_dearer"]:
            out["no_dearer_than_fixed"].append(f"{label} ({versus})")
        else:
            why = f"{attainment:.1%}" if attainment < low_attainment else versus
            out["dearer_than_fixed"].append(f"{label} ({why})")
    return out


def format_fixed_summary(summary: Mapping[str, list[str]], low_attainment: float) -> list[str]:
    """The goal summary's lines on fixed counts; none when no cell swept any (or the summary,
    saved before fixed sweeps, has no such keys)."""
    summary = {key: summary.get(key, []) for key in FIXED_SUMMARY_KEYS}
    compared = len(summary["no_dearer_than_fixed"]) + len(summary["dearer_than_fixed"])
    if not compared:
        return []
    lines = [
        f"- beaten on both axes by a fixed count (≤ {BEATEN_ATTAINMENT_SLACK * 100:g} point less "
        f"attainment at ≥ {BEATEN_COST_SAVING:.0%} fewer GPU-hours, or ≥ {BEATEN_ATTAINMENT_GAIN * 100:g} "
        f"point more at no more): {len(summary['beaten_by_fixed'])} of {compared} cells: "
        f"{'; '.join(summary['beaten_by_fixed']) or 'none'}",
        f"- ≥ {low_attainment:.0%} at no more GPU-hours than the cheapest fixed count reaching the "
        f"same attainment: {len(summary['no_dearer_than_fixed'])} of {compared} cells: "
        f"{'; '.join(summary['no_dearer_than_fixed']) or 'none'}",
        f"  not: {len(summary['dearer_than_fixed'])}: {'; '.join(summary['dearer_than_fixed']) or 'none'}",
    ]
    if summary["no_fixed"]:
        n = len(summary["no_fixed"])
        lines[0] += f" (not compared in {n} cell{'s' * (n != 1)}: no fixed sweep in this run)"
    return lines


def main(argv: Sequence[str]) -> int:
    path, rows, status = saved_rows(argv)
    if rows is None:
        return status
    lines = ["| cell | planner | " + " | ".join(FRONTIER_COLUMNS) + " |", "|---|---|---|---|---|"]
    for (name, world, delay_s), by_policy in by_cell(rows).items():
        if not any(is_fixed(r) for r in by_policy.values()):
            continue
        planner = by_policy.get("planner")
        mine = "–" if planner is None else _pair(planner)
        lines.append(
            f"| {name} {world} {delay_s:g} s | {mine} | " + " | ".join(frontier_entries(by_policy)) + " |"
        )
    if len(lines) == 2:
        print(f"no fixed-count runs in {path}: run python -m bench.replay_quality with --policies ...,fixed")
        return 0
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
