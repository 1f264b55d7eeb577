"""The planner as the scaling policy of NVIDIA Dynamo 1.6.1's own offline replay, side by side
with Dynamo's planner and fixed allocations, on the same mocker world.

Runs under the Dynamo venv (`make dynamo-venv` makes it):

    .venv-dynamo/bin/python -m bench.dynamo_replay [--quick | --minutes N]
        [--workloads a,b] [--policies planner,dynamo,fixed[,first-order]] [--orders 8/4,...]
        [--sizing headroom|attainment] [--start 2/1] [--fpm heartbeat|last-record]
        [--jobs 2] [--out FILE]

Without Dynamo importable (the project venv, as `make bench` runs every bench/*.py) it prints one
line saying how to install it and exits 0.

The world is Dynamo's: `dynamo._core.run_mocker_trace_replay` (Rust, ai-dynamo-runtime 1.6.1),
disaggregated, vLLM-like mocker engines (max_num_seqs 256, chunked prefill of 8,192 tokens, KV
blocks of 64 tokens, the profile's KV capacity per engine), timed by
`dynamo.mocker.utils.planner_profiler_perf_data_converter` from the bundled H200 Llama-3.1-8B
FP8 profile (data/profiles/h200-llama3.1-8b-fp8), workers ready 120 s after they are ordered,
Dynamo's router (round-robin or KV-aware). Every policy runs on that same world:

- `planner`: this project's planner, `EmbeddedPlanner.from_config` on the deployment of
  examples/replay.yaml (SLA scaling, every 5 s) with the workload's TTFT/ITL targets
  (`--planner-max-num-seqs 256` also tells it the decode batch limit, which the file leaves
  unset); bench/dynamo_adapter.py translates Dynamo's snapshots;
- `dynamo`: Dynamo 1.6.1's own planner through its own replay adapter
  (`dynamo.planner.offline.replay_adapter.create_replay_planner_adapter`), SLA mode with both
  scaling modes as its guide recommends (throughput every 180 s with a constant predictor as the
  floor, load-based every 5 s), regressions bootstrapped from the same profile the way its live
  planner reads `profile_results_dir`;
- `fixed`: a small grid of fixed (prefill, decode) counts around the profile's sizing for the
  trace's busiest minute; the table shows the cheapest that meets 99% attainment, or else the
  highest attainment;
- `first-order`: from `planner`'s start, each count of that grid (or of `--orders`) ordered at
  the first tick (5 s) and nothing after: what a policy that knew the fixed winner could reach
  from the same start, since no order can come earlier (on a trace shorter than a few start-ups
  the fixed allocations' head start decides the row); shown like `fixed`.

`planner` and `dynamo` start from the same engines: the profile's sizing for the trace's first
five minutes, or `--start`'s. `--fpm last-record` hands our planner each engine's last FPM
record until a newer one arrives, as Dynamo's own replay adapter hands its planner (the default
replaces it by an idle heartbeat once the engine has run no pass since the last tick). Score:
SLO attainment = requests with TTFT and mean ITL both within the targets (Dynamo's goodput
count) over all requests; GPU-hours as Dynamo's replay bills them (each worker from its order
until it is removed, start-up and draining included).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent

PROFILE = REPO / "data" / "profiles" / "h200-llama3.1-8b-fp8"
REPLAY_CONFIG = REPO / "examples" / "replay.yaml"
AZURE = REPO / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = REPO / "data" / "traces" / "mooncake_trace_arxiv_first1000.jsonl"
MOONCAKE_SYNTHETIC = REPO / "data" / "traces" / "mooncake_synthetic_trace.jsonl"
DEFAULT_OUT = BENCH / "results" / "dynamo_replay.json"

POLICIES = ("planner", "dynamo", "fixed", "first-order")
TICK_S = 5.0  # first-order ticks at 5 s, then every 5 s, as the planner does
QUICK_MINUTES = 20.0
TRACE_BLOCK = 512  # tokens per hash id in the replay's Mooncake-format trace
ENGINE_BLOCK = 64  # the mocker's KV block
MAX_NUM_SEQS = 256
SEED = 0


@dataclass(frozen=True)
class Workload:
    name: str
    trace: Path
    rate_scale: float
    router: str  # Dynamo's router_mode: "round_robin" or "kv_router"
    ttft_ms: float
    itl_ms: float
    # Keep the trace's own prefix structure (Mooncake hash ids), one copy of it per rate copy.
    prefixes: bool = False


WORKLOADS = {
    w.name: w
    for w in (
        Workload("azure-conv-x10-rr", AZURE, 10, "round_robin", 1000.0, 30.0),
        Workload("azure-conv-x30-kv", AZURE, 30, "kv_router", 1000.0, 30.0),
        Workload("mooncake-arxiv-x4-kv", MOONCAKE, 4, "kv_router", 3000.0, 40.0, prefixes=True),
        Workload("mooncake-synthetic-x2-kv", MOONCAKE_SYNTHETIC, 2, "kv_router", 3000.0, 40.0, prefixes=True),
    )
}


def dynamo_available() -> bool:
    try:
        return importlib.util.find_spec("dynamo._core") is not None and (
            importlib.util.find_spec("dynamo.replay") is not None
        )
    except (ImportError, ValueError):
        return False


def log(message: str) -> None:
    print(f"[dynamo_replay {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the workload, as the replay reads it ------------------------------------------------------


def _mooncake_hash_ids(path: Path) -> list[list[int]]:
    """The hash ids of each request of a Mooncake trace, in `load_trace`'s order (by arrival,
    ties in file order)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    order = sorted(range(len(rows)), key=lambda i: rows[i]["timestamp"])
    return [list(rows[i].get("hash_ids") or []) for i in order]


