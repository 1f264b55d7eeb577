"""The database checks `planner serve` and `planner db upgrade` run before they migrate or serve,
and the one-line account of a database failure.

A planner that cannot use its database must say so in one line that names the file or the URL
(password masked) and why, quickly: not a traceback after SQLite's 30 s busy timeout, not a TCP
connect that hangs for minutes. So, before anything else opens the database:

- SQLite: the folder exists and is writable (SQLite creates `-wal`, `-shm` and the migration lock
  file next to the database); an existing file is a file, starts with SQLite's header and is not
  shorter than its header says (a truncated copy); the schema reads; and the write lock the
  service takes at every connection (`PRAGMA journal_mode=WAL`, then a write transaction) is
  granted within `LOCK_WAIT_S`, else another process holds the database;
- PostgreSQL: the server answers within `CONNECT_TIMEOUT_S`;
- without migrations at start-up (`PLANNER_APPLY_MIGRATIONS=false`), the schema is at the
  migrations' head.

`describe_database_error` turns what can still fail later (during the migration, in the
service's start-up) into the same kind of line.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

# The migration's own lock (a file next to the database), taken by the probe as by `upgrade`.
from app.store.db import _sqlite_file_lock, alembic_config

SETTING = "PLANNER_DATABASE_URL"
# A write lock held longer than this at start-up is another process's, not a busy moment.
LOCK_WAIT_S = 5.0
CONNECT_TIMEOUT_S = 10.0
# The busy timeout of the service's own connections (app/store/db.py `make_engine`).
SERVICE_BUSY_TIMEOUT_S = 30.0
SQLITE_HEADER = b"SQLite format 3\x00"
HEADER_BYTES = 100


class DatabaseStartupError(Exception):
    """The database cannot be used; the message is one line naming the URL or the file."""


def redacted(url: str) -> str:
    """The URL with its password masked."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL is reported by the settings; show nothing secret
        return "<the URL does not parse>"


def sqlite_path(url: str) -> Path | None:
    """The SQLite file of the URL; None for PostgreSQL and for an in-memory database."""
    parsed = make_url(url)
    if not parsed.drivername.startswith("sqlite"):
        return None
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def _one_line(text_: str) -> str:
    return " ".join(part.strip() for part in str(text_).splitlines() if part.strip())


def _fail(url: str, why: str) -> DatabaseStartupError:
    """The one line: the SQLite file (absolute, as SQLite resolves it from the working directory)
    or the URL with its password masked, then why."""
    path = sqlite_path(url)
    where = str(path.absolute()) if path is not None else redacted(url)
    return DatabaseStartupError(f"{SETTING}: {where}: {why}")


# --- before start-up ------------------------------------------------------------------------------


def check_database(url: str, *, migrate: bool, lock_wait_s: float = LOCK_WAIT_S) -> None:
    """Raise DatabaseStartupError when the database cannot serve the planner (see the module)."""
    path = sqlite_path(url)
    if path is not None:
        _check_sqlite(url, path, migrate=migrate, lock_wait_s=lock_wait_s)
    elif url.startswith("postgresql"):
        _check_postgres(url, migrate=migrate)


def _head_revision(url: str) -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def _check_schema(url: str, revision: str | None) -> None:
    head = _head_revision(url)
    if revision != head:
        now = f"at revision {revision}" if revision else "not migrated"
        raise _fail(url, f"the schema is {now}, not {head}; run `planner db upgrade`")


def _check_sqlite(url: str, path: Path, *, migrate: bool, lock_wait_s: float) -> None:
    folder = path.parent
    if not folder.exists():
        raise _fail(url, f"its folder {folder} does not exist (create it, or set {SETTING} elsewhere)")
    if not folder.is_dir():
        raise _fail(url, f"{folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        # SQLite writes its -wal and -shm files (and we the migration lock) next to the database.
        raise _fail(url, f"its folder {folder} is not writable (SQLite keeps its journal files there)")
    if path.exists():
        _check_sqlite_file(url, path)
    elif not migrate:
        raise _fail(url, "no database file; run `planner db upgrade` (or PLANNER_APPLY_MIGRATIONS=true)")
    # Under the migration lock: a planner starting at the same moment and migrating holds the
    # write lock for as long as its migration takes, which is no reason to fail here.
    with _sqlite_file_lock(url):
        _probe_sqlite(url, path, migrate=migrate, lock_wait_s=lock_wait_s)


def _probe_sqlite(url: str, path: Path, *, migrate: bool, lock_wait_s: float) -> None:
    try:
        conn = sqlite3.connect(path, timeout=lock_wait_s, isolation_level=None)
    except sqlite3.Error as exc:
        raise _fail(url, f"cannot open: {_one_line(str(exc))}") from None
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        # What the service does at every connection, and then a write: both need the lock.
        conn.execute("PRAGMA journal_mode=WAL").fetchone()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        if not migrate:
            has_table = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
            ).fetchone()
            revision = (
                conn.execute("SELECT version_num FROM alembic_version").fetchone() if has_table else None
            )
            _check_schema(url, revision[0] if revision else None)
    except sqlite3.Error as exc:
        raise _fail(url, _sqlite_reason(exc, lock_wait_s)) from None
    finally:
        conn.close()


