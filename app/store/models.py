"""SQLAlchemy models. Migrations in `migrations/` must match these (a contract test checks)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every backend (SQLite hands back naive ones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; pass an aware UTC datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONType = JSON().with_variant(JSONB(), "postgresql")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class DeploymentState(Base):
    """One row per deployment: the decision id sequence, a row to lock on, the worker lease."""

    __tablename__ = "deployment_state"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    last_decision_id: Mapped[int] = mapped_column(Integer, default=0)
    # Bumped as the first statement of every decision write: it takes the row lock on
    # PostgreSQL and the write lock on SQLite, so read-judge-insert is serialised per deployment.
    write_seq: Mapped[int] = mapped_column(Integer, default=0)
    lease_holder: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The deployment's entry of the deployments file as the last planner to start read it (paths
    # absolute), so that `planner replay --from-store` replays the settings that ran.
    config: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    config_saved_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class PlannerStateRow(Base):
    """What a deployment's planner has learned (app/core/planner.py `export_state`), saved with
    every tick it belongs to, so a restarted or a new leader resumes learning."""

    __tablename__ = "planner_state"

    deployment: Mapped[str] = mapped_column(String(63), primary_key=True)
    saved_at: Mapped[datetime] = mapped_column(UTCDateTime())
    state: Mapped[bytes] = mapped_column(LargeBinary)


class FleetStateRow(Base):
    """The fleet step's lease and its last answer (app/workers/fleet.py): one row per fleet
    (`name` is "fleet"). `record` holds the fleet state the next step needs (grants and when each
    changed, the last wishes), the grants every worker applies at its next tick, and the last
    moves, so a restart or another process resumes the grants instead of starting over."""

    __tablename__ = "fleet_state"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    lease_holder: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    stepped_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    record: Mapped[dict[str, Any] | None] = mapped_column(JSONType)


class DeploymentSettingsRow(Base):
    """A deployment's live settings changed over the API (`app/store/settings.py`): the stored
    overrides of the deployments file's values, nested as in the file, and their revision (the
    ETag a change must name). No row: revision 0, the file's values."""

    __tablename__ = "deployment_settings"

    deployment: Mapped[str] = mapped_column(String(63), primary_key=True)
    revision: Mapped[int] = mapped_column(Integer)
    overrides: Mapped[dict[str, Any]] = mapped_column(JSONType)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_by: Mapped[str] = mapped_column(String(64))


class Tick(Base):
    __tablename__ = "ticks"
    __table_args__ = (Index("ix_ticks_deployment_at", "deployment", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment: Mapped[str] = mapped_column(String(63))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    record: Mapped[dict[str, Any]] = mapped_column(JSONType)
    decision_id: Mapped[int | None] = mapped_column(Integer)


class Decision(Base):
    __tablename__ = "decisions"
    __table_args__ = (UniqueConstraint("deployment", "decision_id"),)

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment: Mapped[str] = mapped_column(String(63))
    decision_id: Mapped[int] = mapped_column(Integer)
    num_prefill: Mapped[int | None] = mapped_column(Integer)
    num_decode: Mapped[int | None] = mapped_column(Integer)
    num_workers: Mapped[int | None] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(16))
    reasons: Mapped[list[str]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    status: Mapped[str] = mapped_column(String(16))
    status_reason: Mapped[str | None] = mapped_column(Text)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    observed: Mapped[dict[str, int] | None] = mapped_column(JSONType)
    message: Mapped[str | None] = mapped_column(Text)
    # Per role the decision lowers: the ready engines to remove, first choice first (a hint).
    remove: Mapped[dict[str, list[str]] | None] = mapped_column(JSONType)
    tick_id: Mapped[int | None] = mapped_column(ForeignKey("ticks.id"))
    override_id: Mapped[int | None] = mapped_column(Integer)


class DecisionAck(Base):
    """Every acknowledgement an orchestrator sent, applied or not."""

    __tablename__ = "decision_acks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    decision_pk: Mapped[int] = mapped_column(ForeignKey("decisions.pk"), index=True)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime())
    status: Mapped[str] = mapped_column(String(16))
    observed: Mapped[dict[str, int] | None] = mapped_column(JSONType)
    message: Mapped[str | None] = mapped_column(Text)
    actor_role: Mapped[str] = mapped_column(String(16))
    outcome: Mapped[str] = mapped_column(String(16))  # applied | repeated | conflict


class Override(Base):
    __tablename__ = "overrides"
    __table_args__ = (Index("ix_overrides_deployment_ended_at", "deployment", "ended_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment: Mapped[str] = mapped_column(String(63))
    action: Mapped[str] = mapped_column(String(16))
    params: Mapped[dict[str, int]] = mapped_column(JSONType)
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_by: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    ended_reason: Mapped[str | None] = mapped_column(Text)


class AuditEntry(Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    actor_role: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(32))
    deployment: Mapped[str] = mapped_column(String(63), index=True)
    details: Mapped[dict[str, Any]] = mapped_column(JSONType)
