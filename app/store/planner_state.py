"""The planners' learned state, one row per deployment, written in the same transaction as the
tick it belongs to (so the saved state is always the one of the last stored tick)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from app.store.models import PlannerStateRow


def save_state(session: Session, *, deployment: str, state: bytes, at: datetime) -> None:
    row = session.get(PlannerStateRow, deployment)
    if row is None:
        session.add(PlannerStateRow(deployment=deployment, saved_at=at, state=state))
    else:
        row.saved_at, row.state = at, state


def load_state(session: Session, *, deployment: str) -> PlannerStateRow | None:
    return session.get(PlannerStateRow, deployment)
