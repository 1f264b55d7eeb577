"""`planner replay`: a policy steering the simulated cluster through a real trace, on simulated time.

One run: read the replay file and the trace, apply `--rate-scale`, build the planner's model and
the world's truth, compute the clairvoyant oracle, then alternate `cluster.run_until(next tick)`
and `policy.tick(...)`, applying targets at once (the simulator plays the orchestrator: the
planner's decision stays pending until the ready counts reach it). It ends when the last request
has finished; engines are billed until then.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from app.config import ConfigError
from app.core.errors import ProfileError
from app.core.perf.interpolation import PerfModel
from app.core.traces import TraceRequest
from app.embedding import EmbeddedPlanner
from app.planner_setup import DEFAULT_MAX_NUM_BATCHED_TOKENS
from app.sim.replay.config import POLICIES, ReplayConfig
from app.sim.replay.oracle import OraclePlan, oracle_plan
from app.sim.replay.policies import OraclePolicy, PlannerPolicy, Policy, ReactivePolicy, StaticPolicy
from app.sim.replay.results import DecisionEvent, ReplayResult
from app.sim.world.cluster import ROLES, Cluster
from app.sim.world.truth import TruthModel
from app.sources.profile_files import load_profile

# How often the progress callback hears from a run, in simulated seconds.
PROGRESS_STEP_S = 60.0
# `planner replay` prints a progress line when this much wall time has passed since the last one,
# or when the run has simulated another PROGRESS_FRACTION of the trace.
PROGRESS_EVERY_WALL_S = 5.0
PROGRESS_FRACTION = 0.1


@dataclass(frozen=True)
class ReplayProgress:
    """Where a run is, in simulated terms; the shell that prints it adds the wall time."""

    sim_s: float  # simulated time reached
    last_arrival_s: float  # the trace's last arrival: after it the run only drains
    ticks: int  # the policy's ticks so far
    requests_done: int
    requests: int


Progress = Callable[[ReplayProgress], None]


@dataclass(frozen=True)
class World:
    """What one replay's world is made of, built once and shared by every policy compared."""

    config: ReplayConfig
    requests: list[TraceRequest]
    model: PerfModel  # the planner's
    truth: TruthModel  # the world's
    oracle: OraclePlan

    @property
    def gpus_per_engine(self) -> dict[str, int]:
        d = self.config.deployment
        return {role: d.role(role).gpus_per_engine for role in ROLES}


def _model(path: Path, what: str) -> PerfModel:
    try:
        return PerfModel.from_profile(load_profile(path))
    except ProfileError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def load_models(config: ReplayConfig) -> tuple[PerfModel, TruthModel]:
    """The planner's model and the world's truth; a bad profile is one ConfigError."""
    d, sim = config.deployment, config.simulation
    model = _model(config.resolve(d.profile), "profile")  # type: ignore[arg-type]
    truth_model = (
        model if sim.truth_profile is None else _model(config.resolve(sim.truth_profile), "truth profile")
    )
    truth = TruthModel(
        truth_model,
        scale=sim.truth_scale,
        max_num_batched_tokens=d.prefill.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        max_kv_tokens=d.decode.max_kv_tokens,
        world=sim.truth,
        max_num_seqs=d.decode.max_num_seqs,
    )
    return model, truth


def build_world(
    config: ReplayConfig,
    requests: Sequence[TraceRequest],
    models: tuple[PerfModel, TruthModel] | None = None,
) -> World:
    if not requests:
        raise ConfigError("the trace has no requests")
    d, sim = config.deployment, config.simulation
    model, truth = models or load_models(config)
    requests = list(requests)
    plan = oracle_plan(
        requests,
        truth,
        interval_s=sim.oracle.interval_s,
        ttft_target_ms=d.sla.ttft_ms,
        itl_target_ms=d.sla.itl_ms,
        startup_delay_s=sim.startup_delay_s,
        gpus_per_engine={role: d.role(role).gpus_per_engine for role in ROLES},
        quantile=sim.oracle.quantile,
    )
    return World(config, requests, model, truth, plan)


