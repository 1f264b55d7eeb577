"""`planner replay`: score a policy on a trace in the simulated cluster."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from app.cli.common import (
    MAX_DELAY_S,
    MAX_GPUS_PER_ENGINE,
    MAX_LATENCY_MS,
    MAX_RATE_SCALE,
    MAX_SCALE,
    MODES_HELP,
    TIME_HELP,
    modes,
    number,
    one_line_error,
    parse_time,
)
from app.config import ConfigError, Settings

# Where /proc does not say when the process started (`_process_started_s`), the command's
# wall time counts from here (the command line's package loads this module at its start).
MODULE_LOADED_S = time.perf_counter()


def _process_started_s() -> float:
    """When this process started, on the `time.perf_counter` clock: from /proc on Linux, so that
    the interpreter's start-up and the imports count too; elsewhere when this module loaded."""
    try:
        # Field 22 of /proc/self/stat, after the parenthesised command name: the start time in
        # clock ticks since boot; /proc/uptime is the time since boot now, on the same clock.
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        age_s = uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return MODULE_LOADED_S
    now = time.perf_counter()
    # The module's own mark bounds the age from below; anything odd falls back to it.
    return min(MODULE_LOADED_S, now - age_s) if 0 <= age_s < 86_400 else MODULE_LOADED_S


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from app.sim.fleet.config import is_fleet_file
    from app.sim.fleet.run import run_fleet_command
    from app.sim.replay.run import check_output_folder, run_command

    if args.from_store is None and (args.since is not None or args.until is not None):
        raise ConfigError("--since/--until: the window of --from-store")
    if args.from_store is not None:
        from app.cli.replay_store import run_from_store_command

        return run_from_store_command(args, started_s=_process_started_s())
    if args.config and is_fleet_file(args.config):
        # A fleet file names one trace per deployment itself (docs/fleet.md).
        if args.trace is not None or args.workload is not None:
            raise ConfigError("--trace/--workload: a fleet file gives each deployment its trace")
        check_output_folder(Path(args.out))
        return run_fleet_command(args)
    if args.trace is None and args.workload is None:
        raise ConfigError("one of the arguments --trace --workload is required")
    # Before anything that takes time: a bad --out fails now, not after the whole replay.
    check_output_folder(Path(args.out))
    if args.workload is not None:
        args.trace = str(_write_workload(args.workload, Path(args.out)))
    return run_command(args, started_s=_process_started_s())


