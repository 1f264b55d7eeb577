"""How much of a decision is the tick's phase: the same traffic replayed with its arrivals a
second or more later, so that the planner's 5 s ticks cut it at other instants.

A causal policy reads the traffic through its ticks' counts; shifted by a second, the counts
differ by which bursts fall into which tick, and so does what the planner reads of them (its
burstiness above all: the index of dispersion from a few dozen ticks). The spread of SLO
attainment and GPU-hours across the offsets is how far two runs of the planner on the same
traffic can land apart, and so the closest any replay of a recorded run can be expected to come
(docs/replay-from-store.md). `--hold-dispersion K` holds the burstiness reading at K on every
tick, to show how much of the spread is that reading's.

    .venv/bin/python -m bench.tick_phase [--workload azure-conv-x30] [--duration-s 900] \\
        [--offsets 0,1,2,3,4] [--sizing headroom|attainment] [--hold-dispersion 25]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from typing import Any

from app.core.sla import decide, demand
from app.core.traces import TraceRequest
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
from app.sim.replay.outputs import summarize
from app.sim.replay.run import build_world, make_policy, run_policy
from app.sim.world.workload import WORKLOADS, build_workload


def hold_dispersion(value: float) -> None:
    """Every reading of burstiness returns `value` (both modules that read it)."""

    def held(items: Any, prior_s: float) -> float:
        return value

    decide.dispersion_index = held
    demand.dispersion_index = held


def run_offset(
    requests: list[TraceRequest], offset_s: float, duration_s: float, *, sizing: str | None, delay_s: float
) -> dict[str, float]:
    config = with_overrides(load_replay_config(DEFAULT_REPLAY_CONFIG), startup_delay_s=delay_s)
    if sizing is not None:
        scaling = config.deployment.scaling.model_copy(update={"sizing": sizing})
        deployment = config.deployment.model_copy(update={"scaling": scaling})
        config = dataclasses.replace(config, deployment=deployment)
    shifted = [
        TraceRequest(r.arrival_s + offset_s, r.isl_tokens, r.osl_tokens)
        for r in requests
        if r.arrival_s + offset_s <= duration_s
    ]
    world = build_world(config, shifted)
    policy = make_policy("planner", world)
    summary = summarize(run_policy(world, policy, trace_name=f"+{offset_s:g} s"), truth=world.truth)
    read = [
        float(d)
        for t in policy.ticks
        if (d := ((t.get("sla") or {}).get("demand") or {}).get("dispersion")) is not None
    ]
    return {
        "offset_s": offset_s,
        "requests": len(shifted),
        "slo_attainment": summary["slo_attainment"],
        "gpu_hours": summary["gpu_hours"],
        "gpu_hours_over_oracle": summary["gpu_hours_over_oracle"],
        "dispersion_mean": statistics.fmean(read) if read else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="azure-conv-x30", choices=tuple(WORKLOADS))
    parser.add_argument("--duration-s", type=float, default=900.0, help="seconds replayed (default 900)")
    parser.add_argument("--offsets", default="0,1,2,3,4", help="seconds the arrivals are shifted by")
    parser.add_argument("--sizing", choices=("headroom", "attainment"), default=None)
    parser.add_argument("--delay", type=float, default=120.0, help="start-up delay, s (default 120)")
    parser.add_argument("--hold-dispersion", type=float, default=None, metavar="K")
    args = parser.parse_args(argv)
    try:
        offsets = [float(x) for x in args.offsets.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--offsets: not a list of seconds: {args.offsets!r}")
    if not offsets or any(not o >= 0 for o in offsets):
        parser.error("--offsets: give one or more offsets >= 0")
    if not args.duration_s > 0:
        parser.error("--duration-s: give a positive number of seconds")
    if args.hold_dispersion is not None:
        if not args.hold_dispersion >= 1:
            parser.error("--hold-dispersion: an index of dispersion is at least 1")
        hold_dispersion(args.hold_dispersion)
    requests = build_workload(args.workload)
    rows = []
    print("| offset | requests | SLO attainment | GPU-hours | ÷ oracle | dispersion read (mean) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for offset in offsets:
        row = run_offset(requests, offset, args.duration_s, sizing=args.sizing, delay_s=args.delay)
        rows.append(row)
        print(
            f"| {offset:g} s | {row['requests']:,} | {100 * row['slo_attainment']:.2f}% | "
            f"{row['gpu_hours']:.3f} | {row['gpu_hours_over_oracle']:.3f} | {row['dispersion_mean']:.1f} |",
            flush=True,
        )
    slo = [100 * r["slo_attainment"] for r in rows]
    gpu = [r["gpu_hours"] for r in rows]
    print(
        f"\nspread over {len(rows)} offsets: SLO attainment {min(slo):.2f}-{max(slo):.2f}% "
        f"({max(slo) - min(slo):.2f} points), GPU-hours {min(gpu):.3f}-{max(gpu):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
