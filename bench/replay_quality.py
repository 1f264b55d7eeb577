"""Decision quality: each policy replayed on twelve workloads in six worlds, against the clairvoyant oracle.

Workloads (`app.sim.workload.WORKLOADS`, built from the traces bundled in data/traces/):
- `azure-conv-x30`: the Azure LLM inference trace 2023 (conversation), 19,366 requests over
  3,502 s, at 30x its rate (`expand_rate`, seed 0): 580,980 requests, about 166 req/s;
- `servegen-day1`: ServeGen m-large's aggregate rate curve, day 2 of 14 (windows 144..287, the
  widest daily swing: 93 to 515 req/s), compressed 24x (a 600 s window lasts 25 s, the day an
  hour), Poisson arrivals at the windows' own rates, request lengths drawn from the Azure trace;
- `mooncake-arxiv`: the first 1,000 requests of Mooncake's arXiv trace (real timing, 178 s,
  batches of about 17 long prompts every 3 s) at 2x: 2,000 requests;
- `bursty-gaps`: code completion: bursts of 150-450 req/s for 20-120 s, idle gaps of 1-4
  minutes (silent 61% of the time), short prompts and completions; 30 minutes;
- `flash-crowd`: 40 req/s jumping to 400 within 20 s at minute 10, held 5 minutes, decaying
  back (time constant 150 s); Azure lengths; 30 minutes;
- `diurnal`: a smooth day (30 to 270 req/s and back) compressed into 30 minutes; Azure lengths;
- `long-prompt`: 8 to 16 req/s of Mooncake's synthetic lengths with prompts x 1.35 (mean 20k
  tokens, p99 90k); 30 minutes;
- `heavy-tail-output`: 50 to 110 req/s, Azure prompts, lognormal outputs (median 180 tokens,
  p99 3.4k); 30 minutes;
- `code-bursts-clustered`, `code-bursts-spread` (and `-s1`, seed 1): code completion as a real
  editor fleet sends it (app/sim/world/bursts.py: on/off bursts from silence or a trickle, heavy-tailed
  gaps, per-minute counts varying by their mean), 30 minutes at 20x the base rate (about 50
  req/s on average, 92k and 76k requests): each request's 20 copies within ±0.5 s (clustered, as
  `--rate-scale` makes them) or spread over ±30 s (`--rate-spread-s 30`: more users at the same
  rate, without one-second clusters).

Halves (`--half`), fixed so that tuning never sees the workloads results are reported on:
`train` = azure-conv-x30, flash-crowd, long-prompt, diurnal (tune here); `test` = servegen-day1,
bursty-gaps, heavy-tail-output, mooncake-arxiv and the four code-bursts workloads (report here).

Worlds: `profile` (the planner's own profile is the truth), `profile-1.2` (the same, 20% slower),
and the named truths of app/sim/world/truth.py, `simulation.truth`: `smooth`, `one-prompt`,
`prefix-cost`, `rising-decode`, each at truth scale 1.0. Start-up delays 30, 120 and 300 s. In
each (workload, world, delay) cell every policy (oracle, static, reactive, seed, planner) runs on
the same world (`seed` is the reference's throughput and load modes, `planner` SLA scaling),
with the settings of examples/replay.yaml (TTFT 1 s, ITL 30 ms, H200 Llama-3.1-8B FP8 profile).
`fixed` is a sweep of engine counts held all run, ordered from the same start at the planner's
first tick (bench/fixed_frontier.py: up to 14 replays per cell, rows `fixed P/D`): the cell's
fixed-count frontier, and whether a fixed count beats the planner on both axes.
Per run: SLO attainment (TTFT and mean ITL both met), GPU-hours, GPU-hours over the oracle's
lower bound, scaling actions, and the requests no policy could serve (late even alone on an idle
engine; the same for every policy of a cell).

    .venv/bin/python -m bench.replay_quality [--quick] [--workloads a,b | --half train|test]
        [--worlds a,b] [--delays 30,120] [--policies planner] [--scaling FIELD=VALUE ...]
        [--attainment-target SHARE] [--workers 2] [--out FILE] [--markdown FILE]

The default is the whole matrix: 12 workloads x 6 worlds x 3 delays = 216 cells of 5 replays and
a fixed sweep.
`--quick` runs delay 120 s in the worlds profile, smooth, one-prompt, prefix-cost and
rising-decode (explicit `--delays` or `--worlds` win over it). `--scaling FIELD=VALUE`
(repeatable) overrides a field of the deployment's `scaling:` section for every cell, which is
how the variants in docs/benchmarks.md were measured. Progress goes to stderr as cells finish;
stdout gets one markdown table per world (rows workload x delay, one `attainment / ÷ oracle`
column per policy; with `fixed`, the cheapest fixed count reaching the planner's attainment, the
best fixed count and the one beating the planner, if any), then the goal summary and, for each
planner cell that misses the goal, why (bench/miss_causes.py: its misses by cause, its GPU-hours
per role over the oracle's, the share held beyond the load measured now);
bench/results/replay_quality.json (or `--out`) gets every row, the planner's with that breakdown
under `why`, and each cell's fixed frontier under `frontiers`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from app.config import ScalingConfig, format_validation_error
from app.core.traces import TraceRequest
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
from app.sim.replay.outputs import summarize
from app.sim.replay.request_table import request_table
from app.sim.replay.run import build_world, make_policy, run_policy
from app.sim.world.workload import WORKLOADS as WORKLOAD_BUILDERS
from app.sim.world.workload import build_workload
from bench.fixed_frontier import fixed_rows, frontiers, is_fixed
from bench.matrix_report import (  # noqa: F401 (the report's names, re-exported)
    GOAL_ATTAINMENT,
    GOAL_COST_RATIO,
    GOAL_ORACLE_SLACK,
    LOW_ATTAINMENT,
    format_summary,
    goal_summary,
    markdown_file,
    meets_goal,
    stamp,
    world_table,
)
from bench.matrix_results import DEFAULT_RESULTS
from bench.miss_causes import format_why, why

# The matrix's workloads, in table order.
MATRIX_WORKLOADS: tuple[str, ...] = tuple(WORKLOAD_BUILDERS)
# The two the planner was tuned on (bench/clairvoyant_headroom.py replays these).
WORKLOADS = ("azure-conv-x30", "servegen-day1")
HALVES: dict[str, tuple[str, ...]] = {
    "train": ("azure-conv-x30", "flash-crowd", "long-prompt", "diurnal"),
    "test": (
        "servegen-day1",
        "bursty-gaps",
        "heavy-tail-output",
        "mooncake-arxiv",
        "code-bursts-clustered",
        "code-bursts-spread",
        "code-bursts-clustered-s1",
        "code-bursts-spread-s1",
    ),
}
DELAYS_S = (30, 120, 300)
TRUTH_SCALES = (1.0, 1.2)
# `fixed`: the fixed-count sweep (bench/fixed_frontier.py), run after the others of its cell.
POLICIES = ("oracle", "static", "reactive", "seed", "planner", "fixed")
# World name -> (simulation.truth, truth scale); None: the profile itself is the truth.
WORLDS: dict[str, tuple[str | None, float]] = {
    "profile": (None, 1.0),
    "profile-1.2": (None, 1.2),
    "smooth": ("smooth", 1.0),
    "one-prompt": ("one-prompt", 1.0),
    "prefix-cost": ("prefix-cost", 1.0),
    "rising-decode": ("rising-decode", 1.0),
}
QUICK_WORLDS = ("profile", "smooth", "one-prompt", "prefix-cost", "rising-decode")
QUICK_DELAYS_S = (120,)


@functools.cache
def _cached_workload(name: str) -> tuple[TraceRequest, ...]:
    # Built once per process: a worker runs many cells of the same workload.
    return tuple(build_workload(name))


def workload(name: str) -> list[TraceRequest]:
    """The named matrix workload's requests (see app/sim/world/workload.py)."""
    return list(_cached_workload(name))


