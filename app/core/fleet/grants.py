"""How a deployment's planner lives with its fleet grant: the pure part both shells share.

`planner replay` (app/sim/fleet/run.py) and `planner serve` (app/workers/fleet.py and the worker
loop) run exactly this code around the fleet step (app/core/fleet/step.py), so the replay measures
what the service does:

- `wish_of`: the wish the fleet step reads is the planner's *proposal* (the first stage of its
  last tick, before bounds, overrides and the grant), within the deployment's own bounds;
- `present_of`: the part of that wish the load measured now needs (app/core/fleet/value.py), which
  alone may take a lower priority's running engines;
- `with_grant`: the grant binds as per-role maximum bounds in the tick's `ActiveOverrides`,
  as an operator's bounds override would, so the decision itself respects it;
- `grant_record`: what the tick record and the decision say about the grant: the grant per
  role, its reason, who cut it and why, and a reason line when the grant lowered the target.

A grant is the `DeploymentGrant.as_dict()` form (app/core/fleet/types.py): the form the service
stores, so both shells read the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core.fleet.value import present_need
from app.core.types import ActiveOverrides, Replicas, Role, RoleBounds

__all__ = ["asked_of", "grant_engines", "grant_record", "present_of", "with_grant", "wish_of"]


def asked_of(stages: list[Mapping[str, Any]]) -> Replicas | None:
    """What a tick asked for before the bounds (and so the grant) applied: its pin stage's
    replicas (the proposal, or an operator's pin)."""
    return next((s.get("replicas") for s in stages if s.get("stage") == "pin"), None)


def wish_of(proposal: Mapping[str, int] | None, bounds: Mapping[Role, RoleBounds]) -> dict[Role, int] | None:
    """The wish of a tick whose proposal stage held `proposal`: its replicas within the
    deployment's configured bounds (what it could run alone). None: the tick proposed nothing
    (keep the previous wish)."""
    if proposal is None:
        return None
    return {role: b.clamp(int(proposal.get(role, b.min_replicas))) for role, b in bounds.items()}


def present_of(
    sla: Mapping[str, Any] | None,
    wish: Mapping[Role, int],
    bounds: Mapping[Role, RoleBounds],
    *,
    itl_target_ms: float,
) -> dict[Role, int] | None:
    """The engines per role the load measured now needs (no forecast headroom), from the tick's
    `sla` record, within the bounds and never above the wish. None: the record has no sizing."""
    need = present_need(sla, itl_target_ms=itl_target_ms)
    if need is None:
        return None
    kept = {role: b for role, b in bounds.items() if role in wish}
    return {role: min(wish[role], b.clamp(need.get(role, wish[role]))) for role, b in kept.items()}


def grant_engines(grant: Mapping[str, Any] | None) -> dict[Role, int] | None:
    """Engines granted per role, from a stored grant (None: no grant yet)."""
    if not grant:
        return None
    return {role: int(n) for role, n in grant["engines"].items()}  # type: ignore[misc]


def with_grant(
    overrides: ActiveOverrides, grant: Mapping[str, Any] | None, bounds: Mapping[Role, RoleBounds]
) -> ActiveOverrides:
    """The tick's overrides with the grant as per-role maximum bounds. An operator's bounds stay
    in force where they are tighter; a minimum above the grant is lowered to it (the grant is a
    promise to the other deployments, the minimum only to this one)."""
    engines = grant_engines(grant)
    if engines is None:
        return overrides
    merged: dict[Role, dict[str, int]] = {}
    for role, b in bounds.items():
        given = overrides.bounds.get(role, {})
        cap = engines.get(role)
        if cap is None:
            if given:
                merged[role] = dict(given)
            continue
        top = min(given.get("max", b.max_replicas), cap)
        merged[role] = {"max": top, "min": min(given.get("min", b.min_replicas), top)}
    return ActiveOverrides(
        pin_id=overrides.pin_id,
        pin=overrides.pin,
        bounds_id=overrides.bounds_id,
        bounds=merged,
        pause_id=overrides.pause_id,
    )


def grant_record(
    grant: Mapping[str, Any] | None, *, asked: Replicas | None, target: Replicas | None, at: str | None = None
) -> dict[str, Any] | None:
    """The tick's `fleet` section: per role the wish the grant answered, the engines granted,
    the reason (`wish_met`, `cut_budget`, `cut_max_share`, `held`) and whether the grant lowered
    this tick's target (`binding`: what was asked before the bounds stage was above the grant
    and the target sits at it); `cut_by` (who holds the GPUs and why) and `note`, the decision's
    reason line, set when the grant bound. `asked` is the pin stage's replicas (the proposal,
    or an operator's pin), `target` the tick's target. None without a grant."""
    engines = grant_engines(grant)
    if grant is None or engines is None:
        return None
    roles: dict[str, Any] = {}
    cut_roles: list[str] = []
    for role, g in grant["roles"].items():
        granted = engines[role]
        wanted = None if asked is None else asked.get(role)
        binding = bool(
            wanted is not None and target is not None and wanted > granted and target.get(role) == granted
        )
        roles[role] = {
            "granted": granted,
            "wish": g["wish"],
            "reason": g["reason"],
            "detail": g["detail"],
            "binding": binding,
        }
        if binding:
            # The grant answers the wish of the last fleet step; a wish that rose since is seen
            # by the next step, so the note says which wish the grant was for.
            why = f"granted for a wish of {g['wish']}: {g['reason']}, {g['detail']}"
            cut_roles.append(f"{role} {wanted} -> {granted} ({why})")
    cut_by = list(grant.get("cut_by") or [])
    note = None
    if cut_roles:
        by = "; ".join(f"{c['by']}: {c['why']}" for c in cut_by)
        note = "cut by the fleet grant: " + ", ".join(cut_roles) + (f"; held by {by}" if by else "")
    return {
        "granted_at": at,
        "gpu_type": grant.get("gpu_type"),
        "priority": grant.get("priority"),
        "granted_gpus": grant.get("gpus"),
        "wish_gpus": grant.get("wish_gpus"),
        "roles": roles,
        "cut": any(r["granted"] < r["wish"] for r in roles.values()),
        "binding": bool(cut_roles),
        "cut_by": cut_by,
        "note": note,
    }
