"""One tick of a deployment: from a snapshot and `now` to a target with reasons.

The chain: proposal (throughput scaling) -> pause -> pin -> bounds -> GPU budget. Pause and pin
replace the algorithm's proposal; bounds and the budget limit every target, pins included (a pin
outside them is refused when it is made).
"""

from __future__ import annotations

from datetime import datetime

from app.core.overrides import apply_bounds, apply_pause, apply_pin, effective_bounds
from app.core.throughput import apply_gpu_budget, throughput_step
from app.core.types import DecisionSource, Stage, TickResult, TickSnapshot

NO_POLICY_REASON = "no automatic scaling enabled; targets come only from operator pins"


def on_tick(snapshot: TickSnapshot, now: datetime) -> TickResult:
    overrides = snapshot.overrides
    bounds = effective_bounds(snapshot.config_bounds, overrides)

    throughput_diagnostics = None
    proposal_source = snapshot.proposal_source
    if snapshot.throughput is not None and snapshot.throughput_settings is not None:
        step = throughput_step(snapshot.throughput, snapshot.throughput_settings, snapshot.roles)
        proposal = Stage("proposal", step.replicas, f"throughput {step.reason}: {step.detail}")
        proposal_source = DecisionSource.THROUGHPUT
        throughput_diagnostics = {"reason": str(step.reason), "detail": step.detail, **step.diagnostics}
    elif snapshot.proposal is not None:
        proposal = Stage("proposal", dict(snapshot.proposal), f"proposed by {snapshot.proposal_source}")
    else:
        proposal = Stage("proposal", None, NO_POLICY_REASON)
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
    }
    return TickResult(
        target=budgeted.replicas,
        source=source if budgeted.replicas is not None else None,
        stages=stages,
        diagnostics=diagnostics,
    )