def build_requests(workload: Workload, minutes: float | None) -> tuple[list, list[list[int]] | None]:
    """The trace at its rate scale (`expand_rate`), cut to its first `minutes`; with `prefixes`,
    each request's hash ids, renumbered per rate copy so that copies share no prefix."""
    from app.sim.world.workload import expand_rate
    from app.sources.traces import load_trace

    base = load_trace(workload.trace)
    if minutes is not None:
        base = [r for r in base if r.arrival_s < minutes * 60.0]
    if not workload.prefixes:
        return expand_rate(base, workload.rate_scale, SEED), None
    ids = _mooncake_hash_ids(workload.trace)[: len(base)]
    copies = int(workload.rate_scale)
    if copies != workload.rate_scale:
        raise ValueError(f"{workload.name}: prefixes need a whole rate scale")
    span = 1 + max((h for row in ids for h in row), default=0)
    expanded: list[tuple[Any, list[int]]] = []
    for i, (request, hashes) in enumerate(zip(base, ids, strict=True)):
        # expand_rate per request (its own seed): the same jitter law, and each copy known.
        for c, copy in enumerate(expand_rate([request], copies, SEED * 1_000_003 + i)):
            expanded.append((copy, [c * span + h for h in hashes]))
    expanded.sort(key=lambda item: item[0].arrival_s)
    return [r for r, _ in expanded], [h for _, h in expanded]


