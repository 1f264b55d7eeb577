"""One tick of a deployment: from a snapshot and `now` to a target with reasons.

Scaling algorithms (throughput, load) will fill `snapshot.proposal`; until they exist the only
targets come from operator pins. The chain is: proposal -> pause -> pin -> bounds.
"""

from __future__ import annotations

from datetime import datetime

from app.core.overrides import apply_bounds, apply_pause, apply_pin, effective_bounds
from app.core.types import DecisionSource, Stage, TickResult, TickSnapshot

NO_POLICY_REASON = "no automatic scaling policy in this build; targets come only from operator pins"


def on_tick(snapshot: TickSnapshot, now: datetime) -> TickResult:
    overrides = snapshot.overrides
    bounds = effective_bounds(snapshot.config_bounds, overrides)

    if snapshot.proposal is None:
        proposal = Stage("proposal", None, NO_POLICY_REASON)
    else:
        proposal = Stage("proposal", dict(snapshot.proposal), f"proposed by {snapshot.proposal_source}")
    paused = apply_pause(proposal.replicas, snapshot.proposal_source, overrides)
    pinned = apply_pin(paused.replicas, overrides)
    bounded = apply_bounds(pinned.replicas, bounds)
    stages = (proposal, paused, pinned, bounded)

    source = DecisionSource.OVERRIDE if overrides.pin is not None else snapshot.proposal_source
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
        "target": bounded.replicas,
    }
    return TickResult(
        target=bounded.replicas,
        source=source if bounded.replicas is not None else None,
        stages=stages,
        diagnostics=diagnostics,
    )
