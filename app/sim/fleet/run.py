"""`planner replay --config <fleet file>`: several deployments, one trace each, under one GPU budget.

A fleet file is a replay file (deployments + `simulation:`) with a `fleet:` section (app/config.py
`FleetConfig`) and, under `simulation.traces`, one trace or named workload per deployment. Each
deployment gets its own simulated cluster and its own planner (SLA scaling, exactly as
`planner replay` runs it); every `fleet.interval_s` the clusters run to the same simulated time
and then, by policy:

- `fleet`: the fleet step (app/core/fleet/step.py) grants each deployment engines from the wishes its
  planner made at the previous tick (and the part of each for the load now, read from that tick's
  SLA diagnostics by app/core/fleet/value.py); each planner then ticks with its grant as per-role
  maximum bounds, so that its decision is what its cluster runs;
- `equal`: a static partition: each deployment's planner within budget ÷ deployments GPUs of its
  type (the planner's own GPU-budget stage), whatever the others do;
- `fcfs`: independent planners that ignore each other, clipped at the budget first come first
  served: a scale-up gets the free GPUs in the order the requests became unmet, and an engine
  once granted is kept until its own planner lets it go (pods pending on a full cluster);
- `oracle`: no planner; every deployment's clairvoyant schedule, its r* cut to the budget by the
  fleet step (app/sim/fleet/oracle.py). Every policy's run computes it, so that each reports
  its GPU-hours over the oracle's.

Engines being drained still hold their GPUs, so the GPUs billed at one moment may briefly exceed
the budget by the engines finishing their requests; `peak_billed_gpus` reports it. A deployment
whose trace has ended leaves the fleet (its wish becomes zero) and is billed until its last
request finished, as in a single replay.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from app.config import (
    ConfigError,
    DeploymentConfig,
    FleetConfig,
    Strict,
    format_validation_error,
    read_yaml_mapping,
    validate_deployments,
)
from app.core.fleet.grants import asked_of, grant_record, present_of, wish_of, with_grant
from app.core.fleet.step import FleetDecision, FleetMember, FleetSettings, FleetState, fleet_step
from app.core.fleet.variants import Variant, variant_key
from app.core.traces import TraceRequest
from app.core.types import ActiveOverrides
from app.embedding import EmbeddedPlanner, TickInput, TrafficWindow
from app.sim.fleet.oracle import FleetOracle, fleet_oracle
from app.sim.fleet.variant_cluster import VariantCluster
from app.sim.replay.config import ReplayConfig, SimulationConfig, _SimulationSection
from app.sim.replay.outputs import summarize
from app.sim.replay.results import DecisionEvent, ReplayResult
from app.sim.replay.run import load_models
from app.sim.world.cluster import ROLES, Cluster
from app.sim.world.frontend import FrontendCounters

FLEET_POLICIES = ("fleet", "equal", "fcfs", "oracle")


class TraceSpec(Strict):
    """One deployment's traffic: a trace file (relative to the fleet file) or a named workload."""

    trace: str | None = None
    workload: str | None = None  # app/sim/world/workload.py WORKLOADS
    rate_scale: float = Field(default=1.0, gt=0)  # below 1 thins the trace, above 1 multiplies it
    duration_s: float | None = Field(default=None, gt=0)  # keep only the arrivals before this
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _one_source(self) -> TraceSpec:
        if (self.trace is None) == (self.workload is None):
            raise ValueError("give exactly one of trace or workload")
        if self.workload is not None:
            from app.sim.world.workload import WORKLOADS

            if self.workload not in WORKLOADS:
                raise ValueError(f"workload: unknown {self.workload!r} (choose from {', '.join(WORKLOADS)})")
        return self


class _TracesSection(Strict):
    # Wrapped so that errors name the field as `simulation.traces.chat.workload`.
    traces: dict[str, TraceSpec]


@dataclass(frozen=True)
class FleetReplayConfig:
    path: Path
    deployments: tuple[DeploymentConfig, ...]
    fleet: FleetConfig
    simulation: SimulationConfig
    traces: dict[str, TraceSpec]

    @property
    def base_dir(self) -> Path:
        return self.path.resolve().parent

    def resolve(self, relative: str) -> Path:
        candidate = Path(relative).expanduser()
        return candidate if candidate.is_absolute() else self.base_dir / candidate

    def replay_config(self, deployment: DeploymentConfig) -> ReplayConfig:
        return ReplayConfig(path=self.path, deployment=deployment, simulation=self.simulation)


