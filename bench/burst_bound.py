"""What no causal policy can know before a record burst: two worlds identical until it.

World A is a bursty workload as the matrix replays it (the `profile` world, 120 s start-up). Its
record burst is the first minute, after the first five, whose request count exceeds every earlier
minute's by RECORD_RATIO or more. World B is the same requests with every minute from the record
on thinned to that earlier peak (deterministically: every k-th request of the minute goes), so
that until the record's first request the two worlds are the same traffic on the same engines.

A causal policy therefore makes the same decisions in both until the record begins (checked here
for the planner: its ordered counts tick by tick), and the engines that serve the record's first
start-up are the ones it held before: engines ordered on seeing it serve a start-up later. Either
it held the record's engines before the record (in B too, where nothing needed them: a fixed
count's cost wherever a record could come, which in traffic that bursts from silence is any
quiet minute), or it misses part of the record's first start-up in A. The fixed counts that beat
the planner in A are chosen knowing the record comes; the table shows what the same counts give
in B, and the planner in both.

    .venv/bin/python -m bench.burst_bound [--workloads code-bursts-spread,code-bursts-clustered]
        [--sizing headroom|attainment]
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter

from app.core.traces import TraceRequest
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
from app.sim.replay.policies import FixedPolicy
from app.sim.replay.request_table import request_table
from app.sim.replay.run import World, build_world, make_policy, run_policy
from app.sim.world.workload import build_workload
from bench.fixed_frontier import sweep, sweep_ranges

MINUTE_S = 60.0
RECORD_RATIO = 1.2  # a record: this much above every earlier minute (smaller is the traffic's noise)
SETTLED_MINUTES = 5  # the first minutes are the history's start, not records over it
DELAY_S = 120.0


def minute_counts(requests: list[TraceRequest]) -> Counter[int]:
    return Counter(int(r.arrival_s // MINUTE_S) for r in requests)


def record_minute(requests: list[TraceRequest]) -> tuple[int, int, int] | None:
    """(the record's minute, its count, the earlier peak count); None without a record."""
    counts = minute_counts(requests)
    peak = 0
    for minute in range(max(counts) + 1):
        n = counts.get(minute, 0)
        if minute >= SETTLED_MINUTES and peak > 0 and n >= RECORD_RATIO * peak:
            return minute, n, peak
        peak = max(peak, n)
    return None


def thinned(requests: list[TraceRequest], from_minute: int, peak: int) -> list[TraceRequest]:
    """World B: from `from_minute` on, each minute above `peak` keeps `peak` of its requests, spread
    evenly over its arrivals (the minute's shape stays, its height goes)."""
    by_minute: dict[int, list[TraceRequest]] = {}
    for r in requests:
        by_minute.setdefault(int(r.arrival_s // MINUTE_S), []).append(r)
    out = []
    for minute, items in sorted(by_minute.items()):
        if minute < from_minute or len(items) <= peak:
            out += items
            continue
        step = len(items) / peak
        out += [items[int(i * step)] for i in range(peak)]
    return out


def world(name: str, requests: list[TraceRequest], sizing: str, initial: dict[str, int] | None) -> World:
    config = with_overrides(load_replay_config(DEFAULT_REPLAY_CONFIG), startup_delay_s=DELAY_S)
    if initial is not None:
        # B starts where A does: the same counts, so that the two worlds differ only by the record.
        simulation = config.simulation.model_copy(
            update={"initial_prefill": initial["prefill"], "initial_decode": initial["decode"]}
        )
        config = dataclasses.replace(config, simulation=simulation)
    scaling = config.deployment.scaling.model_copy(update={"sizing": sizing})
    config = dataclasses.replace(config, deployment=config.deployment.model_copy(update={"scaling": scaling}))
    return build_world(config, requests)


def summary(w: World, result) -> dict:
    table = request_table(result.requests, result.ttft_target_ms, result.itl_target_ms)
    return {
        "slo_attainment": float(table.met_slo.mean()),
        "ttft_attainment": float(table.met_ttft.mean()),
        "itl_attainment": float(table.met_itl.mean()),
        "gpu_hours": result.gpu_hours,
    }


def planner_run(w: World, name: str) -> tuple[dict, list[tuple[float, dict]], dict, float]:
    runner = make_policy("planner", w)
    orders: list[tuple[float, dict]] = []
    tick = runner.tick

    def recording(now_s, cluster):
        step = tick(now_s, cluster)
        orders.append((now_s, dict(step.target or {})))
        return step

    runner.tick = recording
    result = run_policy(w, runner, trace_name=name)
    return summary(w, result), orders, runner.initial(), runner.first_tick_s()


def fixed_run(w: World, name: str, initial: dict, first_tick_s: float, prefill: int, decode: int) -> dict:
    policy = FixedPolicy(initial, {"prefill": prefill, "decode": decode}, first_tick_s=first_tick_s)
    return summary(w, run_policy(w, policy, trace_name=name))


def two_worlds(name: str, sizing: str) -> list[str]:
    """One workload's table rows: the planner in A and B, and the cheapest fixed counts of A's
    sweep that beat it there (or the sweep's cheapest), replayed in B as well."""
    requests = build_workload(name)
    found = record_minute(requests)
    if found is None:
        return [f"| {name} | none | | | | |"]
    minute, count, peak = found
    world_a = world(name, requests, sizing, None)
    planner_a, orders_a, initial, first_tick_s = planner_run(world_a, name)
    world_b = world(name, thinned(requests, minute, peak), sizing, initial)
    planner_b, orders_b, _, _ = planner_run(world_b, name)
    onset_s = min(r.arrival_s for r in requests if r.arrival_s >= minute * MINUTE_S)
    before_a = [o for o in orders_a if o[0] <= onset_s]
    same = "same" if before_a == [o for o in orders_b if o[0] <= onset_s] else "DIFFERENT"

    def cells(world_name: str, policy: str, run: dict) -> str:
        return f"{world_name} | {policy} | {run['slo_attainment']:.1%} | {run['gpu_hours']:.2f} |"

    out = [
        f"| {name} | minute {minute}: {count} requests, {count / peak:.2f}x the earlier peak {peak} | "
        + cells("A", "planner", planner_a),
        f"| | decisions before it: {same} ({len(before_a)} ticks) | " + cells("B", "planner", planner_b),
    ]

    def replay_a(prefill: int, decode: int) -> dict:
        run = fixed_run(world_a, name, initial, first_tick_s, prefill, decode)
        return {**run, "fixed": {"prefill": prefill, "decode": decode}}

    d = world_a.config.deployment
    bounds = {role: (d.role(role).min_replicas, d.role(role).max_replicas) for role in ("prefill", "decode")}
    rows = sweep(
        replay_a,
        sweep_ranges(world_a.oracle.schedule, bounds),
        target=planner_a["slo_attainment"],
        planner_gpu_hours=planner_a["gpu_hours"],
        gpus_per_engine=world_a.gpus_per_engine,
    )
    beating = [
        r
        for r in rows
        if r["gpu_hours"] <= planner_a["gpu_hours"] * 0.97
        and r["slo_attainment"] >= planner_a["slo_attainment"] - 0.001
    ]
    for r in sorted(beating or rows, key=lambda r: r["gpu_hours"])[:3]:
        prefill, decode = r["fixed"]["prefill"], r["fixed"]["decode"]
        in_b = fixed_run(world_b, name, initial, first_tick_s, prefill, decode)
        tag = "beats the planner in A" if r in beating else "cheapest of the sweep"
        out.append(f"| | {tag} | " + cells("A", f"fixed {prefill}/{decode}", r))
        out.append("| | | " + cells("B", f"fixed {prefill}/{decode}", in_b))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="code-bursts-spread,code-bursts-clustered")
    parser.add_argument("--sizing", choices=("headroom", "attainment"), default="headroom")
    args = parser.parse_args()
    print(f"start-up {DELAY_S:.0f} s, world profile, sizing {args.sizing}\n")
    print("| workload | record | world | policy | SLO attainment | GPU-hours |")
    print("|---|---|---|---|---:|---:|")
    for name in args.workloads.split(","):
        print("\n".join(two_worlds(name, args.sizing)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