def _write_workload(name: str, out: Path) -> Path:
    """The named workload as a Mooncake trace `<out>/<name>.jsonl`, which the replay then reads
    like any trace (and which repeats the run with --trace). Arrival times are relative to its
    first request, as for every trace file."""
    from app.sim.world.workload import WORKLOADS, build_workload

    if name not in WORKLOADS:
        raise ConfigError(f"--workload: unknown workload {name!r} (choose from {', '.join(WORKLOADS)})")
    requests = build_workload(name)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.jsonl"
    with path.open("w") as stream:
        for r in requests:
            record = {
                "timestamp": r.arrival_s * 1000.0,
                "input_length": r.isl_tokens,
                "output_length": r.osl_tokens,
            }
            stream.write(json.dumps(record) + "\n")
    return path


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    replay = sub.add_parser(
        "replay",
        help="score a policy on a trace in a simulated cluster",
        description="Replay a trace (Mooncake JSONL, Azure CSV or Dynamo request trace), or a named "
        "workload of the decision-quality benchmark, through the simulated cluster under one policy; "
        "write summary.json, requests.csv.gz, replicas.csv, decisions.csv and report.html to --out.",
    )
    replay.error = one_line_error  # type: ignore[method-assign]
    latency = number(minimum=0, inclusive=False, maximum=MAX_LATENCY_MS)
    scale = number(minimum=0, inclusive=False, maximum=MAX_SCALE)
    gpus = number(minimum=1, inclusive=True, integer=True, maximum=MAX_GPUS_PER_ENGINE)
    # Not required by argparse: a fleet file (--config with a `fleet:` section) names its traces.
    source = replay.add_mutually_exclusive_group()
    source.add_argument("--trace", help="request trace file")
    source.add_argument(
        "--workload",
        metavar="NAME",
        help="a workload of the decision-quality benchmark by name (app/sim/world/workload.py WORKLOADS), "
        "written to --out as NAME.jsonl and replayed from there",
    )
    source.add_argument(
        "--from-store",
        metavar="DATABASE_URL",
        help="replay a deployment's own stored traffic (sqlite:///PATH or postgresql://...; opened "
        "read-only) under planner (the stored settings, or --config's), recorded (the stored "
        "decisions), peak (their highest counts held), static and oracle: docs/replay-from-store.md",
    )
    replay.add_argument("--out", required=True, help="output directory")
    replay.add_argument(
        "--config",
        help="replay file (default: examples/replay.yaml); with --from-store, other settings to replay "
        "(default: the stored ones) and its simulation section",
    )
    replay.add_argument(
        "--deployment",
        help="deployment of the replay file (default: its only one); with --from-store, of the store",
    )
    replay.add_argument(
        "--since",
        type=parse_time,
        help=f"with --from-store: the window's start, {TIME_HELP} "
        "(default: the deployment's first stored tick)",
    )
    replay.add_argument(
        "--until",
        type=parse_time,
        help=f"with --from-store: the window's end, {TIME_HELP} (default: its last stored tick)",
    )
    replay.add_argument(
        "--policy",
        default="planner",
        choices=("planner", "seed", "static", "reactive", "oracle"),
        help="planner: SLA scaling; seed: the reference's throughput and load modes (default: planner)",
    )
    replay.add_argument("--profile", help="the planner's profile directory (overrides the file)")
    replay.add_argument("--prefill-gpus", type=gpus, help="GPUs per prefill engine")
    replay.add_argument("--decode-gpus", type=gpus, help="GPUs per decode engine")
    replay.add_argument("--ttft-ms", type=latency, help="TTFT target (ms)")
    replay.add_argument("--itl-ms", type=latency, help="ITL target (ms)")
    replay.add_argument(
        "--startup-delay-s",
        type=number(minimum=0, inclusive=True, maximum=MAX_DELAY_S),
        help="engine start-up delay (s)",
    )
    replay.add_argument("--truth-scale", type=scale, help="the world's latencies are the truth profile's x X")
    replay.add_argument("--truth-profile", help="the world's profile (default: the planner's)")
    replay.add_argument(
        "--truth",
        metavar="NAME[,NAME...]",
        help="the world's latency shape: profile (default), smooth, one-prompt, prefix-cost, "
        "rising-decode, combined with commas (docs in app/sim/world/truth.py)",
    )
    replay.add_argument(
        "--rate-scale",
        type=number(minimum=0, inclusive=False, maximum=MAX_RATE_SCALE),
        help="K requests per trace request, arrivals +-0.5 s (--rate-spread-s)",
    )
    replay.add_argument(
        "--rate-spread-s",
        metavar="SECONDS",
        type=number(minimum=0, inclusive=True, maximum=MAX_DELAY_S),
        help="with --rate-scale: each copy arrives within +-SECONDS of its request (default: 0.5). "
        "Clustered copies make one-second bursts that more users at the same rate may not; a wider "
        "window spreads each request's copies over it",
    )
    replay.add_argument(
        "--removal-grace-s",
        metavar="SECONDS",
        type=number(minimum=0, inclusive=True, maximum=MAX_DELAY_S),
        help="a removed engine stops taking work and stops SECONDS later, cutting off what it still "
        "holds (a pod's termination grace period); summary.json counts them as cut_off. Default: "
        "removed engines drain until empty",
    )
    replay.add_argument(
        "--no-removal-hints",
        dest="removal_hints",
        action="store_false",
        default=None,
        help="with --removal-grace-s: the cluster ignores the engines the planner names for removal "
        "and removes the youngest ready ones, as Kubernetes' ReplicaSet controller does",
    )
    replay.add_argument("--modes", type=modes, help=MODES_HELP)
    replay.add_argument(
        "--scale-to-zero",
        metavar="QUIET_S",
        dest="scale_to_zero_quiet_s",
        type=number(minimum=0, inclusive=False, maximum=MAX_DELAY_S),
        default=None,
        help="let the deployment run no engine after QUIET_S seconds without a request (min_replicas 0; "
        "docs/scaling.md); summary.json then reports each wake-up",
    )
    replay.add_argument(
        "--zero-return-forecast",
        dest="scale_to_zero_forecast",
        action="store_true",
        help="with --scale-to-zero: also stay awake while the learned quiet periods expect a return "
        "within a lead (scale_to_zero.respect_return_forecast)",
    )
    replay.add_argument("--seed", type=number(minimum=0, inclusive=True, integer=True), help="default: 0")
    replay.add_argument(
        "--fleet-policy",
        choices=("fleet", "equal", "fcfs", "oracle"),
        default="fleet",
        help="a fleet file only: fleet (the fleet step), equal (static equal shares), fcfs "
        "(independent planners clipped first come first served) or oracle (every future known, "
        "fitted to the budget by the fleet step); default: fleet",
    )
    replay.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (by default a line every 10%% of the trace or 5 s of wall time)",
    )
    replay.set_defaults(func=cmd_replay)
