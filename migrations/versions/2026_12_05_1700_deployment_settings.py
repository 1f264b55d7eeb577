"""deployment settings: the live settings an operator changed over the API, with their revision

Revision ID: 0004_deployment_settings
Revises: 0003_fleet_state
Create Date: 2026-12-05 17:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# JSONB on PostgreSQL, JSON elsewhere (matches app.store.models.JSONType).
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0004_deployment_settings"
down_revision: str | None = "0003_fleet_state"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "deployment_settings",
        sa.Column("deployment", sa.String(length=63), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("overrides", JSON_TYPE, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("deployment", name=op.f("pk_deployment_settings")),
    )


def downgrade() -> None:
    op.drop_table("deployment_settings")
