"""The normalisation chain every proposal goes through: pause -> pin -> bounds -> GPU budget.

Pause and pin replace the algorithm's proposal; bounds and the budget limit every target, pins
included (a pin outside them is refused when it is made). Each stage returns the replicas it passes
on and a reason, so that a decision can say exactly why it holds the numbers it holds (the HPA's
normalisation chain, in miniature). `RoleBounds.clamp` is the one bounds function.
"""

from __future__ import annotations

import math

from app.core.types import ActiveOverrides, DecisionSource, Replicas, Role, RoleBounds, Stage


def normalise(
    proposal: Stage,
    source: DecisionSource | None,
    *,
    overrides: ActiveOverrides,
    bounds: dict[Role, RoleBounds],
    budget_gpus: int | None,
    gpus_per_engine: dict[Role, int],
) -> tuple[tuple[Stage, ...], DecisionSource | None]:
    """The proposal and every stage after it (the last stage's replicas are the target), and the
    target's source: an operator pin's, else the proposal's; None without a target."""
    paused = apply_pause(proposal.replicas, source, overrides)
    pinned = apply_pin(paused.replicas, overrides)
    bounded = apply_bounds(pinned.replicas, bounds)
    budgeted = apply_gpu_budget(
        bounded.replicas, budget_gpus=budget_gpus, gpus_per_engine=gpus_per_engine, bounds=bounds
    )
    if budgeted.replicas is None:
        source = None
    elif overrides.pin is not None:
        source = DecisionSource.OVERRIDE
    return (proposal, paused, pinned, bounded, budgeted), source


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
        value = b.clamp(count)
        if value != count:
            notes.append(f"{role} {count} -> {value} (min {b.min_replicas}, max {b.max_replicas})")
        clamped[role] = value
    return Stage("bounds", clamped, "; ".join(notes) if notes else "within bounds")


def apply_gpu_budget(
    replicas: Replicas | None,
    *,
    budget_gpus: int | None,
    gpus_per_engine: dict[Role, int],
    bounds: dict[Role, RoleBounds],
) -> Stage:
    """Fit a target into the deployment's GPU budget (reference §1.4) without ever raising a
    role above what was asked for. Infeasible (the minimums alone exceed it) -> all zero."""
    if replicas is None:
        return Stage("budget", None, "no target")
    if budget_gpus is None:
        return Stage("budget", dict(replicas), "no GPU budget")
    gpus = {role: gpus_per_engine.get(role, 1) for role in replicas}
    total = sum(count * gpus[role] for role, count in replicas.items())
    if total <= budget_gpus:
        return Stage("budget", dict(replicas), f"{total} GPUs within the budget of {budget_gpus}")
    mins = {role: bounds[role].min_replicas if role in bounds else 1 for role in replicas}
    min_total = sum(mins[role] * gpus[role] for role in replicas)
    if budget_gpus < min_total:
        zero = {role: 0 for role in replicas}
        return Stage(
            "budget",
            zero,
            f"budget {budget_gpus} GPUs is below the minimum replicas' {min_total} GPUs: scaled to zero",
        )

    result: Replicas = {}
    if set(replicas) == {"prefill", "decode"}:
        p, d = replicas["prefill"], replicas["decode"]
        p_gpu, d_gpu = gpus["prefill"], gpus["decode"]
        scale = budget_gpus / total
        max_p = (budget_gpus - mins["decode"] * d_gpu) // p_gpu
        result["prefill"] = max(mins["prefill"], min(max_p, math.floor(p * scale)))
        # The reference hands all leftover GPUs to decode; a ceiling must not add replicas nobody asked for.
        result["decode"] = min(d, max(mins["decode"], (budget_gpus - result["prefill"] * p_gpu) // d_gpu))
    else:
        for role, count in replicas.items():
            result[role] = min(count, max(mins[role], budget_gpus // gpus[role]))
    used = sum(result[role] * gpus[role] for role in result)
    changes = ", ".join(
        f"{role} {replicas[role]} -> {result[role]}" for role in result if result[role] != replicas[role]
    )
    return Stage("budget", result, f"{total} GPUs over the budget of {budget_gpus}: {changes} ({used} GPUs)")