def is_fleet_file(path: str | Path) -> bool:
    """Whether a replay file has a `fleet:` section (then `planner replay` replays the fleet)."""
    return "fleet" in read_yaml_mapping(Path(path), what="replay file", hint="")


def load_fleet_config(path: str | Path) -> FleetReplayConfig:
    path = Path(path)
    raw = read_yaml_mapping(path, what="replay file", hint="")
    simulation_raw = dict(raw.pop("simulation", None) or {})
    traces_raw = simulation_raw.pop("traces", None)
    file = validate_deployments(raw, str(path))
    if file.fleet is None:
        raise ConfigError(f"{path}: fleet: required for a fleet replay")
    for d in file.deployments:
        if d.mode != "disagg":
            raise ConfigError(
                f"{path}: deployments: {d.name}: mode {d.mode}: the simulator models disagg only"
            )
        if not d.profile:
            raise ConfigError(f"{path}: deployments: {d.name}: profile: required for replay")
    try:
        simulation = _SimulationSection.model_validate({"simulation": simulation_raw}).simulation
        traces = _TracesSection.model_validate({"traces": traces_raw or {}}).traces
    except ValidationError as exc:
        message = format_validation_error(str(path), exc)
        raise ConfigError(message.replace(f"{path}: traces", f"{path}: simulation.traces")) from None
    names = [d.name for d in file.deployments]
    for name in traces:
        if name not in names:
            raise ConfigError(f"{path}: simulation.traces.{name}: no deployment named {name!r}")
    for name in names:
        if name not in traces:
            raise ConfigError(f"{path}: simulation.traces.{name}: every deployment needs a trace or workload")
    # The fleet replays SLA scaling (the planner's own algorithm) for every deployment.
    deployments = tuple(
        d.model_copy(update={"scaling": d.scaling.model_copy(update={"algorithm": "sla"})})
        for d in file.deployments
    )
    return FleetReplayConfig(path, deployments, file.fleet, simulation, traces)


def load_fleet_requests(config: FleetReplayConfig, name: str) -> list[TraceRequest]:
    from app.sim.world.workload import build_workload, expand_rate
    from app.sources.traces import load_trace

    spec = config.traces[name]
    try:
        if spec.workload is not None:
            requests = build_workload(spec.workload)
        else:
            requests = load_trace(config.resolve(spec.trace))  # type: ignore[arg-type]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"simulation.traces.{name}: {exc}") from None
    if spec.duration_s is not None:
        requests = [r for r in requests if r.arrival_s < spec.duration_s]
    requests = expand_rate(requests, spec.rate_scale, spec.seed)
    if not requests:
        raise ConfigError(f"simulation.traces.{name}: no requests")
    return requests


# --- one run -----------------------------------------------------------------------------------


@dataclass
class _Member:
    """One deployment in a fleet run: its cluster, its planner and what the fleet granted it."""

    deployment: DeploymentConfig
    requests: list[TraceRequest]
    cluster: Cluster
    planner: EmbeddedPlanner
    gpus_per_engine: dict[str, int]
    gpu_type: str
    next_tick_s: float
    wish: dict[str, int]
    present: dict[str, int] | None = None  # the wish's part for the load now (rule 3b)
    grant: dict[str, int] | None = None  # None: no cap (equal, before the first fleet step)
    fleet_grant: dict[str, Any] | None = None  # the fleet step's grant (`DeploymentGrant.as_dict()`)
    desired: dict[str, int] | None = None  # the planner's latest decision (fcfs clips it)
    grant_changes: int = 0
    peak_wish_gpus: int = 0
    decisions: list[DecisionEvent] = field(default_factory=list)
    counters: Any = None
    pending_since: dict[str, float] = field(default_factory=dict)  # fcfs: unmet since
    end_s: float | None = None
    variants: tuple[Variant, ...] = ()  # hardware variants: `cluster` is a VariantCluster
    mix: dict[str, dict[str, int]] | None = None  # the fleet's grant per role and variant

    @property
    def name(self) -> str:
        return self.deployment.name

    def gpus(self, engines: dict[str, int]) -> int:
        return sum(n * self.gpus_per_engine[r] for r, n in engines.items())


