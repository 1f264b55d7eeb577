"""Engines, sessions and migrations. Nothing here runs at import time."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InvalidatePoolError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
MIGRATIONS_DIR = REPO_ROOT / "migrations"
# Any constant works; it only has to be the same in every planner process.
_MIGRATION_LOCK_KEY = 0x706C616E  # "plan"
# Another process migrating takes seconds; one holding the lock this long is stuck, and start-up
# says so instead of waiting for ever.
MIGRATION_LOCK_WAIT_S = 60.0
# PostgreSQL: a pooled connection unused for this long is pinged when it is checked out (a
# connection in steady use is not: the pool's pre-ping was a round trip on every checkout, half
# of a GET /decisions page's). One that fails its ping empties the pool (the server restarted,
# or dropped idle sessions); one that died while in use fails its statement, and the pool is
# emptied too, so that at most the requests in flight see the outage (run_read retries them).
PG_PING_IDLE_S = 5.0
# and none is kept longer than this, whatever the server or a proxy does to old sessions.
PG_POOL_RECYCLE_S = 1800

T = TypeVar("T")


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
    # Up to 40 connections per process as before, but 20 of them kept rather than 10: with 32
    # concurrent API requests, overflow connections were opened and closed all the time
    # (GET /decisions 263 -> 510 req/s, bench/api.py). More kept ones would hold more of the
    # server's max_connections when several planner processes share it.
    engine = create_engine(url, pool_size=20, max_overflow=20, pool_recycle=PG_POOL_RECYCLE_S)

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn, record):  # type: ignore[no-untyped-def]
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_conn, record, _proxy):  # type: ignore[no-untyped-def]
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < PG_PING_IDLE_S:
            return  # new, or in steady use
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            # The pool discards every connection it holds and checks out a new one.
            raise InvalidatePoolError(f"pooled connection failed its ping: {exc}") from exc

    return engine


def run_read(engine: Engine, read: Callable[[Connection], T]) -> T:
    """`read(conn)` on a pooled connection; on PostgreSQL in autocommit mode: each statement is
    its own transaction, so there is no BEGIN and no ROLLBACK around it (a read of one row is one
    round trip instead of three). For reads only, that need no snapshot across their statements.
    (SQLite's driver begins no transaction for a SELECT anyway, and switching its isolation level
    costs 40 us a read.) Run once more on a new connection if the pooled one turned out to be
    dead (the database restarted since it was last used)."""
    autocommit = is_postgres(engine)
    for attempt in (1, 2):
        try:
            with engine.connect() as conn:
                return read(conn.execution_options(isolation_level="AUTOCOMMIT") if autocommit else conn)
        except DBAPIError as exc:
            if attempt == 2 or not exc.connection_invalidated:
                raise
            log.info("a pooled connection was dead (%s); reading again on a new one", exc.orig)
    raise AssertionError("unreachable")


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
        _flock_bounded(fh.fileno(), f"the migration lock {lock_path}")
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _flock_bounded(fd: int, what: str) -> None:
    """An exclusive flock, waited for at most MIGRATION_LOCK_WAIT_S (then TimeoutError), with a
    warning when the wait starts. The wait is a blocking flock, so the kernel lists the waiter
    (/proc/locks); SIGALRM bounds it, which Python allows in the main thread only: elsewhere
    the wait is unbounded, as it always was."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    log.warning("another process holds %s; waiting up to %g s", what, MIGRATION_LOCK_WAIT_S)
    if threading.current_thread() is not threading.main_thread():
        fcntl.flock(fd, fcntl.LOCK_EX)
        return

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"another process has held {what} for more than {MIGRATION_LOCK_WAIT_S:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    outer_s, _ = signal.setitimer(signal.ITIMER_REAL, MIGRATION_LOCK_WAIT_S)
    started = time.monotonic()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_s > 0:  # an outer timer (a test runner's timeout) keeps what was left of it
            signal.setitimer(signal.ITIMER_REAL, max(outer_s - (time.monotonic() - started), 0.001))


def _pg_advisory_lock_bounded(conn: Connection) -> None:
    """The migration's advisory lock for this transaction, waited for at most
    MIGRATION_LOCK_WAIT_S (then TimeoutError), with a warning when the wait starts. The wait is
    PostgreSQL's own (pg_locks lists the waiter); the timeout applies to it alone."""
    key = {"k": _MIGRATION_LOCK_KEY}
    if conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), key).scalar():
        return
    what = "the migration lock (a PostgreSQL advisory lock)"
    log.warning("another process holds %s; waiting up to %g s", what, MIGRATION_LOCK_WAIT_S)
    conn.execute(text(f"SET LOCAL lock_timeout = '{int(MIGRATION_LOCK_WAIT_S * 1000)}ms'"))
    try:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), key)
    except OperationalError as exc:
        if "lock timeout" not in str(exc.orig):
            raise
        raise TimeoutError(
            f"another process has held {what} for more than {MIGRATION_LOCK_WAIT_S:g} s"
        ) from None
    # The migration's own statements wait as long as they need, as before.
    conn.execute(text("SET LOCAL lock_timeout = DEFAULT"))


def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations. Safe when several processes start at once: they take turns on a lock
    (a PostgreSQL advisory lock, or a file lock next to the SQLite file), and the later ones
    find the schema already at head."""
    cfg = alembic_config(url)
    engine = make_engine(url)
    try:
        if is_postgres(engine):
            with engine.begin() as conn:
                _pg_advisory_lock_bounded(conn)
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