def make_policy(name: str, world: World) -> Policy:
    d, sim = world.config.deployment, world.config.simulation
    oracle = OraclePolicy(world.oracle)
    initial = oracle.initial()
    if sim.initial_prefill is not None:
        initial["prefill"] = sim.initial_prefill
    if sim.initial_decode is not None:
        initial["decode"] = sim.initial_decode
    if name == "oracle":
        return oracle
    if name == "static":
        return StaticPolicy.for_peak(
            world.requests, world.model, itl_target_ms=d.sla.itl_ms, gpus=world.gpus_per_engine
        )
    if name == "reactive":
        bounds = {role: (d.role(role).min_replicas, d.role(role).max_replicas) for role in ROLES}
        return ReactivePolicy(sim.reactive, initial, bounds)
    if name in ("planner", "seed"):
        # planner: SLA scaling; seed: the reference's throughput and load modes, as configured.
        algorithm = "sla" if name == "planner" else "seed"
        d = d.model_copy(update={"scaling": d.scaling.model_copy(update={"algorithm": algorithm})})
        planner = EmbeddedPlanner.from_config(d, base_dir=world.config.base_dir)
        return PlannerPolicy(planner, initial, with_fpm=algorithm == "sla" or d.load.enabled, name=name)
    raise ConfigError(f"--policy: unknown policy {name!r} (choose from {', '.join(POLICIES)})")