@dataclass
class FleetRunResult:
    policy: str
    results: dict[str, ReplayResult]
    grant_changes: dict[str, int]
    peak_wish_gpus: dict[str, int]
    peak_billed_gpus: dict[str, int]  # per GPU type
    grants_log: list[dict[str, Any]]  # one row per (tick, deployment, role) whose grant changed
    wall_s: float
    oracle: FleetOracle | None = None
    # Deployments with hardware variants: GPU-hours per variant, and their cost at its price.
    variant_gpu_hours: dict[str, dict[str, float]] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)


def run_fleet(config: FleetReplayConfig, policy: str, *, progress: bool = False) -> FleetRunResult:
    if policy not in FLEET_POLICIES:
        raise ConfigError(f"--fleet-policy: unknown {policy!r} (choose from {', '.join(FLEET_POLICIES)})")
    started = time.perf_counter()
    fleet, sim = config.fleet, config.simulation
    by_type: dict[str, list[str]] = {}
    for d in config.deployments:
        by_type.setdefault(fleet.member(d.name).gpu_type or "", []).append(d.name)
    worlds = {}
    for d in config.deployments:
        _, truth = load_models(config.replay_config(d))
        worlds[d.name] = (truth, load_fleet_requests(config, d.name))
    # The yardstick of every policy, and the schedule the oracle policy runs.
    oracle = fleet_oracle(
        config.deployments,
        fleet,
        {name: requests for name, (_, requests) in worlds.items()},
        {name: truth for name, (truth, _) in worlds.items()},
        interval_s=sim.oracle.interval_s,
        startup_delay_s=sim.startup_delay_s,
        quantile=sim.oracle.quantile,
    )
    members: list[_Member] = []
    for d in config.deployments:
        if fleet.member(d.name).variants and policy != "fleet":
            raise ConfigError(
                f"--fleet-policy {policy}: fleet.deployments.{d.name}.variants: hardware variants "
                "are replayed with the fleet policy only"
            )
        gpu_type = fleet.member(d.name).gpu_type or ""
        deployment = d
        if policy == "equal":
            # A static partition: the budget of its type, shared equally, as its own GPU budget.
            share = fleet.budget_gpus[gpu_type] // len(by_type[gpu_type])
            deployment = d.model_copy(update={"gpu_budget": share})
        truth, requests = worlds[d.name]
        initial = {
            "prefill": sim.initial_prefill if sim.initial_prefill is not None else d.prefill.min_replicas,
            "decode": sim.initial_decode if sim.initial_decode is not None else d.decode.min_replicas,
        }
        if policy == "oracle":
            initial = {role: oracle.schedule[d.name][role].initial for role in ROLES}
        gpus = {role: d.role(role).gpus_per_engine for role in ROLES}
        planner = EmbeddedPlanner.from_config(deployment, base_dir=config.base_dir)
        variants: tuple[Variant, ...] = ()
        if fleet.member(d.name).variants:
            variants, cluster = _variant_cluster(config, d, requests, initial)
        else:
            cluster = Cluster(
                truth,
                requests,
                initial=initial,
                startup_delay_s=sim.startup_delay_s,
                gpus_per_engine=gpus,
                model_name=d.model_name or d.name,
                record_roles=("prefill",),
            )
        members.append(
            _Member(
                d,
                requests,
                cluster,
                planner,
                gpus,
                gpu_type,
                planner.initial_tick_s(),
                dict(initial),
                variants=variants,
            )
        )
    state = FleetState()
    log: list[dict[str, Any]] = []
    peak_billed = dict.fromkeys(fleet.budget_gpus, 0)
    interval_s = fleet.interval_s
    now = 0.0
    last_progress = 0.0
    while not all(m.cluster.done for m in members):
        now += interval_s
        for m in members:
            if not m.cluster.done:
                m.cluster.run_until(now)
                if m.cluster.done:
                    m.end_s = max(r.finish_s for r in m.cluster.requests)  # type: ignore[type-var]
        live = [m for m in members if not m.cluster.done]
        if policy == "fleet":
            decision = _fleet_grants(members, config, state, now)
            state = decision.state
            for m in members:
                if m.variants:
                    _variant_grant(m, decision, now, log)
                    continue
                grant = dict(decision.grants[m.name].engines)
                m.fleet_grant = decision.grants[m.name].as_dict()
                if m.grant is None or grant != m.grant:
                    # The first grant is logged (the grants replay from the log) but not a change.
                    m.grant_changes += m.grant is not None
                    log.extend(_log_rows(now, m, grant, decision))
                m.grant = grant
        if policy == "oracle":
            for m in live:
                for role in ROLES:
                    count = oracle.schedule[m.name][role].count_at(now)
                    if count != m.cluster.targets[role]:
                        m.cluster.set_target(role, count)
        for m in live:
            if policy != "oracle" and m.next_tick_s <= now:
                _tick(m, now, with_caps=policy == "fleet")
        if policy == "fcfs":
            _first_come_first_served(live, fleet.budget_gpus, now, log)
        for m in live:
            if m.grant is not None:
                for role in ROLES:
                    # The cap binds now; the planner's next decision will already respect it.
                    if m.cluster.targets[role] > m.grant[role]:
                        m.cluster.set_target(role, m.grant[role])
        for gpu_type in peak_billed:
            billed = sum(
                m.cluster.counts(role)[0] * m.gpus_per_engine[role]
                for m in live
                if m.gpu_type == gpu_type and not m.variants
                for role in ROLES
            ) + sum(m.cluster.billed_gpus().get(gpu_type, 0) for m in live if m.variants)  # type: ignore[attr-defined]
            peak_billed[gpu_type] = max(peak_billed[gpu_type], billed)
        if progress and now - last_progress >= 300:
            last_progress = now
            print(f"  {policy}: {now:.0f} simulated s", file=sys.stderr)
    if policy == "oracle":
        for m in members:  # its wish is r* cut to the budget
            fitted = oracle.fitted[m.name]
            m.peak_wish_gpus = max(
                (m.gpus({role: fitted[role][k] for role in ROLES}) for k in range(len(fitted["prefill"]))),
                default=0,
            )
    results = {m.name: _result(m, config, policy, oracle.gpu_hours[m.name]) for m in members}
    variant_hours, cost = {}, {}
    for m in members:
        if m.variants:
            end_s = m.end_s if m.end_s is not None else m.cluster.now
            seconds = m.cluster.variant_gpu_seconds(at_s=end_s)  # type: ignore[attr-defined]
            variant_hours[m.name] = {v: gpu_s / 3600.0 for v, gpu_s in seconds.items()}
            cost[m.name] = m.cluster.cost(at_s=end_s)  # type: ignore[attr-defined]
    return FleetRunResult(
        policy=policy,
        results=results,
        grant_changes={m.name: m.grant_changes for m in members},
        peak_wish_gpus={m.name: m.peak_wish_gpus for m in members},
        peak_billed_gpus=peak_billed,
        grants_log=log,
        wall_s=time.perf_counter() - started,
        oracle=oracle,
        variant_gpu_hours=variant_hours,
        cost=cost,
    )


