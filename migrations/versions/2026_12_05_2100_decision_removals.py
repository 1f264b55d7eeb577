"""decision removals: per role, the engines a scale-down would rather remove, first choice first

Revision ID: 0005_decision_removals
Revises: 0004_deployment_settings
Create Date: 2026-12-05 21:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# JSONB on PostgreSQL, JSON elsewhere (matches app.store.models.JSONType).
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0005_decision_removals"
down_revision: str | None = "0004_deployment_settings"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("decisions", sa.Column("remove", JSON_TYPE, nullable=True))


def downgrade() -> None:
    op.drop_column("decisions", "remove")