def world_name(truth: str | None, truth_scale: float) -> str:
    if truth is None:
        return "profile" if truth_scale == 1.0 else f"profile-{truth_scale:g}"
    return truth if truth_scale == 1.0 else f"{truth}-{truth_scale:g}"


def scaling_with(pairs: list[str]) -> ScalingConfig | None:
    """The replay deployment's `scaling:` section with `FIELD=VALUE` overrides, validated as the
    deployments file would be (an unknown field or a bad value is a one-line error); None when
    nothing is overridden."""
    if not pairs:
        return None
    overrides: dict[str, Any] = {}
    for pair in pairs:
        field, sep, value = pair.partition("=")
        if not sep or not field:
            raise SystemExit(f"--scaling: expected FIELD=VALUE, got {pair!r}")
        overrides[field] = yaml.safe_load(value)
    current = load_replay_config(DEFAULT_REPLAY_CONFIG).deployment.scaling
    try:
        return ScalingConfig.model_validate({**current.model_dump(), **overrides})
    except ValidationError as exc:
        raise SystemExit(format_validation_error("--scaling", exc)) from None


def run_cell(
    name: str,
    delay_s: float,
    truth_scale: float,
    policies: tuple[str, ...] = POLICIES,
    scaling: ScalingConfig | None = None,
    truth: str | None = None,
    attainment_target: float | None = None,
) -> list[dict]:
    """Every policy of `policies` on one workload, world and start-up delay; one row each."""
    world_overrides: dict[str, Any] = {"startup_delay_s": delay_s, "truth_scale": truth_scale}
    if truth is not None:
        world_overrides["truth"] = truth
    config = with_overrides(load_replay_config(DEFAULT_REPLAY_CONFIG), **world_overrides)
    if scaling is not None:
        deployment = config.deployment.model_copy(update={"scaling": scaling})
        config = dataclasses.replace(config, deployment=deployment)
    if attainment_target is not None:
        sla = config.deployment.sla.model_copy(update={"attainment_target": attainment_target})
        config = dataclasses.replace(config, deployment=config.deployment.model_copy(update={"sla": sla}))
    started, cpu_started = time.perf_counter(), time.process_time()
    requests = workload(name)
    built = time.perf_counter()
    world = build_world(config, requests)
    oracle_s = time.perf_counter() - built
    base = {
        "workload": name,
        "world": world_name(truth, truth_scale),
        "truth": truth or "profile",
        "delay_s": delay_s,
        "truth_scale": truth_scale,
    }
    rows = []
    start = None  # the planner's start and first tick: the fixed counts' too
    for policy in (p for p in policies if p != "fixed"):
        policy_cpu_started = time.process_time()
        runner = make_policy(policy, world)
        if policy == "planner":
            start = (runner.initial(), runner.first_tick_s())
        result = run_policy(world, runner, trace_name=name)
        row, table = _row(base, policy, world, result, time.process_time() - policy_cpu_started, oracle_s)
        if policy == "planner":
            # Why the cell lands where it does: its misses and GPU-hours taken apart (bench/miss_causes.py).
            row["why"] = why(result, table, world.truth, runner.ticks)
        rows.append(row)
    if "fixed" in policies:
        # After the others: the sweep aims at the planner's attainment (bench/fixed_frontier.py).
        def fixed_row(policy: str, result: Any, cpu_s: float) -> dict:
            return _row(base, policy, world, result, cpu_s, oracle_s)[0]

        rows += fixed_rows(world, base, fixed_row, cell_rows=rows, start=start, no_reference=GOAL_ATTAINMENT)
    # CPU seconds as well as wall seconds: on a shared machine only the former predict the
    # matrix's time on idle cores.
    cell_s, cell_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    for row in rows:
        row["cell_wall_s"], row["cell_cpu_s"] = cell_s, cell_cpu_s
    return rows