def _fleet_grants(
    members: list[_Member], config: FleetReplayConfig, state: FleetState, now: float
) -> FleetDecision:
    fleet = config.fleet
    view = []
    for m in members:
        entry = fleet.member(m.name)
        wish = {role: 0 for role in ROLES} if m.cluster.done else m.wish
        present = None if m.cluster.done or m.variants else m.present
        view.append(
            FleetMember(
                name=m.name,
                gpu_type=m.gpu_type,
                priority=entry.priority,
                guaranteed_gpus=entry.guaranteed_gpus,
                max_gpus=entry.max_gpus,
                gpus_per_engine=m.gpus_per_engine,  # type: ignore[arg-type]
                wish=wish,  # type: ignore[arg-type]
                variants=m.variants,
                present=present,  # type: ignore[arg-type]
            )
        )
    settings = FleetSettings(budget_gpus=fleet.budget_gpus, margin=fleet.margin, hold_s=fleet.hold_s)
    return fleet_step(view, settings, state, now)


def _variant_cluster(
    config: FleetReplayConfig, d: DeploymentConfig, requests: list[TraceRequest], initial: dict[str, int]
) -> tuple[tuple[Variant, ...], VariantCluster]:
    """Each variant's engines on a truth model of its own profile (the world's settings of
    `load_models`, on the variant's perf model)."""
    from app.fleet_hardware import load_variants, variant_models
    from app.planner_setup import DEFAULT_MAX_NUM_BATCHED_TOKENS
    from app.sim.world.truth import TruthModel

    sim, entry = config.simulation, config.fleet.member(d.name)
    variants = load_variants(d, entry, config.base_dir)
    truths = {
        name: TruthModel(
            model,
            scale=sim.truth_scale,
            max_num_batched_tokens=d.prefill.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
            max_kv_tokens=d.decode.max_kv_tokens,
            world=sim.truth,
            max_num_seqs=d.decode.max_num_seqs,
        )
        for name, model in variant_models(d, entry, config.base_dir)
    }
    cluster = VariantCluster(
        variants,
        truths,
        requests,
        initial=initial,
        startup_delay_s=sim.startup_delay_s,
        model_name=d.model_name or d.name,
        record_roles=("prefill",),
    )
    return variants, cluster


