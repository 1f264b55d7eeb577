"""Shadow mode's part of a tick (docs/shadow.md): the section that records, per role, what the
incumbent autoscaler ran beside what the planner would have ordered, with the predicted
attainment of each (app/core/shadow.py)."""

from __future__ import annotations

from app.core.diagnostics import ShadowDiagnostics, TickDiagnostics
from app.core.planner import Effects, Planner
from app.core.shadow import conditions, shadow_section
from app.core.types import Replicas
from app.workers.gather import Gathered


def tick_shadow(
    planner: Planner, effects: Effects, gathered: Gathered, ordered_before: Replicas | None, now_s: float
) -> ShadowDiagnostics:
    """The section of a tick whose core answer is `effects`. The planner's count is its target,
    else (no target this tick) what it last ordered, `ordered_before`."""
    record: TickDiagnostics = effects.diagnostics
    sla = record.sla
    settings = planner.settings.sla
    wish = None
    if sla is not None and sla.roles:
        wish = {role: section.wish for role, section in sla.roles.items()}
    return shadow_section(
        planner.settings.roles,
        incumbent=gathered.incumbent,
        incumbent_ready=gathered.ready,
        planner=effects.target if effects.target is not None else ordered_before,
        wish=wish,
        conditions=(conditions(effects.state.sla, settings, now_s, sla) if settings is not None else None),
    )