def _row(base: dict, policy: str, world: Any, result: Any, cpu_s: float, oracle_s: float) -> tuple[dict, Any]:
    """One run's matrix row, and its request table."""
    table = request_table(result.requests, result.ttft_target_ms, result.itl_target_ms)
    s = summarize(result, table=table, truth=world.truth)
    keys = ("requests", "slo_attainment", "ttft_attainment", "itl_attainment", "gpu_hours")
    row = {**base, "policy": policy, **{k: s[k] for k in keys}}
    row.update(
        oracle_gpu_hours=s["oracle_gpu_hours"],
        gpu_hours_over_oracle=s["gpu_hours_over_oracle"],
        scaling_actions=s["scaling_actions"],
        # Late even alone on an idle engine in this world: the same for every policy.
        unservable_requests=s["unservable_requests"],
        sim_s_per_wall_s=s["simulated_s_per_wall_s"],
        replay_cpu_s=cpu_s,
        oracle_compute_s=oracle_s,
    )
    return row, table


# --- selection ------------------------------------------------------------------------------------


def parse_names(text: str, known: Sequence[str], flag: str) -> tuple[str, ...]:
    """A comma-separated list of names from `known`, in the order given; SystemExit naming the
    unknown ones (and the known) otherwise."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(
            f"{flag}: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(known)}"
        )
    return names


def parse_delays(text: str) -> tuple[float, ...]:
    try:
        delays = tuple(float(d) for d in text.split(",") if d.strip())
    except ValueError:
        raise SystemExit(f"--delays: expected comma-separated seconds, got {text!r}") from None
    if not delays or any(not (d >= 0 and d < float("inf")) for d in delays):
        raise SystemExit(f"--delays: expected comma-separated seconds >= 0, got {text!r}")
    return delays


Cell = tuple[str, str, float]  # (workload, world, start-up delay in s)


def matrix_cells(workloads: Iterable[str], worlds: Iterable[str], delays_s: Iterable[float]) -> list[Cell]:
    """Workload-major, so that a worker's consecutive cells share one built workload."""
    worlds, delays_s = tuple(worlds), tuple(delays_s)
    return [(w, world, d) for w in workloads for world in worlds for d in delays_s]


