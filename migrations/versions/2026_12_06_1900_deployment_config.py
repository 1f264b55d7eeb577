"""deployment config: each deployment's entry of the deployments file, as the service last read it

Revision ID: 0006_deployment_config
Revises: 0005_decision_removals
Create Date: 2026-12-06 19:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# JSONB on PostgreSQL, JSON elsewhere (matches app.store.models.JSONType).
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0006_deployment_config"
down_revision: str | None = "0005_decision_removals"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("deployment_state", sa.Column("config", JSON_TYPE, nullable=True))
    op.add_column("deployment_state", sa.Column("config_saved_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployment_state") as batch:
        batch.drop_column("config_saved_at")
        batch.drop_column("config")
