"""Per-tick diagnostics records and the per-deployment worker lease."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, func, or_, select, update
from sqlalchemy.orm import Session

from app.core.errors import NotFoundError
from app.store.models import DeploymentState, Tick


def add_tick(session: Session, *, deployment: str, at: datetime, record: dict[str, Any]) -> Tick:
    tick = Tick(deployment=deployment, at=at, record=record)
    session.add(tick)
    session.flush()
    return tick


def list_ticks(
    session: Session,
    *,
    deployment: str | None,
    since: datetime | None,
    until: datetime | None,
    before: int | None,
    limit: int,
) -> list[Tick]:
    """The newest `limit` ticks of the range with an id below `before` (if given), oldest first:
    a dashboard asks for the latest ticks, and pages back from the oldest one it got."""
    query = select(Tick).order_by(Tick.id.desc()).limit(limit)
    if deployment is not None:
        query = query.where(Tick.deployment == deployment)
    if since is not None:
        query = query.where(Tick.at >= since)
    if until is not None:
        query = query.where(Tick.at < until)
    if before is not None:
        query = query.where(Tick.id < before)
    return list(reversed(session.scalars(query).all()))


def last_tick(session: Session, deployment: str) -> Tick | None:
    return session.scalars(
        select(Tick).where(Tick.deployment == deployment).order_by(Tick.id.desc()).limit(1)
    ).first()


def acquire_lease(session: Session, *, deployment: str, holder: str, now: datetime, ttl_s: float) -> bool:
    """Take or renew the right to run this deployment's worker loop; the caller commits.

    Several planner processes may share one database; only the lease holder ticks, so a
    deployment gets one diagnostics record per tick, not one per process. A lease valid until T
    is free from T on.
    """
    result = session.execute(
        update(DeploymentState)
        .where(
            DeploymentState.name == deployment,
            or_(
                DeploymentState.lease_holder.is_(None),
                DeploymentState.lease_holder == holder,
                DeploymentState.lease_expires_at <= now,
            ),
        )
        .values(lease_holder=holder, lease_expires_at=now + timedelta(seconds=ttl_s))
    )
    if result.rowcount == 1:  # type: ignore[attr-defined]
        return True
    if session.get(DeploymentState, deployment) is None:
        raise NotFoundError(f"deployment {deployment!r} has no state row", field="deployment")
    return False


def release_lease(session: Session, *, deployment: str, holder: str) -> None:
    session.execute(
        update(DeploymentState)
        .where(DeploymentState.name == deployment, DeploymentState.lease_holder == holder)
        .values(lease_holder=None, lease_expires_at=None)
    )


def lease_holder(session: Session, deployment: str) -> str | None:
    state = session.get(DeploymentState, deployment)
    return state.lease_holder if state else None


def lease_expires_at(session: Session, deployment: str) -> datetime | None:
    """Until when the current holder's lease runs (None: nobody holds it)."""
    state = session.get(DeploymentState, deployment)
    return state.lease_expires_at if state else None


def _in_range(
    query: Select[Any], deployment: str, since: datetime | None, until: datetime | None
) -> Select[Any]:
    query = query.where(Tick.deployment == deployment)
    if since is not None:
        query = query.where(Tick.at >= since)
    if until is not None:
        query = query.where(Tick.at < until)
    return query


def latest_ticks(
    session: Session,
    deployment: str,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    *,
    section: str | None = None,
) -> tuple[int, Iterator[tuple[datetime, Any]]]:
    """How many ticks the range holds, and the latest `limit` of them oldest first, streamed
    (the records are reduced one by one; 50 000 of them at once would not fit comfortably).
    `section`: only that top-level section of each record (read by the database, not here)."""
    total = session.scalar(_in_range(select(func.count()).select_from(Tick), deployment, since, until)) or 0
    latest = _in_range(select(Tick.id), deployment, since, until).order_by(Tick.at.desc(), Tick.id.desc())
    query = (
        select(Tick.at, Tick.record if section is None else Tick.record[section])
        .where(Tick.id.in_(latest.limit(limit).scalar_subquery()))
        .order_by(Tick.at, Tick.id)
        .execution_options(yield_per=1000)
    )
    return total, ((at, record) for at, record in session.execute(query))


def latest_sections(
    session: Session,
    deployment: str,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    sections: tuple[str, ...],
) -> Iterator[tuple[datetime, dict[str, Any]]]:
    """The latest `limit` ticks of the range oldest first, streamed, each as its time and
    {section: value} of the named top-level sections only (read by the database)."""
    latest = _in_range(select(Tick.id), deployment, since, until).order_by(Tick.at.desc(), Tick.id.desc())
    query = (
        select(Tick.at, *(Tick.record[name] for name in sections))
        .where(Tick.id.in_(latest.limit(limit).scalar_subquery()))
        .order_by(Tick.at, Tick.id)
        .execution_options(yield_per=1000)
    )
    return ((row[0], dict(zip(sections, row[1:], strict=True))) for row in session.execute(query))