def _run_matrix_cell(
    cell: Cell, policies: tuple[str, ...], scaling: ScalingConfig | None, attainment_target: float | None
) -> list[dict]:
    name, world, delay_s = cell
    truth, truth_scale = WORLDS[world]
    return run_cell(name, delay_s, truth_scale, policies, scaling, truth, attainment_target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"delay 120 s, worlds {', '.join(QUICK_WORLDS)} (unless --delays or --worlds say otherwise)",
    )
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--workloads", help=f"comma-separated, of {', '.join(MATRIX_WORKLOADS)}")
    chosen.add_argument("--half", choices=tuple(HALVES), help="train or test: a fixed half of the workloads")
    parser.add_argument("--worlds", help=f"comma-separated, of {', '.join(WORLDS)}")
    parser.add_argument("--delays", help="start-up delays in s, comma-separated (default: 30,120,300)")
    parser.add_argument(
        "--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}"
    )
    parser.add_argument(
        "--scaling", action="append", default=[], metavar="FIELD=VALUE", help="override a scaling: field"
    )
    parser.add_argument(
        "--attainment-target",
        type=float,
        metavar="SHARE",
        help="the deployment's sla.attainment_target (attainment sizing), in (0, 1)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument(
        "--markdown",
        type=Path,
        metavar="FILE",
        help="also write the report to FILE, stamped with the command, commit, date and machine "
        "(docs/benchmarks/results.md)",
    )
    args = parser.parse_args()
    made = stamp(["python", "-m", "bench.replay_quality", *sys.argv[1:]])
    if args.attainment_target is not None and not 0 < args.attainment_target < 1:
        raise SystemExit(f"--attainment-target: expected a share in (0, 1), got {args.attainment_target}")
    policies = parse_names(args.policies, POLICIES, "--policies")
    if args.workloads:
        workloads = parse_names(args.workloads, MATRIX_WORKLOADS, "--workloads")
    else:
        workloads = HALVES[args.half] if args.half else MATRIX_WORKLOADS
    if args.worlds:
        worlds = parse_names(args.worlds, tuple(WORLDS), "--worlds")
    else:
        worlds = QUICK_WORLDS if args.quick else tuple(WORLDS)
    delays = parse_delays(args.delays) if args.delays else (QUICK_DELAYS_S if args.quick else DELAYS_S)
    scaling = scaling_with(args.scaling)
    cells = matrix_cells(workloads, worlds, delays)
    # The middle start-up delay first: a run stopped early has the --quick matrix.
    order = sorted(cells, key=lambda c: (abs(c[2] - 120.0), c[2]))
    started = time.perf_counter()
    results: dict[Cell, list[dict]] = {}
    # Each finished cell's rows at once, so that a long run stopped early keeps what it measured.
    partial = args.out.with_suffix(".partial.jsonl")
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_text("")
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = {
            pool.submit(_run_matrix_cell, cell, policies, scaling, args.attainment_target): cell
            for cell in order
        }
        for done, future in enumerate(as_completed(futures), start=1):
            cell = futures[future]
            results[cell] = future.result()
            with partial.open("a") as stream:
                stream.writelines(json.dumps(row) + "\n" for row in results[cell])
            name, world, delay_s = cell
            first = results[cell][0]
            swept = next((r["sweep"] for r in results[cell] if is_fixed(r)), None)
            fixed = ""
            if swept is not None:
                fixed = f"; fixed sweep {swept['replays']} replays, {swept['wall_s']:.0f} s "
                fixed += f"(CPU {swept['cpu_s']:.0f} s)"
            print(
                f"[{done}/{len(cells)}] {name} {world} {delay_s:g} s: {first['cell_wall_s']:.0f} s "
                f"(CPU {first['cell_cpu_s']:.0f} s){fixed}",
                file=sys.stderr,
                flush=True,
            )
    wall_s = time.perf_counter() - started
    rows = [row for cell in cells for row in results[cell]]

    report: list[str] = []
    for world in worlds:
        truth, scale = WORLDS[world]
        report.append(f"\n### World `{world}` (truth {truth or 'profile'}, scale {scale:g})\n")
        report.append("Cells: SLO attainment / GPU-hours ÷ the oracle's.\n")
        report.append(world_table(rows, world, policies))
    summary = goal_summary(rows)
    report.append("\n" + format_summary(summary))
    if summary["missed"]:
        report.append("\nWhy the planner's missed cells miss (bench/miss_causes.py):\n")
        report.append(format_why(rows, summary["missed"]))
    report.append(f"\n{len(rows)} replays ({len(cells)} cells) in {wall_s:.0f} s with {args.workers} workers")
    print("\n".join(report))
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown_file("\n".join(report), made))
        print(f"wrote {args.markdown}", file=sys.stderr)
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        **made,
        "rows": rows,
        "summary": summary,
        "frontiers": frontiers(rows),
        "wall_s": wall_s,
        "workers": args.workers,
        "scaling": args.scaling,
        "attainment_target": args.attainment_target,
        "workloads": list(workloads),
        "worlds": list(worlds),
        "delays_s": list(delays),
        "policies": list(policies),
        "half": args.half,
    }
    out.write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
