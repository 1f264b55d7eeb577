"""Why a planner cell misses the goal: its SLO misses and its GPU-hours taken apart.

For one replay (its result, the planner's tick records, the world it ran in):

- **misses**, every request that missed its SLO counted once, as
  - `unservable`: no allocation could serve it in this world (`app.sim.outputs.unservable_mask`);
  - `starting`: it arrived (a TTFT miss) or reached decode (an ITL miss) while its role had fewer
    engines serving than the planner's target: engines it had ordered were still starting, the
    lead's share;
  - `serving`: every engine the planner had ordered for its role was serving: the planner sized
    too few, or the request queued behind a backlog left on the engine it was routed to.
- **cost by role**: the planner's engine-seconds over the oracle's, per role.
- **beyond the load now**: of the engine-seconds the planner targeted, the share above what the
  load measured at that tick needed (`app.core.fleet.value.present_need`): the forecast's headroom,
  a quiet period's keep and the scale-down window, together.

Ticks and timelines are step functions: a value holds until the next change.
`bench/replay_quality.py` adds the breakdown to each planner row and prints it for the cells that
miss; run alone, this prints that table again from a saved matrix:

    .venv/bin/python -m bench.miss_causes [bench/results/replay_quality.json]
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.core.fleet.value import present_need
from app.sim.replay.outputs import unservable_mask
from app.sim.replay.request_table import RequestTable
from app.sim.replay.results import ReplayResult
from app.sim.world.cluster import ROLES
from app.sim.world.truth import TruthModel
from bench.matrix_report import goal_summary
from bench.matrix_results import saved_rows


def _role_steps(result: ReplayResult, role: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    samples = [s for s in result.timeline if s.role == role]
    return (
        np.array([s.at_s for s in samples], dtype=float),
        np.array([s.ready for s in samples], dtype=np.int64),
        np.array([s.target for s in samples], dtype=np.int64),
    )


def _short_at(result: ReplayResult, role: str, times_s: np.ndarray) -> np.ndarray:
    """Per time: did the role have fewer engines serving than its target then?"""
    at_s, ready, target = _role_steps(result, role)
    if at_s.size == 0:
        return np.zeros(times_s.size, dtype=bool)
    index = np.searchsorted(at_s, times_s, side="right") - 1
    valid = index >= 0
    index = np.maximum(index, 0)
    return valid & (ready[index] < target[index])


def miss_causes(result: ReplayResult, table: RequestTable, truth: TruthModel) -> dict[str, int]:
    unservable = unservable_mask(
        result.requests, truth, ttft_target_ms=result.ttft_target_ms, itl_target_ms=result.itl_target_ms
    )
    missed = ~table.met_slo & ~unservable
    ttft_missed = missed & ~table.met_ttft
    itl_missed = missed & table.met_ttft  # the first token came in time, the rest did not
    first_token_s = table.arrival_s + table.ttft_ms / 1000.0
    starting = np.zeros(len(table), dtype=bool)
    starting[ttft_missed] = _short_at(result, "prefill", table.arrival_s[ttft_missed])
    starting[itl_missed] = _short_at(result, "decode", first_token_s[itl_missed])
    return {
        "unservable": int((~table.met_slo & unservable).sum()),
        "starting": int(starting.sum()),
        "serving": int((missed & ~starting).sum()),
    }


def _engine_s(steps: Sequence[tuple[float, int]], end_s: float) -> float:
    total = 0.0
    ends = [at_s for at_s, _ in steps[1:]] + [end_s]
    for (at_s, count), next_s in zip(steps, ends, strict=False):
        total += count * max(0.0, min(next_s, end_s) - at_s)
    return total


def _oracle_end_s(result: ReplayResult) -> float:
    """The oracle's billing horizon, which its timeline leaves implicit: its last step holds until
    the integral of its GPUs meets `oracle_gpu_hours`."""
    steps = result.oracle_timeline
    if not steps:
        return 0.0

    def gpus(step: Any) -> int:
        return sum(count * result.gpus_per_engine.get(role, 1) for role, count in step.billed.items())

    gpu_s = sum(gpus(a) * (b.at_s - a.at_s) for a, b in zip(steps, steps[1:], strict=False))
    last = gpus(steps[-1])
    remaining_s = result.oracle_gpu_hours * 3600.0 - gpu_s
    return steps[-1].at_s + (remaining_s / last if last > 0 else 0.0)


def cost_by_role(result: ReplayResult) -> dict[str, float | None]:
    """Per role, the planner's billed engine-seconds over the oracle's (None: the oracle has none)."""
    oracle_end_s = _oracle_end_s(result)
    out: dict[str, float | None] = {}
    for role in ROLES:
        mine = [(s.at_s, s.billed) for s in result.timeline if s.role == role]
        oracle = [(s.at_s, s.billed.get(role, 0)) for s in result.oracle_timeline]
        theirs = _engine_s(oracle, oracle_end_s)
        out[role] = _engine_s(mine, result.end_s) / theirs if theirs > 0 else None
    return out


def beyond_load_now(ticks: Sequence[Mapping[str, Any]], itl_target_ms: float) -> float | None:
    """The share of the targeted engine-seconds above the load measured at each tick's need
    (None: no tick sized anything)."""
    above = total = 0.0
    for tick, following in zip(ticks, ticks[1:], strict=False):
        target = tick.get("target") or {}
        now = present_need(tick.get("sla"), itl_target_ms=itl_target_ms)
        if now is None or not target:
            continue
        dt = float(following["at_s"]) - float(tick["at_s"])
        for role, count in target.items():
            if role in now:
                total += count * dt
                above += max(0, count - now[role]) * dt
    return above / total if total > 0 else None


def why(
    result: ReplayResult, table: RequestTable, truth: TruthModel, ticks: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The three views of one planner replay, JSON-ready."""
    return {
        "misses": miss_causes(result, table, truth),
        "cost_by_role": cost_by_role(result),
        "beyond_load_now": beyond_load_now(ticks, result.itl_target_ms),
    }


def format_why(rows: Sequence[Mapping[str, Any]], missed: Sequence[str]) -> str:
    """A markdown table of the planner's missed cells (labels as in the goal summary)."""
    lines = [
        "| cell | attainment / ÷ oracle | misses: unservable / starting / serving (% of requests) "
        "| ÷ oracle: prefill / decode | beyond the load now |",
        "|---|---|---|---|---:|",
    ]
    wanted = set(missed)
    for r in rows:
        label = f"{r['workload']} {r['world']} {r['delay_s']:g} s"
        if r["policy"] != "planner" or label not in wanted or "why" not in r:
            continue
        w, n = r["why"], max(r["requests"], 1)
        m, c = w["misses"], w["cost_by_role"]
        beyond = w["beyond_load_now"]
        lines.append(
            f"| {label} | {r['slo_attainment']:.1%} / {r['gpu_hours_over_oracle']:.2f} "
            f"| {m['unservable'] / n:.1%} / {m['starting'] / n:.1%} / {m['serving'] / n:.1%} "
            f"| {_ratio(c.get('prefill'))} / {_ratio(c.get('decode'))} "
            f"| {'–' if beyond is None else f'{beyond:.0%}'} |"
        )
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def main(argv: Sequence[str]) -> int:
    path, rows, status = saved_rows(argv)
    if rows is None:
        return status
    missed = goal_summary(rows)["missed"]
    print(f"{len(missed)} planner cells miss the goal in {path}:\n")
    print(format_why(rows, missed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