def write_trace(requests: Sequence, hash_ids: Sequence[list[int]] | None, path: Path) -> None:
    """Mooncake JSONL, as the replay reads it: without prefix structure each request gets fresh
    hash ids (no two prompts share a block)."""
    next_id = 1 << 40  # above any real Mooncake id
    with path.open("w") as out:
        for i, r in enumerate(requests):
            if hash_ids is not None:
                ids = hash_ids[i]
            else:
                n = max(1, -(-r.isl_tokens // TRACE_BLOCK))
                ids = range(next_id, next_id + n)
                next_id += n
            out.write(
                f'{{"timestamp":{r.arrival_s * 1000.0:.3f},"input_length":{r.isl_tokens},'
                f'"output_length":{max(1, r.osl_tokens)},"hash_ids":[{",".join(map(str, ids))}]}}\n'
            )


# --- our side: the deployment and the profile's sizing ------------------------------------------


def deployment_for(workload: Workload, decode_max_num_seqs: int | None = None, sizing: str | None = None):
    """examples/replay.yaml's deployment with the workload's targets (and, if given, the decode
    engines' batch limit, which the file leaves unset, and SLA scaling's `sizing`)."""
    from app.sim.replay.config import load_replay_config, with_overrides

    config = with_overrides(
        load_replay_config(REPLAY_CONFIG), ttft_ms=workload.ttft_ms, itl_ms=workload.itl_ms
    )
    d = config.deployment
    if decode_max_num_seqs is not None:
        d = d.model_copy(update={"decode": d.decode.model_copy(update={"max_num_seqs": decode_max_num_seqs})})
    if sizing is not None:
        d = d.model_copy(update={"scaling": d.scaling.model_copy(update={"sizing": sizing})})
    return config, d


def profile_sizing(requests: Sequence, workload: Workload) -> dict[str, int]:
    """The profile's replicas for the busiest minute of `requests` (app/sim's `static` policy)."""
    from app.embedding import EmbeddedPlanner
    from app.sim.replay.policies import StaticPolicy

    config, d = deployment_for(workload)
    model = EmbeddedPlanner.from_config(d, base_dir=config.base_dir).model
    gpus = {role: d.role(role).gpus_per_engine for role in ("prefill", "decode")}
    return StaticPolicy.for_peak(list(requests), model, itl_target_ms=workload.itl_ms, gpus=gpus).replicas


def fixed_grid(peak: dict[str, int]) -> list[tuple[int, int]]:
    p, d = peak["prefill"], peak["decode"]
    prefill = sorted({max(1, round(p * f)) for f in (0.8, 1.0, 1.25)})
    decode = sorted({d, d + 1})
    return [(x, y) for x in prefill for y in decode]


# --- one replay ---------------------------------------------------------------------------------


@dataclass
class RunSpec:
    workload: str
    policy: str  # planner | dynamo | fixed
    trace_path: str
    perf_npz: str
    prefill: int
    decode: int
    kv_blocks: int
    max_batched_tokens: int
    startup_s: float
    gpu_budget: int = 64
    label: str = ""
    planner_max_num_seqs: int | None = None  # tell our planner the decode batch limit
    planner_sizing: str | None = None  # our planner's scaling.sizing (None: the file's)
    # False: each engine's last FPM record stays until a newer one arrives, as Dynamo's own
    # replay adapter presents it; True: an engine without a pass since the last tick is idle.
    fpm_heartbeats: bool = True
    order: tuple[int, int] | None = None  # first-order: the (prefill, decode) ordered at once


@dataclass
class RunResult:
    workload: str
    policy: str
    label: str
    initial: dict[str, int]
    requests: int
    completed: int
    attainment: float
    gpu_hours: float
    ttft_p99_ms: float | None
    itl_mean_ms: float | None
    itl_p99_ms: float | None
    scale_operations: int
    max_workers: dict[str, int]
    ticks: int
    policy_wall_s: float
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)


def engine_args(worker_type: str, spec: RunSpec) -> dict[str, Any]:
    return {
        "engine": {
            "worker_type": worker_type,
            "num_gpu_blocks": spec.kv_blocks,
            "block_size": ENGINE_BLOCK,
            "max_num_seqs": MAX_NUM_SEQS,
            "max_num_batched_tokens": spec.max_batched_tokens,
            "enable_chunked_prefill": True,
            "enable_prefix_caching": True,
            "timing_model": {
                "type": "external",
                "provider": "dynamo_profile",
                "config": {"path": spec.perf_npz},
            },
        },
        "startup_time": spec.startup_s,
    }


def dynamo_planner(spec: RunSpec, workload: Workload):
    """Dynamo 1.6.1's planner as its replay runs it (`dynamo.replay.planner.prepare_planner_replay`
    minus the AIS bootstrap, which needs aisimulate), its regressions bootstrapped from the profile
    as its live planner does from `profile_results_dir`."""
    from dynamo.planner.config.planner_config import PlannerConfig
    from dynamo.planner.core.types import EngineCapabilities, WorkerCapabilities
    from dynamo.planner.monitoring.perf_metrics import (
        _convert_decode_profiling,
        _convert_prefill_profiling,
    )
    from dynamo.planner.offline.replay_adapter import create_replay_planner_adapter

    config = PlannerConfig.model_validate(
        {
            "mode": "disagg",
            "backend": "mocker",
            "environment": "virtual",
            "optimization_target": "sla",
            "ttft_ms": workload.ttft_ms,
            "itl_ms": workload.itl_ms,
            "enable_throughput_scaling": True,
            "enable_load_scaling": True,
            "throughput_adjustment_interval_seconds": 180,
            "load_adjustment_interval_seconds": 5,
            "load_predictor": "constant",
            "min_endpoint": 1,
            "max_gpu_budget": spec.gpu_budget,
            "min_gpu_budget": -1,
            "prefill_engine_num_gpu": 1,
            "decode_engine_num_gpu": 1,
            "model_name": "nvidia/Llama-3.1-8B-Instruct-FP8",
            "profile_results_dir": str(PROFILE),
            "pre_deployment_sweeping_mode": "none",
            "control_api_port": 0,
            "metric_reporting_prometheus_port": 0,
        }
    )
    config.advisory = True  # as prepare_planner_replay: the replay applies the decisions
    kv_tokens = spec.kv_blocks * ENGINE_BLOCK
    caps = {
        role: EngineCapabilities(
            num_gpu=1,
            max_num_batched_tokens=spec.max_batched_tokens,
            max_num_seqs=MAX_NUM_SEQS,
            max_kv_tokens=kv_tokens,
            kv_cache_block_size=ENGINE_BLOCK,
        )
        for role in ("prefill", "decode")
    }
    adapter = create_replay_planner_adapter(
        planner_config=config,
        capabilities=WorkerCapabilities(prefill=caps["prefill"], decode=caps["decode"]),
        benchmark_granularity=8,
        capture_details=False,
    )
    adapter.install_benchmark_fpms(
        prefill_fpms=_convert_prefill_profiling(str(PROFILE)),
        decode_fpms=_convert_decode_profiling(str(PROFILE)),
    )
    adapter.set_bootstrap_metadata({"status": "installed", "source": "profile_results_dir"})
    return adapter


class _Timed:
    """Counts ticks and the time spent in a scaling policy."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.ticks = 0
        self.wall_s = 0.0

    def initial_tick_ms(self) -> float:
        return self.inner.initial_tick_ms()

    def on_tick(self, snapshot: dict) -> dict:
        started = time.perf_counter()
        try:
            return self.inner.on_tick(snapshot)
        finally:
            self.wall_s += time.perf_counter() - started
            self.ticks += 1


class FirstOrder:
    """A scaling policy that orders one (prefill, decode) count at the first tick, then holds."""

    def __init__(self, prefill: int, decode: int) -> None:
        self.order: tuple[int, int] | None = (prefill, decode)

    def initial_tick_ms(self) -> float:
        return TICK_S * 1000.0

    def on_tick(self, snapshot: dict) -> dict:
        now_ms = float(snapshot["now_ms"])
        prefill, decode = self.order or (None, None)
        self.order = None
        return {"target_prefill": prefill, "target_decode": decode, "next_tick_ms": now_ms + TICK_S * 1000.0}


def app_digest() -> str:
    """A digest of this project's planner code (app/**/*.py) as this process reads it."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted((REPO / "app").rglob("*.py")):
        h.update(str(path.relative_to(REPO)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def run_one(spec: RunSpec) -> RunResult:
    digest = app_digest()  # before the imports below read app/
    os.environ.setdefault("DYN_LOG", "error")
    import logging

    logging.disable(logging.WARNING)
    from dynamo._core import run_mocker_trace_replay

    from bench.dynamo_adapter import FpmCache, PlannerScalingPolicy

    workload = WORKLOADS[spec.workload]
    kwargs = dict(
        prefill_engine_args=engine_args("prefill", spec),
        decode_engine_args=engine_args("decode", spec),
        num_prefill_workers=spec.prefill,
        num_decode_workers=spec.decode,
        router_mode=workload.router,
        trace_block_size=TRACE_BLOCK,
        sla_ttft_ms=workload.ttft_ms,
        sla_itl_ms=workload.itl_ms,
        capture_planner_details=True,  # also the lifecycle operations (scalings, worker counts)
    )
    started = time.perf_counter()
    policy: _Timed | None = None
    extra: dict[str, Any] = {}
    if spec.policy == "fixed":
        native = run_mocker_trace_replay([spec.trace_path], **kwargs, scaling_policy=None)
    elif spec.policy in ("planner", "first-order"):
        if spec.policy == "planner":
            from app.embedding import EmbeddedPlanner

            config, d = deployment_for(workload, spec.planner_max_num_seqs, spec.planner_sizing)
            inner: Any = PlannerScalingPolicy(
                EmbeddedPlanner.from_config(d, base_dir=config.base_dir),
                caches={role: FpmCache(heartbeats=spec.fpm_heartbeats) for role in ("prefill", "decode")},
            )
        else:
            assert spec.order is not None
            inner = FirstOrder(*spec.order)
        policy = _Timed(inner)
        native = run_mocker_trace_replay([spec.trace_path], **kwargs, scaling_policy=policy)
    elif spec.policy == "dynamo":
        adapter = dynamo_planner(spec, workload)
        policy = _Timed(adapter)
        with adapter:
            native = run_mocker_trace_replay([spec.trace_path], **kwargs, scaling_policy=policy)
            details = adapter.finalize(native.lifecycle_operations)
        extra["bootstrap"] = details.metadata.get("bootstrap")
    else:
        raise ValueError(f"unknown policy {spec.policy!r}")
    wall = time.perf_counter() - started
    s = native.summary
    ops = native.lifecycle_operations or []
    scale_ops = sum(1 for op in ops if op.get("cause") == "planner_scale")
    max_workers = {"prefill": spec.prefill, "decode": spec.decode}
    for op in ops:
        state = op.get("state_after_batch") or {}
        pool = op.get("pool")
        if pool in max_workers:
            alive = len(state.get("active", [])) + len(state.get("starting", []))
            max_workers[pool] = max(max_workers[pool], alive)
    n = int(s.get("num_requests") or 0)
    good = int(s.get("goodput_completed_requests") or 0)
    return RunResult(
        workload=spec.workload,
        policy=spec.policy,
        label=spec.label or spec.policy,
        initial={"prefill": spec.prefill, "decode": spec.decode},
        requests=n,
        completed=int(s.get("completed_requests") or 0),
        attainment=good / n if n else math.nan,
        gpu_hours=float(s.get("gpu_hours") or 0.0),
        ttft_p99_ms=s.get("p99_ttft_ms"),
        itl_mean_ms=s.get("mean_itl_ms"),
        itl_p99_ms=s.get("p99_itl_ms"),
        scale_operations=scale_ops,
        max_workers=max_workers,
        ticks=policy.ticks if policy else 0,
        policy_wall_s=policy.wall_s if policy else 0.0,
        wall_s=wall,
        extra={
            **extra,
            "app_digest": digest,
            "duration_s": float(s.get("duration_ms") or 0.0) / 1000.0,
            "prefill_worker_seconds": s.get("prefill_worker_seconds"),
            "decode_worker_seconds": s.get("decode_worker_seconds"),
            "prefix_cache_reused_ratio": s.get("prefix_cache_reused_ratio"),
        },
    )


# --- the whole benchmark ------------------------------------------------------------------------


def best_fixed(runs: Sequence[RunResult], goal: float = 0.99) -> RunResult | None:
    if not runs:
        return None
    meeting = [r for r in runs if r.attainment >= goal]
    if meeting:
        return min(meeting, key=lambda r: (r.gpu_hours, -r.attainment))
    return max(runs, key=lambda r: (r.attainment, -r.gpu_hours))


def mocker_profile(out_dir: Path) -> Path:
    """Dynamo's own conversion of the profile into the mocker's timing tables."""
    os.environ.setdefault("DYN_LOG", "error")
    from dynamo.mocker.utils.planner_profiler_perf_data_converter import convert_profile_results_to_npz

    return Path(convert_profile_results_to_npz(PROFILE, out_dir / "perf_data.npz"))


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| workload | policy | SLO attainment | GPU-hours |",
        "|---|---|---|---|",
    ]
    for row in rows:
        attainment, gpu_hours = f"{100 * row['attainment']:.1f}%", f"{row['gpu_hours']:.2f}"
        lines.append(f"| {row['workload']} | {row['policy']} | {attainment} | {gpu_hours} |")
    return "\n".join(lines)


def parse_orders(text: str, flag: str = "--orders") -> list[tuple[int, int]]:
    """`8/4,32/32` as [(8, 4), (32, 32)]; SystemExit naming the flag otherwise."""
    orders = []
    for item in (t.strip() for t in text.split(",")):
        p, sep, d = item.partition("/")
        if not (sep and p.isdigit() and d.isdigit() and int(p) > 0 and int(d) > 0):
            raise SystemExit(f"{flag}: expected PREFILL/DECODE counts like 8/4, got {item!r}")
        orders.append((int(p), int(d)))
    return orders


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    parser.add_argument(
        "--policies",
        default="planner,dynamo,fixed",
        help=f"comma-separated, of {','.join(POLICIES)} (default: planner,dynamo,fixed)",
    )
    parser.add_argument("--quick", action="store_true", help=f"only the first {QUICK_MINUTES:.0f} minutes")
    parser.add_argument("--minutes", type=float, default=None, help="only the first N minutes of each trace")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="replays at once")
    parser.add_argument(
        "--orders",
        default=None,
        help="first-order's counts, e.g. 8/4,32/32 (default: the fixed grid)",
    )
    parser.add_argument(
        "--planner-max-num-seqs",
        type=int,
        default=None,
        help=f"our planner's decode.max_num_seqs (the world's: {MAX_NUM_SEQS}; default: none)",
    )
    parser.add_argument(
        "--sizing",
        choices=("headroom", "attainment"),
        default=None,
        help="our planner's scaling.sizing (default: examples/replay.yaml's)",
    )
    parser.add_argument(
        "--start",
        default=None,
        help="PREFILL/DECODE engines planner, dynamo and first-order start from (default: the "
        "profile's sizing for the first five minutes)",
    )
    parser.add_argument(
        "--fpm",
        choices=("heartbeat", "last-record"),
        default="heartbeat",
        help="how our planner sees an engine without a pass since the last tick: an idle heartbeat, "
        "or its last record kept (as Dynamo's own replay adapter presents it)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not dynamo_available():
        print(
            "dynamo_replay: NVIDIA Dynamo 1.6.1 is not importable here; install it with "
            "`make dynamo-venv`, then run `.venv-dynamo/bin/python -m bench.dynamo_replay`"
        )
        return 0
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for name in workloads:
        if name not in WORKLOADS:
            raise SystemExit(f"--workloads: unknown {name!r} (have: {', '.join(WORKLOADS)})")
    for name in policies:
        if name not in POLICIES:
            raise SystemExit(f"--policies: unknown {name!r} (have: {', '.join(POLICIES)})")
    minutes = args.minutes if args.minutes is not None else (QUICK_MINUTES if args.quick else None)
    orders = parse_orders(args.orders) if args.orders else None
    starts = parse_orders(args.start, "--start") if args.start else None
    if starts is not None and len(starts) != 1:
        raise SystemExit("--start: one PREFILL/DECODE count, like 2/1")
    start = starts[0] if starts else None
    if orders and "first-order" not in policies:
        raise SystemExit("--orders: only first-order uses it; add first-order to --policies")

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dynamo_replay_") as tmp:
        tmp_dir = Path(tmp)
        npz = mocker_profile(tmp_dir)
        _, d = deployment_for(next(iter(WORKLOADS.values())))
        from app.sources.profile_files import load_profile

        max_kv = d.decode.max_kv_tokens or int(load_profile(PROFILE).decode.max_kv_tokens)
        kv_blocks = max_kv // ENGINE_BLOCK
        max_batched = d.prefill.max_num_batched_tokens or 8192
        budget = (
            d.prefill.max_replicas * d.prefill.gpus_per_engine
            + d.decode.max_replicas * d.decode.gpus_per_engine
        )

        specs: list[RunSpec] = []
        meta: dict[str, Any] = {}
        for name in workloads:
            w = WORKLOADS[name]
            requests, hash_ids = build_requests(w, minutes)
            trace_path = tmp_dir / f"{name}.jsonl"
            write_trace(requests, hash_ids, trace_path)
            peak = profile_sizing(requests, w)
            initial = (
                {"prefill": start[0], "decode": start[1]}
                if start
                else profile_sizing([r for r in requests if r.arrival_s < 300.0], w)
            )
            grid = fixed_grid(peak)
            meta[name] = {
                **asdict(w),
                "trace": str(w.trace.relative_to(REPO)),
                "requests": len(requests),
                "span_s": requests[-1].arrival_s if requests else 0.0,
                "mean_isl": sum(r.isl_tokens for r in requests) / max(1, len(requests)),
                "mean_osl": sum(r.osl_tokens for r in requests) / max(1, len(requests)),
                "peak_sizing": peak,
                "initial": initial,
                "fixed_grid": grid,
            }
            log(
                f"{name}: {len(requests)} requests over {meta[name]['span_s']:.0f} s, mean ISL "
                f"{meta[name]['mean_isl']:.0f}; start {initial}, fixed grid {grid}"
            )
            common = dict(
                workload=name,
                trace_path=str(trace_path),
                perf_npz=str(npz),
                kv_blocks=kv_blocks,
                max_batched_tokens=max_batched,
                startup_s=120.0,
                gpu_budget=budget,
                planner_max_num_seqs=args.planner_max_num_seqs,
                planner_sizing=args.sizing,
                fpm_heartbeats=args.fpm == "heartbeat",
            )
            for policy in policies:
                if policy == "fixed":
                    for p, dd in grid:
                        specs.append(
                            RunSpec(policy="fixed", prefill=p, decode=dd, label=f"fixed {p}P/{dd}D", **common)
                        )
                elif policy == "first-order":
                    for p, dd in orders or grid:
                        specs.append(
                            RunSpec(
                                policy="first-order",
                                prefill=initial["prefill"],
                                decode=initial["decode"],
                                label=f"first-order {p}P/{dd}D",
                                order=(p, dd),
                                **common,
                            )
                        )
                else:
                    specs.append(
                        RunSpec(policy=policy, prefill=initial["prefill"], decode=initial["decode"], **common)
                    )
        # Our planner's replays first, all at once as far as --jobs allows, so that they import
        # the same app/ (other work may edit the tree meanwhile; each run records a digest of
        # the code it ran); then the busiest workloads first.
        specs.sort(key=lambda s: (s.policy != "planner", -meta[s.workload]["requests"]))
        results: list[RunResult] = []
        with ProcessPoolExecutor(
            max_workers=max(1, args.jobs), mp_context=get_context("spawn"), max_tasks_per_child=1
        ) as pool:
            futures = {pool.submit(run_one, spec): spec for spec in specs}
            for future in as_completed(futures):
                spec = futures[future]
                result = future.result()
                results.append(result)
                log(
                    f"{spec.workload} {result.label}: attainment {100 * result.attainment:.1f}%, "
                    f"{result.gpu_hours:.2f} GPU-h, {result.scale_operations} scale operations, "
                    f"replay {result.wall_s:.0f} s ({len(results)}/{len(specs)})"
                )
    wall = time.perf_counter() - started

    rows: list[dict[str, Any]] = []
    for name in workloads:
        mine = [r for r in results if r.workload == name]
        for policy in ("planner", "dynamo"):
            for r in mine:
                if r.policy == policy:
                    rows.append(
                        {
                            "workload": name,
                            "policy": policy,
                            "attainment": r.attainment,
                            "gpu_hours": r.gpu_hours,
                        }
                    )
        for kind in ("fixed", "first-order"):
            chosen = best_fixed([r for r in mine if r.policy == kind])
            if chosen is not None:
                rows.append(
                    {
                        "workload": name,
                        "policy": f"best {chosen.label}",
                        "attainment": chosen.attainment,
                        "gpu_hours": chosen.gpu_hours,
                    }
                )
    digests = sorted({r.extra["app_digest"] for r in results if r.policy == "planner"})
    if len(digests) > 1:
        log(f"warning: the planner's replays ran different app/ code ({', '.join(digests)})")
    print(table(rows))
    print(
        f"\n{len(results)} replays in {wall:.0f} s"
        + (f" (first {minutes:g} minutes of each trace)" if minutes else "")
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "command": " ".join(
                    ["python", "-m", "bench.dynamo_replay", *(argv if argv is not None else sys.argv[1:])]
                ),
                "minutes": minutes,
                "wall_s": wall,
                "jobs": args.jobs,
                "world": {
                    "mocker_profile": str(PROFILE.relative_to(REPO)),
                    "kv_blocks": kv_blocks,
                    "block_size": ENGINE_BLOCK,
                    "max_num_seqs": MAX_NUM_SEQS,
                    "max_num_batched_tokens": max_batched,
                    "startup_s": 120.0,
                },
                "workloads": meta,
                "table": rows,
                "runs": [asdict(r) for r in results],
            },
            indent=1,
        )
    )
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
