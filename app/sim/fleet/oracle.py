"""The fleet's clairvoyant oracle: every deployment's future known, the budget shared by the fleet
step's own rules (`--fleet-policy oracle`, and the yardstick of the other fleet policies).

1. Each deployment's r*, as the single-deployment oracle computes it (app/sim/replay/oracle.py
   `required_engines`: the fewest engines per role and interval that meet both targets at the
   load that actually arrives, in the simulated world).
2. Per interval, the fleet step (app/core/fleet/step.py) grants those r* as wishes, from no previous
   grant (no hysteresis: the oracle is not steering live engines, it is choosing a plan), so
   that where the r* together exceed a GPU type's budget they are cut by guarantees, priority
   and marginal value exactly as the fleet policy's wishes are. A budget that never binds leaves
   every r* as it is: then this is the single oracle per deployment.
3. Each deployment's cut r* becomes its cheapest schedule (`oracle_schedule`: engines ordered a
   start-up delay ahead, idle gaps bridged or restarted, whichever costs less).

The schedules order engines a start-up delay before they serve, so a deployment's next engines
are billed while another's are still serving: the GPUs billed may exceed the budget during a
hand-over, by at most what changes hands within one start-up delay (`peak_billed_gpus` of the
run says how much).

Pure functions of the requests and the truth model: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.config import DeploymentConfig, FleetConfig
from app.core.fleet.step import FleetMember, FleetSettings, FleetState, fleet_step
from app.core.traces import TraceRequest
from app.sim.replay.oracle import OracleSchedule, oracle_schedule, required_engines
from app.sim.world.cluster import ROLES
from app.sim.world.truth import TruthModel


@dataclass(frozen=True)
class FleetOracle:
    demand: dict[str, dict[str, list[int]]]  # per deployment and role: r* per interval
    fitted: dict[str, dict[str, list[int]]]  # the same, cut to the budget
    schedule: dict[str, dict[str, OracleSchedule]]
    gpu_hours: dict[str, float]  # per deployment, within the budget
    unbounded_gpu_hours: dict[str, float]  # per deployment, r* uncut (each alone)
    cut_intervals: int  # intervals where the budget cut some r*

    @property
    def total_gpu_hours(self) -> float:
        return sum(self.gpu_hours.values())


def fleet_oracle(
    deployments: Sequence[DeploymentConfig],
    fleet: FleetConfig,
    requests: Mapping[str, Sequence[TraceRequest]],
    truths: Mapping[str, TruthModel],
    *,
    interval_s: float,
    startup_delay_s: float,
    quantile: float = 0.99,
) -> FleetOracle:
    demand = {
        d.name: required_engines(
            requests[d.name],
            truths[d.name],
            interval_s=interval_s,
            ttft_target_ms=d.sla.ttft_ms,
            itl_target_ms=d.sla.itl_ms,
            quantile=quantile,
        )
        for d in deployments
    }
    length = {d.name: len(demand[d.name]["prefill"]) for d in deployments}
    gpus = {d.name: {role: d.role(role).gpus_per_engine for role in ROLES} for d in deployments}
    fitted: dict[str, dict[str, list[int]]] = {d.name: {role: [] for role in ROLES} for d in deployments}
    settings = FleetSettings(budget_gpus=fleet.budget_gpus, margin=fleet.margin, hold_s=0.0)
    cut = 0
    for k in range(max(length.values(), default=0)):
        members = []
        for d in deployments:
            entry = fleet.member(d.name)
            wish = {role: demand[d.name][role][k] if k < length[d.name] else 0 for role in ROLES}
            members.append(
                FleetMember(
                    name=d.name,
                    gpu_type=entry.gpu_type or "",
                    priority=entry.priority,
                    guaranteed_gpus=entry.guaranteed_gpus,
                    max_gpus=entry.max_gpus,
                    gpus_per_engine=gpus[d.name],  # type: ignore[arg-type]
                    wish=wish,  # type: ignore[arg-type]
                )
            )
        decision = fleet_step(members, settings, FleetState(), k * interval_s)
        cut += any(decision.grants[m.name].engines != dict(m.wish) for m in members)
        for d in deployments:
            if k < length[d.name]:
                for role in ROLES:
                    fitted[d.name][role].append(decision.grants[d.name].engines[role])  # type: ignore[index]

    def schedules(levels: Mapping[str, Mapping[str, list[int]]], name: str) -> dict[str, OracleSchedule]:
        return {
            role: oracle_schedule(
                levels[name][role],
                interval_s=interval_s,
                startup_delay_s=startup_delay_s,
                gpus_per_engine=gpus[name][role],
            )
            for role in ROLES
        }

    schedule = {d.name: schedules(fitted, d.name) for d in deployments}
    unbounded = {d.name: schedules(demand, d.name) for d in deployments}
    return FleetOracle(
        demand=demand,
        fitted=fitted,
        schedule=schedule,
        gpu_hours={n: _gpu_hours(by_role) for n, by_role in schedule.items()},
        unbounded_gpu_hours={n: _gpu_hours(by_role) for n, by_role in unbounded.items()},
        cut_intervals=cut,
    )


def _gpu_hours(schedules: Mapping[str, OracleSchedule]) -> float:
    return sum(s.gpu_hours for s in schedules.values())
