"""One tick of a deployment: from a snapshot and `now` to a target with reasons.

The chain: proposal (throughput scaling) -> pause -> pin -> bounds -> GPU budget. Pause and pin
replace the algorithm's proposal; bounds and the budget limit every target, pins included (a pin
outside them is refused when it is made).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from app.core.load import load_step
from app.core.overrides import apply_bounds, apply_pause, apply_pin, effective_bounds
from app.core.sla_scaling import sla_step
from app.core.throughput import ThroughputReason, apply_gpu_budget, throughput_step
from app.core.types import DecisionSource, Replicas, Stage, TickResult, TickSnapshot

NO_POLICY_REASON = "no automatic scaling enabled; targets come only from operator pins"


def _proposal(
    snapshot: TickSnapshot,
) -> tuple[Stage, DecisionSource | None, dict | None, dict | None, dict | None, Replicas | None]:
    """The algorithms' proposal, its source, the throughput, load and SLA diagnostics, and the
    throughput floor this tick set (reference §4.3 and §4.8). SLA scaling, when it is the
    algorithm, is the only one that runs.

    Throughput alone decides. With load scaling on, throughput only sets the floor (reason
    `set_lower_bound`) and the load step decides, on load ticks, at or above that floor."""
    throughput_diagnostics = load_diagnostics = sla_diagnostics = floor = None
    proposal, source = None, snapshot.proposal_source
    if snapshot.throughput is not None and snapshot.throughput_settings is not None:
        step = throughput_step(snapshot.throughput, snapshot.throughput_settings, snapshot.roles)
        reason = step.reason
        if snapshot.load_enabled and reason == ThroughputReason.SCALE:
            reason, floor = ThroughputReason.SET_LOWER_BOUND, step.replicas
        throughput_diagnostics = {"reason": str(reason), "detail": step.detail, **step.diagnostics}
        replicas = None if snapshot.load_enabled else step.replicas
        proposal, source = (
            Stage("proposal", replicas, f"throughput {reason}: {step.detail}"),
            DecisionSource.THROUGHPUT,
        )
    if snapshot.load is not None:
        load_input = snapshot.load.input
        if floor is not None:  # this tick's throughput result is the newest floor
            load_input = replace(load_input, throughput_floor=floor)
        result = load_step(snapshot.load.models, load_input, snapshot.load.settings)
        load_diagnostics = result.diagnostics
        proposal, source = (
            Stage("proposal", result.replicas, f"load {result.reason}: {result.detail}"),
            DecisionSource.LOAD,
        )
    if snapshot.sla is not None:
        sla = snapshot.sla
        outcome = sla_step(sla.model, sla.state, sla.input, sla.settings)
        sla_diagnostics = {"reason": str(outcome.reason), "detail": outcome.detail, **outcome.diagnostics}
        proposal, source = (
            Stage("proposal", outcome.replicas, f"sla {outcome.reason}: {outcome.detail}"),
            DecisionSource.SLA,
        )
    if proposal is None:
        if snapshot.proposal is not None:
            proposal = Stage("proposal", dict(snapshot.proposal), f"proposed by {snapshot.proposal_source}")
        else:
            proposal = Stage("proposal", None, NO_POLICY_REASON)
    return proposal, source, throughput_diagnostics, load_diagnostics, sla_diagnostics, floor


def on_tick(snapshot: TickSnapshot, now: datetime) -> TickResult:
    overrides = snapshot.overrides
    bounds = effective_bounds(snapshot.config_bounds, overrides)
    proposal, proposal_source, throughput_diagnostics, load_diagnostics, sla_diagnostics, floor = _proposal(
        snapshot
    )
    paused = apply_pause(proposal.replicas, proposal_source, overrides)
    pinned = apply_pin(paused.replicas, overrides)
    bounded = apply_bounds(pinned.replicas, bounds)
    budgeted = apply_gpu_budget(
        bounded.replicas,
        budget_gpus=snapshot.budget_gpus,
        gpus_per_engine=snapshot.gpus_per_engine,
        bounds=bounds,
    )
    stages = (proposal, paused, pinned, bounded, budgeted)

    source = DecisionSource.OVERRIDE if overrides.pin is not None else proposal_source
    latest = snapshot.latest_decision
    diagnostics = {
        "at": now.isoformat(),
        "deployment": snapshot.deployment,
        "latest_decision_id": latest.id if latest else None,
        "latest_decision_status": str(latest.status) if latest else None,
        "overrides": {
            "pin_id": overrides.pin_id,
            "bounds_id": overrides.bounds_id,
            "pause_id": overrides.pause_id,
        },
        "bounds": {r: {"min": b.min_replicas, "max": b.max_replicas} for r, b in bounds.items()},
        "stages": [s.as_dict() for s in stages],
        "target": budgeted.replicas,
        "throughput": throughput_diagnostics,
        "load": load_diagnostics,
        "sla": sla_diagnostics,
    }
    return TickResult(
        throughput_floor=floor,
        target=budgeted.replicas,
        source=source if budgeted.replicas is not None else None,
        stages=stages,
        diagnostics=diagnostics,
    )
