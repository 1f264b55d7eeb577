"""`planner replay --config <fleet file>`: several deployments, one trace each, under one GPU budget.

A fleet file is a replay file (deployments + `simulation:`) with a `fleet:` section (app/config/fleet.py
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

The fleet file is read by app/sim/fleet/config.py, each deployment's part of a fleet tick is
app/sim/fleet/members.py, and summary.json and grants.csv are written by app/sim/fleet/outputs.py.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from app.config import ConfigError
from app.core.fleet.step import FleetState
from app.core.fleet.variants import Variant
from app.embedding import EmbeddedPlanner
from app.sim.fleet.config import FleetReplayConfig, load_fleet_config, load_fleet_requests
from app.sim.fleet.members import (
    _first_come_first_served,
    _fleet_grants,
    _log_rows,
    _Member,
    _result,
    _tick,
    _variant_cluster,
    _variant_grant,
)
from app.sim.fleet.oracle import fleet_oracle
from app.sim.fleet.outputs import FleetRunResult, write_fleet_outputs
from app.sim.replay.run import load_models
from app.sim.world.cluster import ROLES, Cluster

FLEET_POLICIES = ("fleet", "equal", "fcfs", "oracle")


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
