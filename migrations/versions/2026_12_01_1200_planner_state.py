"""planner state: what each deployment's planner has learned, saved with its ticks

Revision ID: 0002_planner_state
Revises: 0001_initial
Create Date: 2026-12-01 12:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_planner_state"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "planner_state",
        sa.Column("deployment", sa.String(length=63), nullable=False),
        sa.Column("saved_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("deployment", name=op.f("pk_planner_state")),
    )


def downgrade() -> None:
    op.drop_table("planner_state")