def _check_sqlite_file(url: str, path: Path) -> None:
    if path.is_dir():
        raise _fail(url, "a folder, not an SQLite database file")
    try:
        size = path.stat().st_size
        with path.open("rb") as stream:
            header = stream.read(HEADER_BYTES)
    except OSError as exc:
        raise _fail(url, f"cannot read it ({exc.strerror})") from None
    if size == 0:
        return  # SQLite's own empty database: the migrations create the schema
    looks_like_sqlite = (
        SQLITE_HEADER.startswith(header)
        if len(header) < len(SQLITE_HEADER)
        else header.startswith(SQLITE_HEADER)
    )
    if not looks_like_sqlite:
        raise _fail(url, "not an SQLite database (a corrupt file, or another file at that path)")
    if len(header) < HEADER_BYTES:
        raise _fail(url, f"truncated ({size} bytes, shorter than SQLite's header); restore it from a backup")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The header's page count is valid only when its change counter matches (SQLite's file format,
    # "in-header database size"); with a write-ahead log present the file may legitimately lag it.
    counted = header[24:28] == header[92:96] and pages > 0
    wal = path.with_name(path.name + "-wal")
    wal_in_use = wal.exists() and wal.stat().st_size > 0
    if counted and not wal_in_use and size < pages * page_size:
        raise _fail(
            url,
            f"truncated ({size} bytes; its header says {pages} pages of {page_size} bytes); "
            "restore it from a backup",
        )


def _sqlite_reason(exc: sqlite3.Error, waited_s: float) -> str:
    message = _one_line(str(exc))
    if "locked" in message or "busy" in message:
        return (
            f"locked by another process (still locked after {waited_s:g} s): "
            "another planner, or a tool holding a transaction open"
        )
    if "not a database" in message:
        return f"not an SQLite database ({message})"
    if "malformed" in message or "corrupt" in message:
        return f"corrupt ({message}); restore it from a backup"
    return message


def _check_postgres(url: str, *, migrate: bool) -> None:
    engine = create_engine(url, connect_args={"connect_timeout": int(CONNECT_TIMEOUT_S)})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            if not migrate:
                exists = conn.execute(text("SELECT to_regclass('alembic_version') IS NOT NULL")).scalar()
                revision = (
                    conn.execute(text("SELECT version_num FROM alembic_version")).scalar() if exists else None
                )
                _check_schema(url, revision)
    except DBAPIError as exc:
        raise _fail(url, f"cannot reach the database: {_one_line(str(exc.orig))}") from None
    finally:
        engine.dispose()


# --- what fails later -----------------------------------------------------------------------------


def describe_database_error(exc: BaseException, url: str) -> str | None:
    """One line for a database failure raised after the checks (a migration, the service's
    start-up); None when `exc` is not one."""
    from alembic.util.exc import CommandError

    if isinstance(exc, DatabaseStartupError):
        return str(exc)
    path = sqlite_path(url)
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        if isinstance(exc.orig, sqlite3.Error) and path is not None:
            return str(_fail(url, _sqlite_reason(exc.orig, SERVICE_BUSY_TIMEOUT_S)))
        return str(_fail(url, f"database error: {_one_line(str(exc.orig))}"))
    if isinstance(exc, sqlite3.Error) and path is not None:
        return str(_fail(url, _sqlite_reason(exc, SERVICE_BUSY_TIMEOUT_S)))
    if isinstance(exc, SQLAlchemyError):
        return str(_fail(url, _one_line(str(exc))))
    if isinstance(exc, CommandError):
        # An unknown revision: a typo on the command line, or a schema a newer planner migrated.
        return str(_fail(url, f"migration: {_one_line(str(exc))}"))
    if isinstance(exc, TimeoutError):
        return str(_fail(url, _one_line(str(exc))))
    return None
