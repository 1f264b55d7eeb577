"""Requests cut off by scale-down, with and without the planner naming its victims.

Lowering a replica count lets the cluster pick the engines to remove. With a termination grace
period (`simulation.removal_grace_s`) a removed engine takes no new work and stops when empty or
when its grace ends, cutting off what it still holds. Each workload is replayed with the planner
(SLA scaling, `examples/replay.yaml`) twice per grace period: with the cluster honouring the
engines the planner names (`remove` in its decisions: idle first, then least work in flight), and
without (the cluster removes the youngest ready engines, as Kubernetes' ReplicaSet controller
does). Grace 0 s is a worker that aborts what it holds on SIGTERM; 30 s is Kubernetes' default
grace period for a worker that finishes its requests first. Nothing here chooses a setting: the
table reports both forms on every workload.

    .venv/bin/python -m bench.removal_cutoffs [--workloads a,b] [--grace-s 0,30] [--workers 2]
        [--markdown docs/benchmarks/removals.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench.matrix_report import stamp

WORKLOADS = (
    "azure-conv-x30",
    "diurnal",
    "heavy-tail-output",
    "long-prompt",
    "code-bursts-clustered",
    "code-bursts-spread",
)
GRACE_S = (0.0, 30.0)


def replay(workload: str, grace_s: float, hints: bool) -> dict:
    from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
    from app.sim.replay.outputs import summarize
    from app.sim.replay.run import build_world, load_models, make_policy, run_policy
    from app.sim.world.workload import build_workload

    config = with_overrides(
        load_replay_config(DEFAULT_REPLAY_CONFIG), removal_grace_s=grace_s, removal_hints=hints
    )
    requests = build_workload(workload)
    world = build_world(config, requests, load_models(config))
    result = run_policy(world, make_policy("planner", world), trace_name=workload)
    s = summarize(result)
    return {
        "workload": workload,
        "grace_s": grace_s,
        "hints": hints,
        "requests": s["requests"],
        "cut_off": s["cut_off"],
        "slo": s["slo_attainment"],
        "gpu_hours": s["gpu_hours"],
    }


def table(rows: list[dict]) -> str:
    by = {(r["workload"], r["grace_s"], r["hints"]): r for r in rows}
    lines = [
        "| workload | grace | requests | cut off, cluster's choice | cut off, planner's hint | "
        "SLO attainment, cluster's / hint | GPU-hours, cluster's / hint |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for workload, grace_s, _ in sorted(
        {k for k in by if not k[2]}, key=lambda k: (k[1], WORKLOADS.index(k[0]))
    ):
        off, on = by[(workload, grace_s, False)], by[(workload, grace_s, True)]
        lines.append(
            f"| {workload} | {grace_s:g} s | {off['requests']} | {off['cut_off']} | {on['cut_off']} | "
            f"{off['slo']:.2%} / {on['slo']:.2%} | {off['gpu_hours']:.2f} / {on['gpu_hours']:.2f} |"
        )
    total = {h: sum(r["cut_off"] for r in rows if r["hints"] is h) for h in (False, True)}
    lines.append(
        f"\nCut off in all: {total[False]} with the cluster's choice, {total[True]} with the planner's hint."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--grace-s", default=",".join(f"{g:g}" for g in GRACE_S))
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--markdown", help="also write the table, stamped, to this file")
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"--workloads: unknown {', '.join(unknown)} (choose from {', '.join(WORKLOADS)})")
    try:
        graces = [float(g) for g in args.grace_s.split(",") if g]
    except ValueError:
        parser.error(f"--grace-s: expected seconds separated by commas, got {args.grace_s!r}")
    if any(g < 0 for g in graces):
        parser.error("--grace-s: a grace period is >= 0 s")
    jobs = [(w, g, h) for w in workloads for g in graces for h in (False, True)]
    started = time.perf_counter()
    rows = []
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        for row in pool.map(replay, *zip(*jobs, strict=True)):
            rows.append(row)
            print(
                f"{row['workload']} grace {row['grace_s']:g} s hints {'on' if row['hints'] else 'off'}: "
                f"{row['cut_off']} cut off ({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    report = table(rows)
    print(report)
    if args.markdown:
        made = stamp(["python", "-m", "bench.removal_cutoffs", *(argv if argv is not None else sys.argv[1:])])
        Path(args.markdown).write_text(
            "# Requests cut off by scale-down\n\n"
            "Generated, not edited: re-run the command below to replace this file "
            "(what it measures: [operations.md](../operations.md#scale-down-that-cuts-off-work)).\n\n"
            + "".join(f"- {key}: {value}\n" for key, value in made.items())
            + f"- wall time: {time.perf_counter() - started:.0f} s\n\n"
            + report
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
