"""One deployment in a fleet replay: its cluster and planner, and the steps of a fleet tick that
act on it (the fleet step's grants, its planner's tick, first come first served, its result).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.config import DeploymentConfig
from app.core.fleet.grants import asked_of, grant_record, present_of, wish_of, with_grant
from app.core.fleet.step import FleetDecision, FleetMember, FleetSettings, FleetState, fleet_step
from app.core.fleet.variants import Variant, variant_key
from app.core.traces import TraceRequest
from app.core.types import ActiveOverrides
from app.embedding import EmbeddedPlanner, TickInput, TrafficWindow
from app.sim.fleet.config import FleetReplayConfig
from app.sim.fleet.variant_cluster import VariantCluster
from app.sim.replay.results import DecisionEvent, ReplayResult
from app.sim.world.cluster import ROLES, Cluster
from app.sim.world.frontend import FrontendCounters


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
        cost_per_gpu_hour=d.cost_per_gpu_hour,
    )