def _variant_grant(m: _Member, decision: FleetDecision, now: float, log: list[dict[str, Any]]) -> None:
    """A deployment with variants: its grant per variant runs on its cluster, and its planner
    gets the grant in engines of its primary variant (capacity-equivalent) as its cap."""
    mix = {
        role: {v.name: decision.grants[variant_key(m.name, v.name)].engines.get(role, 0) for v in m.variants}  # type: ignore[call-overload]
        for role in ROLES
    }
    if m.mix is None or mix != m.mix:
        m.grant_changes += m.mix is not None
        for v in m.variants:
            g = decision.grants[variant_key(m.name, v.name)]
            cut_by = "; ".join(f"{c.by}: {c.why}" for c in g.cut_by)
            for role in ROLES:
                if m.mix is None or mix[role][v.name] != m.mix[role][v.name]:
                    log.append(
                        {
                            "at_s": now,
                            "deployment": g.name,
                            "role": role,
                            "wish": g.roles[role].wish,  # type: ignore[index]
                            "grant": mix[role][v.name],
                            "reason": f"{g.roles[role].reason}: {g.roles[role].detail}",  # type: ignore[index]
                            "cut_by": cut_by,
                        }
                    )
    m.mix = mix
    m.grant = m.cluster.set_grant(mix)  # type: ignore[attr-defined]


def _tick(m: _Member, now: float, *, with_caps: bool) -> None:
    """The deployment's planner, as `planner replay` ticks it, with the grant as bounds."""
    cluster = m.cluster
    counters = cluster.frontend.snapshot(now)
    before = m.counters or FrontendCounters().snapshot(m.planner.start_s)
    m.counters = counters
    window = TrafficWindow(**asdict(FrontendCounters.window(before, counters)))
    # The grant binds as per-role maximum bounds, exactly as `planner serve` applies it.
    overrides = with_grant(ActiveOverrides(), m.fleet_grant if with_caps else None, m.deployment.bounds())
    out = m.planner.on_tick(
        TickInput(
            now_s=now,
            traffic=window,
            ready=cluster.ready_counts(),
            expected=dict(cluster.targets),
            fpm=cluster.fpm_snapshot(),
            fpm_records=cluster.take_fpm_records(),
            overrides=overrides,
        )
    )
    stages = out.diagnostics["stages"]
    wish = wish_of(stages[0]["replicas"], m.deployment.bounds())
    if wish is not None:
        # The wish: what SLA scaling asks for before any cap, within the deployment's own bounds.
        m.wish = dict(wish)
        m.peak_wish_gpus = max(m.peak_wish_gpus, m.gpus(m.wish))
        m.present = present_of(
            out.diagnostics.get("sla"), m.wish, m.deployment.bounds(), itl_target_ms=m.deployment.sla.itl_ms
        )
    fleet = grant_record(m.fleet_grant if with_caps else None, asked=asked_of(stages), target=out.target)
    reasons = [*out.reasons, f"fleet: {fleet['note']}"] if fleet and fleet["note"] else out.reasons
    if out.target is not None:
        m.desired = {r: int(out.target[r]) for r in ROLES}
        for role, count in out.target.items():
            if role in ROLES and count != cluster.targets[role]:
                cluster.set_target(role, count)
    m.decisions.append(DecisionEvent(now, out.target, "; ".join(reasons)))
    m.next_tick_s = out.next_tick_s if out.next_tick_s > now else math.inf


