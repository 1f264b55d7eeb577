"""Decision quality: each policy replayed on real traffic, against the clairvoyant oracle.

Workloads (both bundled in data/traces/):
- `azure-conv-x30`: the Azure LLM inference trace 2023 (conversation), 19,366 requests over
  3,502 s, at 30x its rate (`expand_rate`, seed 0): 580,980 requests, about 166 req/s;
- `servegen-day1`: ServeGen m-large's aggregate rate curve, day 2 of 14 (windows 144..287, the
  widest daily swing: 93 to 515 req/s), compressed 24x (a 600 s window lasts 25 s, the day an
  hour), Poisson arrivals at the windows' own rates, request lengths drawn from the Azure trace.

For each workload, start-up delay (30, 120, 300 s) and truth scale (1.0, 1.2: the world 20%
slower than the planner's profile), every policy (oracle, static, reactive, seed, planner) runs on the
same world (`seed` is the reference's throughput and load modes, `planner` SLA scaling), with
the settings of examples/replay.yaml (TTFT 1 s, ITL 30 ms, H200 Llama-3.1-8B
FP8 profile). Columns: SLO attainment (TTFT and mean ITL both met), GPU-hours, GPU-hours over
the oracle's lower bound, scaling actions, and replay speed (simulated seconds per wall second).

    .venv/bin/python bench/replay_quality.py [--workers 2] [--quick] [--policies planner]
        [--scaling decode_itl_margin=0.95 ...] [--out FILE]

`--quick` runs only delay 120 s and truth 1.0. `--scaling FIELD=VALUE` (repeatable) overrides a
field of the deployment's `scaling:` section for every cell, which is how the variants in
docs/benchmarks.md were measured. Prints a markdown table and writes
bench/results/replay_quality.json (or `--out`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.config import ScalingConfig, format_validation_error  # noqa: E402
from app.sim.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides  # noqa: E402
from app.sim.outputs import summarize  # noqa: E402
from app.sim.replay import build_world, make_policy, run_policy  # noqa: E402
from app.sim.workload import expand_rate, read_rate_curve, synthesize  # noqa: E402
from app.sources.traces import load_trace  # noqa: E402

AZURE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
SERVEGEN = ROOT / "data" / "traces" / "language_m-large_aggregate_rate.csv"
WORKLOADS = ("azure-conv-x30", "servegen-day1")
DELAYS_S = (30, 120, 300)
TRUTH_SCALES = (1.0, 1.2)
POLICIES = ("oracle", "static", "reactive", "seed", "planner")


def workload(name: str):
    azure = load_trace(AZURE)
    if name == "azure-conv-x30":
        return expand_rate(azure, 30, seed=0)
    day = read_rate_curve(SERVEGEN)[144:288]
    return synthesize(day, azure, compress=24, seed=0)


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
) -> list[dict]:
    config = with_overrides(
        load_replay_config(DEFAULT_REPLAY_CONFIG), startup_delay_s=delay_s, truth_scale=truth_scale
    )
    if scaling is not None:
        deployment = config.deployment.model_copy(update={"scaling": scaling})
        config = dataclasses.replace(config, deployment=deployment)
    requests = workload(name)
    started = time.perf_counter()
    world = build_world(config, requests)
    oracle_s = time.perf_counter() - started
    rows = []
    for policy in policies:
        result = run_policy(world, make_policy(policy, world), trace_name=name)
        s = summarize(result)
        rows.append(
            {
                "workload": name,
                "delay_s": delay_s,
                "truth_scale": truth_scale,
                "policy": policy,
                "requests": s["requests"],
                "slo_attainment": s["slo_attainment"],
                "ttft_attainment": s["ttft_attainment"],
                "itl_attainment": s["itl_attainment"],
                "gpu_hours": s["gpu_hours"],
                "oracle_gpu_hours": s["oracle_gpu_hours"],
                "gpu_hours_over_oracle": s["gpu_hours_over_oracle"],
                "scaling_actions": s["scaling_actions"],
                "sim_s_per_wall_s": s["simulated_s_per_wall_s"],
                "oracle_compute_s": oracle_s,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--quick", action="store_true", help="delay 120 s and truth 1.0 only")
    parser.add_argument(
        "--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}"
    )
    parser.add_argument(
        "--scaling", action="append", default=[], metavar="FIELD=VALUE", help="override a scaling: field"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "replay_quality.json")
    args = parser.parse_args()
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        parser.error(
            f"--policies: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(POLICIES)}"
        )
    scaling = scaling_with(args.scaling)
    delays = (120,) if args.quick else DELAYS_S
    truths = (1.0,) if args.quick else TRUTH_SCALES
    cells = [(w, d, t) for w in WORKLOADS for d in delays for t in truths]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(run_cell, *cell, policies, scaling) for cell in cells]
        rows = [row for f in futures for row in f.result()]
    wall_s = time.perf_counter() - started

    print(
        "| workload | delay | truth | policy | SLO attainment | GPU-hours | ÷ oracle | actions "
        "| sim s / wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["gpu_hours_over_oracle"]
        print(
            f"| {r['workload']} | {r['delay_s']:g} s | {r['truth_scale']:g} | {r['policy']} "
            f"| {r['slo_attainment']:.1%} | {r['gpu_hours']:.2f} | {ratio:.2f} | {r['scaling_actions']} "
            f"| {r['sim_s_per_wall_s']:.0f} |"
        )
    print(f"\n{len(rows)} replays in {wall_s:.0f} s with {args.workers} workers")
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"rows": rows, "wall_s": wall_s, "workers": args.workers, "scaling": args.scaling}
    out.write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
