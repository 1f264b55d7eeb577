"""The fleet step's row: its lease (one process runs the fleet step at a time) and its last
answer, which every worker reads at its tick and the API shows."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, update
from sqlalchemy.orm import Session

from app.store.models import FleetStateRow

FLEET = "fleet"


def ensure_fleet(session: Session, *, name: str = FLEET) -> None:
    if session.get(FleetStateRow, name) is None:
        session.add(FleetStateRow(name=name))
        session.flush()


def acquire_fleet_lease(
    session: Session, *, holder: str, now: datetime, ttl_s: float, name: str = FLEET
) -> bool:
    """Take or renew the right to run the fleet step (as `acquire_lease` for a deployment's
    worker: a lease valid until T is free from T on); the caller commits."""
    result = session.execute(
        update(FleetStateRow)
        .where(
            FleetStateRow.name == name,
            or_(
                FleetStateRow.lease_holder.is_(None),
                FleetStateRow.lease_holder == holder,
                FleetStateRow.lease_expires_at <= now,
            ),
        )
        .values(lease_holder=holder, lease_expires_at=now + timedelta(seconds=ttl_s))
    )
    return result.rowcount == 1  # type: ignore[attr-defined]


def release_fleet_lease(session: Session, *, holder: str, name: str = FLEET) -> None:
    session.execute(
        update(FleetStateRow)
        .where(FleetStateRow.name == name, FleetStateRow.lease_holder == holder)
        .values(lease_holder=None, lease_expires_at=None)
    )


def save_fleet(
    session: Session, *, holder: str, at: datetime, record: dict[str, Any], name: str = FLEET
) -> bool:
    """Store a fleet step's answer, only while `holder` still holds the lease (a process whose
    lease ran out while it stepped writes nothing). True when stored."""
    result = session.execute(
        update(FleetStateRow)
        .where(FleetStateRow.name == name, FleetStateRow.lease_holder == holder)
        .values(stepped_at=at, record=record)
    )
    return result.rowcount == 1  # type: ignore[attr-defined]


def load_fleet(session: Session, *, name: str = FLEET) -> FleetStateRow | None:
    return session.get(FleetStateRow, name)


def stored_grant(session: Session, deployment: str, *, name: str = FLEET) -> dict[str, Any] | None:
    """The grant the last fleet step gave `deployment` (DeploymentGrant.as_dict() form), with
    `at`, when that step ran; None before the first step."""
    row = session.get(FleetStateRow, name)
    if row is None or not row.record:
        return None
    grant = (row.record.get("decision") or {}).get("grants", {}).get(deployment)
    return None if grant is None else {**grant, "at": row.record.get("at")}
