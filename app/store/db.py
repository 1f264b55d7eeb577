"""Engines, sessions and migrations. Nothing here runs at import time."""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
MIGRATIONS_DIR = REPO_ROOT / "migrations"
# Any constant works; it only has to be the same in every planner process.
_MIGRATION_LOCK_KEY = 0x706C616E  # "plan"


def is_postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            # As many kept connections as threads can use them at once (the API's thread pool
            # has 40): with the default 5, concurrent requests opened and closed overflow
            # connections, each one setting its pragmas, a quarter of a GET /decisions page's
            # CPU time under 32 clients (bench/api.py). An open SQLite connection costs a file
            # handle and its page cache.
            pool_size=40,
            max_overflow=20,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            # WAL lets readers (the API) proceed while the worker writes.
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_size=10, max_overflow=30, pool_pre_ping=True)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@contextlib.contextmanager
def _sqlite_file_lock(url: str) -> Iterator[None]:
    database = make_url(url).database
    if not database or database == ":memory:":
        yield
        return
    lock_path = Path(database).with_name(Path(database).name + ".migrate.lock")
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations. Safe when several processes start at once: they take turns on a lock
    (a PostgreSQL advisory lock, or a file lock next to the SQLite file), and the later ones
    find the schema already at head."""
    cfg = alembic_config(url)
    engine = make_engine(url)
    try:
        if is_postgres(engine):
            with engine.begin() as conn:
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
        else:
            with _sqlite_file_lock(url), engine.begin() as conn:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
    finally:
        engine.dispose()
    log.info("database schema is at %s", revision)


def downgrade(url: str, revision: str) -> None:
    cfg = alembic_config(url)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
    finally:
        engine.dispose()


def ping(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
