"""Operator overrides applied to a proposed target: pause, pin, then bounds.

Each stage returns the replicas it passes on and a reason, so that a decision can say exactly
why it holds the numbers it holds (the HPA's normalisation chain, in miniature).
"""

from __future__ import annotations

from app.core.types import ActiveOverrides, DecisionSource, Replicas, Role, RoleBounds, Stage


def effective_bounds(
    config_bounds: dict[Role, RoleBounds], overrides: ActiveOverrides
) -> dict[Role, RoleBounds]:
    """Configured bounds, with each field an operator set replacing the configured one."""
    result: dict[Role, RoleBounds] = {}
    for role, bounds in config_bounds.items():
        given = overrides.bounds.get(role, {})
        result[role] = RoleBounds(
            min_replicas=given.get("min", bounds.min_replicas),
            max_replicas=given.get("max", bounds.max_replicas),
        )
    return result


def bound_violations(replicas: Replicas, bounds: dict[Role, RoleBounds]) -> list[tuple[Role, str]]:
    """(role, message) for every role whose count lies outside its bounds."""
    problems: list[tuple[Role, str]] = []
    for role, count in replicas.items():
        b = bounds[role]
        if count < b.min_replicas:
            problems.append((role, f"{count} is below the minimum {b.min_replicas}"))
        elif count > b.max_replicas:
            problems.append((role, f"{count} is above the maximum {b.max_replicas}"))
    return problems


def apply_pause(
    replicas: Replicas | None, source: DecisionSource | None, overrides: ActiveOverrides
) -> Stage:
    if replicas is not None and overrides.paused and source != DecisionSource.OVERRIDE:
        return Stage("pause", None, f"automatic scaling paused by override #{overrides.pause_id}")
    return Stage("pause", replicas, "paused" if overrides.paused else "not paused")


def apply_pin(replicas: Replicas | None, overrides: ActiveOverrides) -> Stage:
    if overrides.pin is not None:
        return Stage("pin", dict(overrides.pin), f"pinned by override #{overrides.pin_id}")
    return Stage("pin", replicas, "no pin")


def apply_bounds(replicas: Replicas | None, bounds: dict[Role, RoleBounds]) -> Stage:
    if replicas is None:
        return Stage("bounds", None, "no target to bound")
    clamped: Replicas = {}
    notes: list[str] = []
    for role, count in replicas.items():
        b = bounds[role]
        value = min(max(count, b.min_replicas), b.max_replicas)
        if value != count:
            notes.append(f"{role} {count} -> {value} (min {b.min_replicas}, max {b.max_replicas})")
        clamped[role] = value
    return Stage("bounds", clamped, "; ".join(notes) if notes else "within bounds")
