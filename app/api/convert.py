"""ORM rows to response bodies."""

from __future__ import annotations

from datetime import datetime

from app.api.schemas import AuditOut, DecisionOut, OverrideOut, TickOut
from app.store.models import AuditEntry, Decision, Override, Tick
from app.store.overrides import is_active


def decision_out(d: Decision) -> DecisionOut:
    return DecisionOut(
        id=d.decision_id,
        deployment=d.deployment,
        num_prefill=d.num_prefill,
        num_decode=d.num_decode,
        num_workers=d.num_workers,
        source=d.source,  # type: ignore[arg-type]
        reasons=list(d.reasons),
        created_at=d.created_at,
        status=d.status,  # type: ignore[arg-type]
        status_reason=d.status_reason,
        completed_at=d.completed_at,
        observed=d.observed,
        message=d.message,
        tick_id=d.tick_id,
        override_id=d.override_id,
    )


def encode_decision(d: Decision) -> bytes:
    """The JSON body of a decision, as GET /decisions/{id} sends it."""
    return decision_out(d).model_dump_json().encode()


def override_out(o: Override, now: datetime) -> OverrideOut:
    return OverrideOut(
        id=o.id,
        deployment=o.deployment,
        action=o.action,  # type: ignore[arg-type]
        params=dict(o.params),
        reason=o.reason,
        created_at=o.created_at,
        created_by=o.created_by,
        expires_at=o.expires_at,
        ended_at=o.ended_at,
        ended_reason=o.ended_reason,
        active=is_active(o, now),
    )


def tick_out(t: Tick) -> TickOut:
    return TickOut.model_validate(t, from_attributes=True)


def audit_out(a: AuditEntry) -> AuditOut:
    return AuditOut.model_validate(a, from_attributes=True)