def _first_come_first_served(
    live: list[_Member], budgets: dict[str, int], now: float, log: list[dict[str, Any]]
) -> None:
    """Each planner's own target, clipped: engines once granted stay until their planner lowers
    its target; unmet scale-ups take the free GPUs in the order they became unmet."""
    for gpu_type, budget in budgets.items():
        group = [m for m in live if m.gpu_type == gpu_type]
        desired = {m.name: dict(m.desired or m.cluster.targets) for m in group}
        # Released engines go back at once; before the first grant nothing is held yet, so the
        # clusters' initial engines are the first requests served.
        held = {
            m.name: {r: min(m.grant[r], desired[m.name][r]) if m.grant else 0 for r in ROLES} for m in group
        }
        free = budget - sum(m.gpus(held[m.name]) for m in group)
        queue = []
        for i, m in enumerate(group):
            for r in ROLES:
                if desired[m.name][r] > held[m.name][r]:
                    m.pending_since.setdefault(r, now)
                    queue.append((m.pending_since[r], i, r, m))
                else:
                    m.pending_since.pop(r, None)
        for _, _, r, m in sorted(queue, key=lambda q: (q[0], q[1], q[2])):
            g = m.gpus_per_engine[r]
            add = max(0, min(desired[m.name][r] - held[m.name][r], free // g))
            held[m.name][r] += add
            free -= add * g
        for m in group:
            grant = held[m.name]
            if m.grant is not None and grant != m.grant:
                m.grant_changes += 1
                log.extend(
                    {
                        "at_s": now,
                        "deployment": m.name,
                        "role": r,
                        "wish": desired[m.name][r],
                        "grant": grant[r],
                        "reason": "fcfs",
                        "cut_by": "",
                    }
                    for r in ROLES
                    if grant[r] != m.grant[r]
                )
            m.grant = grant
            for r in ROLES:
                if m.cluster.targets[r] < grant[r]:
                    m.cluster.set_target(r, grant[r])


def _log_rows(now: float, m: _Member, grant: dict[str, int], decision: FleetDecision) -> list[dict[str, Any]]:
    g = decision.grants[m.name]
    cut_by = "; ".join(f"{c.by}: {c.why}" for c in g.cut_by)
    return [
        {
            "at_s": now,
            "deployment": m.name,
            "role": role,
            "wish": g.roles[role].wish,
            "grant": grant[role],
            "reason": f"{g.roles[role].reason}: {g.roles[role].detail}",
            "cut_by": cut_by,
        }
        for role in ROLES
        if m.grant is None or grant[role] != m.grant[role]
    ]


def _result(m: _Member, config: FleetReplayConfig, policy: str, oracle_gpu_hours: float) -> ReplayResult:
    sim, d = config.simulation, m.deployment
    end_s = m.end_s if m.end_s is not None else m.cluster.now
    return ReplayResult(
        policy=policy,
        trace=config.traces[m.name].workload or Path(config.traces[m.name].trace or "").name,
        ttft_target_ms=d.sla.ttft_ms,
        itl_target_ms=d.sla.itl_ms,
        startup_delay_s=sim.startup_delay_s,
        truth_scale=sim.truth_scale,
        gpus_per_engine=m.gpus_per_engine,
        requests=m.cluster.requests,
        timeline=m.cluster.timeline,
        decisions=m.decisions,
        gpu_hours=m.cluster.gpu_seconds(at_s=end_s) / 3600.0,
        oracle_gpu_hours=oracle_gpu_hours,  # the fleet oracle's, within the budget
        oracle_timeline=[],
        end_s=end_s,
        wall_s=0.0,
        scale_to_zero=d.scaling.scale_to_zero.enabled,
    )


# --- outputs -----------------------------------------------------------------------------------


def fleet_summary(config: FleetReplayConfig, run: FleetRunResult) -> dict[str, Any]:
    deployments: dict[str, Any] = {}
    met = total = 0
    for name, result in run.results.items():
        s = summarize(result)
        entry = config.fleet.member(name)
        deployments[name] = {
            "trace": result.trace,
            "priority": entry.priority,
            "gpu_type": entry.gpu_type,
            "guaranteed_gpus": entry.guaranteed_gpus,
            "max_gpus": entry.max_gpus,
            "requests": s["requests"],
            "slo_attainment": s["slo_attainment"],
            "ttft_attainment": s["ttft_attainment"],
            "itl_attainment": s["itl_attainment"],
            "gpu_hours": s["gpu_hours"],
            "oracle_gpu_hours": result.oracle_gpu_hours,
            "grant_changes": run.grant_changes[name],
            "scaling_actions": s["scaling_actions"],
            "peak_wish_gpus": run.peak_wish_gpus[name],
            **(
                {"gpu_hours_by_variant": run.variant_gpu_hours[name], "cost": run.cost[name]}
                if name in run.cost
                else {}
            ),
            "simulated_s": s["simulated_s"],
        }
        if "scale_to_zero" in s:  # only a deployment that may scale to zero: its wake-ups
            deployments[name]["scale_to_zero"] = s["scale_to_zero"]
        met += round((s["slo_attainment"] or 0.0) * s["requests"])
        total += s["requests"]
    oracle_hours = sum(d["oracle_gpu_hours"] for d in deployments.values())
    return {
        "policy": run.policy,
        "config": str(config.path),
        "budget_gpus": dict(config.fleet.budget_gpus),
        "peak_billed_gpus": run.peak_billed_gpus,
        "margin": config.fleet.margin,
        "hold_s": config.fleet.hold_s,
        "slo_attainment": met / total if total else None,
        "gpu_hours": sum(d["gpu_hours"] for d in deployments.values()),
        # The fleet oracle's plan (scheduled GPU-hours, as the single replay's oracle_gpu_hours).
        "oracle_gpu_hours": oracle_hours,
        "gpu_hours_over_oracle": (
            sum(d["gpu_hours"] for d in deployments.values()) / oracle_hours if oracle_hours else None
        ),
        "oracle_cut_intervals": run.oracle.cut_intervals if run.oracle is not None else None,
        "grant_changes": sum(run.grant_changes.values()),
        "deployments": deployments,
        "wall_s": run.wall_s,
    }


def write_fleet_outputs(config: FleetReplayConfig, run: FleetRunResult, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    summary = fleet_summary(config, run)
    paths = {"summary": out / "summary.json", "grants": out / "grants.csv"}
    paths["summary"].write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
    with paths["grants"].open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(
            f, fieldnames=("at_s", "deployment", "role", "wish", "grant", "reason", "cut_by")
        )
        writer.writeheader()
        writer.writerows(run.grants_log)
    return paths


def run_fleet_command(args: Any) -> int:
    """`planner replay --config <fleet file> --out DIR [--fleet-policy fleet|equal|fcfs]`."""
    config = load_fleet_config(args.config)
    policy = getattr(args, "fleet_policy", None) or "fleet"
    names = ", ".join(d.name for d in config.deployments)
    print(f"fleet {config.path}: {names} under {config.fleet.budget_gpus} GPUs ({policy})", file=sys.stderr)
    run = run_fleet(config, policy, progress=True)
    paths = write_fleet_outputs(config, run, Path(args.out))
    summary = json.loads(paths["summary"].read_text())
    for name, d in summary["deployments"].items():
        print(
            f"{name}: priority {d['priority']}, SLO attainment {d['slo_attainment']:.1%}, "
            f"{d['gpu_hours']:.2f} GPU-hours, {d['grant_changes']} grant changes"
            + (
                f", {d['scale_to_zero']['wake_ups']} wake-ups, {d['scale_to_zero']['zero_s']:.0f} s at zero"
                if "scale_to_zero" in d
                else ""
            )
        )
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0
