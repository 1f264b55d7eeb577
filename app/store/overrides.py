"""Operator overrides (pin, bounds, pause/resume) and the audit log of every operator action.

At most one override of each kind is active per deployment: a new pin replaces the previous pin,
new bounds replace the previous bounds. `resume` ends the active pause and is itself an event
(stored already ended). Expired overrides simply stop counting; nothing has to sweep them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.core.errors import ConflictError, NotFoundError
from app.core.types import ActiveOverrides, OverrideAction, Role
from app.store.decisions import lock_deployment
from app.store.models import AuditEntry, Override


@dataclass(frozen=True)
class Actor:
    """Who did it: the token's role and a fingerprint that identifies the token, not reveals it."""

    role: str
    name: str


def is_active(override: Override, now: datetime) -> bool:
    return override.ended_at is None and (override.expires_at is None or override.expires_at > now)


def _active_rows(session: Session, deployment: str, now: datetime) -> list[Override]:
    return list(
        session.scalars(
            select(Override)
            .where(
                Override.deployment == deployment,
                Override.ended_at.is_(None),
                or_(Override.expires_at.is_(None), Override.expires_at > now),
            )
            .order_by(Override.id)
        )
    )


def active_overrides(session: Session, deployment: str, now: datetime) -> ActiveOverrides:
    pin = bounds = pause = None
    for row in _active_rows(session, deployment, now):
        if row.action == OverrideAction.PIN:
            pin = row
        elif row.action == OverrideAction.BOUNDS:
            bounds = row
        elif row.action == OverrideAction.PAUSE:
            pause = row
    bound_fields: dict[Role, dict[str, int]] = {}
    if bounds is not None:
        for key, value in bounds.params.items():
            edge, _, role = key.partition("_")  # "min_prefill" -> ("min", "prefill")
            bound_fields.setdefault(role, {})[edge] = value  # type: ignore[index]
    return ActiveOverrides(
        pin_id=pin.id if pin else None,
        pin=dict(pin.params) if pin else None,  # type: ignore[arg-type]
        bounds_id=bounds.id if bounds else None,
        bounds=bound_fields,
        pause_id=pause.id if pause else None,
    )


def audit(
    session: Session, *, actor: Actor, action: str, deployment: str, now: datetime, details: dict[str, Any]
) -> None:
    session.add(
        AuditEntry(
            at=now,
            actor_role=actor.role,
            actor=actor.name,
            action=action,
            deployment=deployment,
            details=details,
        )
    )


def create_override(
    session: Session,
    *,
    deployment: str,
    action: OverrideAction,
    params: dict[str, int],
    reason: str,
    expires_at: datetime | None,
    actor: Actor,
    now: datetime,
) -> Override:
    """Store an override, ending the one it replaces, and audit it; the caller commits."""
    lock_deployment(session, deployment)  # two operators at once must not leave two pins active
    active = _active_rows(session, deployment, now)
    override = Override(
        deployment=deployment,
        action=str(action),
        params=params,
        reason=reason,
        created_at=now,
        created_by=actor.name,
        expires_at=expires_at,
    )
    session.add(override)
    session.flush()

    kind = OverrideAction.PAUSE if action == OverrideAction.RESUME else action
    replaced = [row for row in active if row.action == kind]
    if action == OverrideAction.RESUME:
        if not replaced:
            raise ConflictError(f"deployment {deployment!r} is not paused")
        override.ended_at = now
        override.ended_reason = "resume is an event, not a state"
    for row in replaced:
        row.ended_at = now
        row.ended_reason = (
            f"{'ended' if action == OverrideAction.RESUME else 'replaced'} by override #{override.id}"
        )

    audit(
        session,
        actor=actor,
        action=f"override.{action}",
        deployment=deployment,
        now=now,
        details={
            "override_id": override.id,
            "params": params,
            "reason": reason,
            "expires_at": expires_at.isoformat() if expires_at else None,
            "ended_overrides": [row.id for row in replaced],
        },
    )
    return override


def get_override_or_raise(session: Session, override_id: int) -> Override:
    override = session.get(Override, override_id)
    if override is None:
        raise NotFoundError(f"override {override_id} does not exist", field="id")
    return override


def end_override(session: Session, *, override_id: int, actor: Actor, now: datetime) -> Override:
    """DELETE /override/{id}: end it now. Ending an override that already ended changes nothing."""
    override = get_override_or_raise(session, override_id)
    if not is_active(override, now):
        return override
    override.ended_at = now
    override.ended_reason = f"deleted by {actor.name}"
    audit(
        session,
        actor=actor,
        action="override.delete",
        deployment=override.deployment,
        now=now,
        details={"override_id": override.id, "action": override.action},
    )
    return override


def list_overrides(
    session: Session, *, deployment: str | None, include_inactive: bool, now: datetime, limit: int = 500
) -> list[Override]:
    query = select(Override).order_by(Override.id.desc()).limit(limit)
    if deployment is not None:
        query = query.where(Override.deployment == deployment)
    if not include_inactive:
        query = query.where(
            Override.ended_at.is_(None), or_(Override.expires_at.is_(None), Override.expires_at > now)
        )
    return list(session.scalars(query))


def list_audit(session: Session, *, deployment: str | None, limit: int = 500) -> list[AuditEntry]:
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if deployment is not None:
        query = query.where(AuditEntry.deployment == deployment)
    return list(session.scalars(query))