def run_policy(
    world: World,
    policy: Policy,
    *,
    trace_name: str,
    settings: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> ReplayResult:
    sim = world.config.simulation
    started = time.perf_counter()
    cluster = Cluster(
        world.truth,
        world.requests,
        initial=policy.initial(),
        startup_delay_s=sim.startup_delay_s,
        gpus_per_engine=world.gpus_per_engine,
        model_name=world.config.deployment.model_name or world.config.deployment.name,
        record_roles=getattr(policy, "record_fpm_roles", ()),
        removal_grace_s=sim.removal_grace_s,
    )
    decisions: list[DecisionEvent] = []
    next_tick = policy.first_tick_s()
    expected_s = cluster.last_arrival_s
    horizon = 0.0
    while not cluster.done:
        horizon += PROGRESS_STEP_S
        while next_tick <= horizon and not cluster.done:
            cluster.run_until(next_tick)
            if cluster.done:
                break
            step = policy.tick(next_tick, cluster)
            if step.target is not None:
                hints = step.remove if sim.removal_hints else {}
                for role, count in step.target.items():
                    if role in ROLES and count != cluster.targets[role]:
                        cluster.set_target(role, count, hints.get(role, ()))
            decisions.append(DecisionEvent(next_tick, step.target, step.reason))
            # A policy that answers with a time not after now would spin.
            next_tick = step.next_tick_s if step.next_tick_s > next_tick else math.inf
        if not cluster.done:
            cluster.run_until(horizon)
        if progress is not None:
            # The last step ends where the last request finished, not at the step's horizon.
            reached_s = _last_finish_s(cluster) if cluster.done else horizon
            progress(
                ReplayProgress(
                    reached_s, expected_s, len(decisions), cluster.completed, len(cluster.requests)
                )
            )
    end_s = _last_finish_s(cluster)
    return ReplayResult(
        policy=policy.name,
        trace=trace_name,
        ttft_target_ms=world.config.deployment.sla.ttft_ms,
        itl_target_ms=world.config.deployment.sla.itl_ms,
        startup_delay_s=sim.startup_delay_s,
        truth_scale=sim.truth_scale,
        gpus_per_engine=world.gpus_per_engine,
        requests=cluster.requests,
        timeline=cluster.timeline,
        decisions=decisions,
        gpu_hours=cluster.gpu_seconds(at_s=end_s) / 3600.0,
        oracle_gpu_hours=world.oracle.gpu_hours,
        oracle_timeline=world.oracle.timeline,
        end_s=end_s,
        wall_s=time.perf_counter() - started,
        settings=settings or {},
        cut_off=cluster.cut_off,
        scale_to_zero=world.config.deployment.scaling.scale_to_zero.enabled,
        cost_per_gpu_hour=world.config.deployment.cost_per_gpu_hour,
    )


def _last_finish_s(cluster: Cluster) -> float:
    """When the last request ended: finished, or cut off with its engine."""
    return max((r.finish_s for r in cluster.requests if r.finish_s is not None), default=cluster.now)


def load_requests(config: ReplayConfig, trace: Path) -> list[TraceRequest]:
    """The trace at the configured rate scale; a bad file is one ConfigError naming it."""
    from app.sim.world.workload import expand_rate
    from app.sources.traces import load_trace

    try:
        requests = load_trace(trace)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--trace: {exc}") from None
    sim = config.simulation
    return expand_rate(requests, sim.rate_scale, sim.seed, spread_s=sim.rate_spread_s)


class ProgressLines:
    """Progress of a replay on a stream, one line at a time: when PROGRESS_EVERY_WALL_S of wall
    time have passed since the last line, or another PROGRESS_FRACTION of the trace's simulated
    time is done. Wall time is the shell's business: the run itself only reports simulated time."""

    def __init__(
        self,
        label: str,
        *,
        started_s: float,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.label = label
        self.started_s = started_s
        self.stream = stream or sys.stderr
        self.clock = clock
        self.last_line_s = clock()
        self.next_fraction = PROGRESS_FRACTION

    def __call__(self, p: ReplayProgress) -> None:
        now = self.clock()
        fraction = p.sim_s / p.last_arrival_s if p.last_arrival_s > 0 else 1.0
        if fraction < self.next_fraction and now - self.last_line_s < PROGRESS_EVERY_WALL_S:
            return
        while self.next_fraction <= fraction:
            self.next_fraction += PROGRESS_FRACTION
        self.last_line_s = now
        if p.sim_s <= p.last_arrival_s:
            where = f"sim {p.sim_s:.0f}/{p.last_arrival_s:.0f} s ({fraction:.0%})"
        else:
            where = f"sim {p.sim_s:.0f} s (draining after the last arrival at {p.last_arrival_s:.0f} s)"
        print(
            f"{self.label}: {where}, {p.ticks} ticks, {p.requests_done}/{p.requests} requests done, "
            f"{now - self.started_s:.1f} s wall",
            file=self.stream,
            flush=True,
        )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def check_output_folder(out: Path) -> None:
    """Create `out` and make sure a file can be written there, before a replay that may take
    minutes: a bad --out is one ConfigError now, not a traceback at the end."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out: {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".planner-write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(f"--out: cannot write to {out}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"--out: cannot write to {out}: permission denied")


def run_command(args: Any, *, started_s: float | None = None) -> int:
    """`planner replay` (arguments parsed by app/cli/replay.py; the output folder already checked).
    `started_s`: when the command started (`time.perf_counter()`), so that the wall time it
    reports is the whole command's, loading and writing included."""
    from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
    from app.sim.replay.outputs import summarize, write_outputs

    started_s = time.perf_counter() if started_s is None else started_s
    quiet = bool(getattr(args, "quiet", False))

    def note(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr, flush=True)

    if args.modes is not None and args.policy != "seed":
        raise ConfigError(f"--modes: the seed's modes; use them with --policy seed, not {args.policy}")
    if getattr(args, "scale_to_zero_quiet_s", None) is not None and args.policy != "planner":
        raise ConfigError(f"--scale-to-zero: SLA scaling's (--policy planner), not {args.policy}'s")
    config = load_replay_config(args.config or DEFAULT_REPLAY_CONFIG, args.deployment)
    config = with_overrides(
        config,
        profile=args.profile,
        prefill_gpus=args.prefill_gpus,
        decode_gpus=args.decode_gpus,
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        startup_delay_s=args.startup_delay_s,
        truth_scale=args.truth_scale,
        truth_profile=args.truth_profile,
        truth=args.truth,
        seed=args.seed,
        rate_scale=args.rate_scale,
        rate_spread_s=getattr(args, "rate_spread_s", None),
        removal_grace_s=getattr(args, "removal_grace_s", None),
        removal_hints=getattr(args, "removal_hints", None),
        modes=args.modes,
        scale_to_zero_quiet_s=getattr(args, "scale_to_zero_quiet_s", None),
        scale_to_zero_forecast=bool(getattr(args, "scale_to_zero_forecast", False)),
    )
    trace = Path(args.trace)
    requests = load_requests(config, trace)
    models = load_models(config)
    note(f"trace {trace}: {len(requests)} requests over {requests[-1].arrival_s:.0f} s")
    note("computing the clairvoyant oracle ...")
    world = build_world(config, requests, models)
    policy = make_policy(args.policy, world)
    settings = {
        "config": str(config.path),
        "deployment": config.deployment.name,
        "trace": str(trace),
        "policy": args.policy,
        "modes": (
            [m for m in ("load", "throughput") if getattr(config.deployment, m).enabled]
            if args.policy == "seed"
            else []
        ),
        "rate_scale": config.simulation.rate_scale,
        "rate_spread_s": config.simulation.rate_spread_s,
        "seed": config.simulation.seed,
        "profile": config.deployment.profile,
        "truth_profile": config.simulation.truth_profile or config.deployment.profile,
    }
    if config.simulation.removal_grace_s is not None:
        settings["removal_grace_s"] = config.simulation.removal_grace_s
        settings["removal_hints"] = config.simulation.removal_hints
    zero = config.deployment.scaling.scale_to_zero
    if zero.enabled:
        settings["scale_to_zero_quiet_s"] = zero.quiet_s
        settings["scale_to_zero_respect_return_forecast"] = zero.respect_return_forecast
    note(f"replaying with policy {args.policy} ({time.perf_counter() - started_s:.1f} s wall so far)")
    progress = None if quiet else ProgressLines(f"replay {args.policy}", started_s=started_s)
    result = run_policy(world, policy, trace_name=trace.name, settings=settings, progress=progress)
    summary = summarize(result, truth=world.truth)
    try:
        paths = write_outputs(result, Path(args.out), summary=summary)
    except OSError as exc:
        raise ConfigError(f"--out: cannot write the outputs to {args.out}: {exc.strerror or exc}") from None
    # The whole command: its imports, the trace, the oracle, the run and the outputs.
    wall_s = time.perf_counter() - started_s
    print(
        f"{result.policy}: {summary['requests']} requests, SLO attainment {summary['slo_attainment']:.1%}, "
        f"{summary['gpu_hours']:.2f} GPU-hours ({summary['oracle_gpu_hours']:.2f} for the oracle), "
        f"cost {summary['cost']:.2f} at {summary['cost_per_gpu_hour']:g} per GPU-hour, "
        f"{summary['scaling_actions']} scaling actions; {wall_s:.1f} s wall in all "
        f"({result.wall_s:.1f} s replaying {summary['simulated_s']:.0f} simulated s)"
    )
    if "scale_to_zero" in summary:
        z = summary["scale_to_zero"]
        ttft = z["wake_up_ttft_ms"]
        print(
            f"scale to zero: {z['wake_ups']} wake-ups, {z['zero_s']:.0f} s at zero "
            f"({z['gpu_hours_saved_at_zero']:.2f} GPU-hours), first request's TTFT p50 "
            f"{_ms(ttft['p50'])}, max {_ms(ttft['max'])}"
        )
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0
