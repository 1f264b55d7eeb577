"""initial schema

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-29 18:18:30.329371+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# JSONB on PostgreSQL, JSON elsewhere (matches app.store.models.JSONType).
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor_role", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("deployment", sa.String(length=63), nullable=False),
        sa.Column("details", JSON_TYPE, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_log_deployment"), ["deployment"], unique=False)

    op.create_table(
        "deployment_state",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("last_decision_id", sa.Integer(), nullable=False),
        sa.Column("write_seq", sa.Integer(), nullable=False),
        sa.Column("lease_holder", sa.String(length=128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_deployment_state")),
    )
    op.create_table(
        "overrides",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("deployment", sa.String(length=63), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("params", JSON_TYPE, nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_overrides")),
    )
    with op.batch_alter_table("overrides", schema=None) as batch_op:
        batch_op.create_index("ix_overrides_deployment_ended_at", ["deployment", "ended_at"], unique=False)

    op.create_table(
        "ticks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("deployment", sa.String(length=63), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("record", JSON_TYPE, nullable=False),
        sa.Column("decision_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ticks")),
    )
    with op.batch_alter_table("ticks", schema=None) as batch_op:
        batch_op.create_index("ix_ticks_deployment_at", ["deployment", "at"], unique=False)

    op.create_table(
        "decisions",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("deployment", sa.String(length=63), nullable=False),
        sa.Column("decision_id", sa.Integer(), nullable=False),
        sa.Column("num_prefill", sa.Integer(), nullable=True),
        sa.Column("num_decode", sa.Integer(), nullable=True),
        sa.Column("num_workers", sa.Integer(), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("reasons", JSON_TYPE, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("observed", JSON_TYPE, nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("tick_id", sa.Integer(), nullable=True),
        sa.Column("override_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_decisions_tick_id_ticks")),
        sa.PrimaryKeyConstraint("pk", name=op.f("pk_decisions")),
        sa.UniqueConstraint("deployment", "decision_id", name=op.f("uq_decisions_deployment_decision_id")),
    )
    op.create_table(
        "decision_acks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("decision_pk", sa.Integer(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("observed", JSON_TYPE, nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("actor_role", sa.String(length=16), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["decision_pk"], ["decisions.pk"], name=op.f("fk_decision_acks_decision_pk_decisions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decision_acks")),
    )
    with op.batch_alter_table("decision_acks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_decision_acks_decision_pk"), ["decision_pk"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("decision_acks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_decision_acks_decision_pk"))

    op.drop_table("decision_acks")
    op.drop_table("decisions")
    with op.batch_alter_table("ticks", schema=None) as batch_op:
        batch_op.drop_index("ix_ticks_deployment_at")

    op.drop_table("ticks")
    with op.batch_alter_table("overrides", schema=None) as batch_op:
        batch_op.drop_index("ix_overrides_deployment_ended_at")

    op.drop_table("overrides")
    op.drop_table("deployment_state")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_log_deployment"))

    op.drop_table("audit_log")
