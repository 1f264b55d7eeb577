"""fleet state: the fleet step's lease, its grants and the state its next step needs

Revision ID: 0003_fleet_state
Revises: 0002_planner_state
Create Date: 2026-12-01 20:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# JSONB on PostgreSQL, JSON elsewhere (matches app.store.models.JSONType).
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0003_fleet_state"
down_revision: str | None = "0002_planner_state"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fleet_state",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("lease_holder", sa.String(length=128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stepped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("record", JSON_TYPE, nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_fleet_state")),
    )


def downgrade() -> None:
    op.drop_table("fleet_state")
