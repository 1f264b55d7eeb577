"""Load-based scaling: the cost of one load tick, and decision quality per scaling mode.

(a) One load tick with 64 engines (32 prefill, 32 decode, disaggregated): the regressions are
    bootstrapped from the bundled H200 profile and fed 64 iteration records per tick (one per
    engine), then `load_step` estimates every engine and decides. Timed with
    `time.perf_counter` over `--ticks` ticks (median and p99), training included.
(b) `planner replay --policy seed` on the Azure conversation trace at 30x (580,980 requests)
    with the seed's load+throughput, load only and throughput only, at start-up delays 30 and 120 s and truth
    scales 1.0 and 1.2 (settings of examples/replay.yaml otherwise): SLO attainment, GPU-hours,
    GPU-hours over the oracle, scaling actions.

    .venv/bin/python -m bench.load_scaling [--ticks 200] [--workers 2] [--skip-replay]

Prints markdown tables and writes bench/results/load_scaling.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics
from app.core.seed.load import load_step
from app.core.seed.load_models import LoadModels
from app.core.seed.load_types import LoadInput, LoadSettings
from app.core.types import RoleBounds
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
from app.sim.replay.outputs import summarize
from app.sim.replay.run import build_world, make_policy, run_policy
from app.sim.world.workload import expand_rate
from app.sources.profile_files import load_profile
from app.sources.traces import load_trace

ROOT = Path(__file__).resolve().parents[1]

H200 = ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"
AZURE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
MODES = {"load+throughput": ("load", "throughput"), "load": ("load",), "throughput": ("throughput",)}
DELAYS_S = (30, 120)
TRUTH_SCALES = (1.0, 1.2)


def _records(tick: int, engines: int) -> dict[str, dict[tuple[str, int], ForwardPassMetrics]]:
    prefill, decode = {}, {}
    for i in range(engines):
        tokens = 2000 + 97 * ((tick + i) % 50)
        prefill[(f"prefill-{i}", 0)] = ForwardPassMetrics(
            f"prefill-{i}",
            0,
            0.02 + tokens * 2e-5,
            ScheduledRequestMetrics(num_prefill_requests=2, sum_prefill_tokens=tokens),
            QueuedRequestMetrics(num_prefill_requests=3, sum_prefill_tokens=3 * tokens),
        )
        kv = 100_000 + 1000 * ((tick * 7 + i) % 200)
        decode[(f"decode-{i}", 0)] = ForwardPassMetrics(
            f"decode-{i}",
            0,
            0.006 + kv * 2.9e-8,
            ScheduledRequestMetrics(num_decode_requests=kv // 1300, sum_decode_kv_tokens=kv),
            QueuedRequestMetrics(num_decode_requests=1, sum_decode_kv_tokens=1300),
        )
    return {"prefill": prefill, "decode": decode}


def load_tick_times(ticks: int, engines_per_role: int = 32) -> dict:
    models = LoadModels("disagg", max_samples=200)
    models.bootstrap(load_profile(H200))
    settings = LoadSettings(
        mode="disagg",
        ttft_target_ms=1000,
        itl_target_ms=30,
        bounds={"prefill": RoleBounds(1, 64), "decode": RoleBounds(1, 64)},
        max_num_batched_tokens=8192,
        max_kv_tokens=945_029,
    )
    start_s = datetime(2026, 11, 29, tzinfo=UTC).timestamp()
    times_ms = []
    reasons: dict[str, int] = {}
    for tick in range(ticks):
        fpm = _records(tick, engines_per_role)
        t0 = time.perf_counter()
        models.observe_many({role: records.values() for role, records in fpm.items()})
        result = load_step(
            models,
            LoadInput(
                fpm=fpm,
                ready={"prefill": engines_per_role, "decode": engines_per_role},
                now_s=start_s + 5 * tick,
            ),
            settings,
        )
        times_ms.append((time.perf_counter() - t0) * 1000)
        reasons[str(result.reason)] = reasons.get(str(result.reason), 0) + 1
    times_ms.sort()
    return {
        "engines": 2 * engines_per_role,
        "ticks": ticks,
        "median_ms": statistics.median(times_ms),
        "p99_ms": times_ms[min(len(times_ms) - 1, int(0.99 * len(times_ms)))],
        "reasons": reasons,
    }


def replay_cell(delay_s: float, truth_scale: float) -> list[dict]:
    base = with_overrides(
        load_replay_config(DEFAULT_REPLAY_CONFIG), startup_delay_s=delay_s, truth_scale=truth_scale
    )
    requests = expand_rate(load_trace(AZURE), 30, seed=0)
    world = build_world(base, requests)
    rows = []
    for label, modes in MODES.items():
        config = with_overrides(base, modes=modes)
        mode_world = type(world)(config, world.requests, world.model, world.truth, world.oracle)
        s = summarize(run_policy(mode_world, make_policy("seed", mode_world), trace_name="azure-conv-x30"))
        rows.append(
            {
                "modes": label,
                "delay_s": delay_s,
                "truth_scale": truth_scale,
                "slo_attainment": s["slo_attainment"],
                "ttft_attainment": s["ttft_attainment"],
                "itl_attainment": s["itl_attainment"],
                "gpu_hours": s["gpu_hours"],
                "gpu_hours_over_oracle": s["gpu_hours_over_oracle"],
                "scaling_actions": s["scaling_actions"],
                "wall_s": s["wall_s"],
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--skip-replay", action="store_true")
    args = parser.parse_args()

    tick = load_tick_times(args.ticks)
    print(f"## One load tick, {tick['engines']} engines ({tick['ticks']} ticks, training included)\n")
    print("| engines | median ms | p99 ms |")
    print("|---:|---:|---:|")
    print(f"| {tick['engines']} | {tick['median_ms']:.2f} | {tick['p99_ms']:.2f} |")

    rows: list[dict] = []
    if not args.skip_replay:
        cells = [(d, t) for d in DELAYS_S for t in TRUTH_SCALES]
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            rows = [row for f in [pool.submit(replay_cell, *c) for c in cells] for row in f.result()]
        print("\n## planner replay --policy seed, Azure conversation trace x30, per scaling mode\n")
        print(
            "| modes | delay | truth | SLO attainment | TTFT ok | ITL ok | GPU-hours | ÷ oracle | actions |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['modes']} | {r['delay_s']:g} s | {r['truth_scale']:g} | {r['slo_attainment']:.1%} "
                f"| {r['ttft_attainment']:.1%} | {r['itl_attainment']:.1%} | {r['gpu_hours']:.2f} "
                f"| {r['gpu_hours_over_oracle']:.2f} | {r['scaling_actions']} |"
            )
    out = ROOT / "bench" / "results" / "load_scaling.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"load_tick": tick, "replay": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
