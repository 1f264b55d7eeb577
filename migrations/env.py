"""Alembic environment: runs on a connection handed over by `app.store.db.upgrade`, or on
PLANNER_DATABASE_URL / sqlalchemy.url when called from the alembic command line."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from app.store.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    from app.config import Settings

    return (
        config.get_main_option("sqlalchemy.url")
        or Settings(database_url=os.environ.get("PLANNER_DATABASE_URL", Settings().database_url)).database_url
    )


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url())
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
