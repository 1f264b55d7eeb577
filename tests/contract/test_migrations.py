"""Migrations: upgrade -> downgrade -> upgrade on both backends, the result matches the models,
concurrent upgrades are safe, and names follow the conventions."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.engine import make_url

from app.store.db import _MIGRATION_LOCK_KEY as MIGRATION_LOCK_KEY
from app.store.db import alembic_config, downgrade, upgrade
from app.store.models import Base

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS_DIR = REPO_ROOT / "migrations" / "versions"
MODEL_TABLES = set(Base.metadata.tables)
FILE_NAME = re.compile(r"^\d{4}_\d{2}_\d{2}_\d{4}_[a-z0-9_]+\.py$")


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


@pytest.fixture
def empty_url(databases) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A fresh database with no tables at all, on each backend."""
    url = databases.fresh(migrated=False)
    yield url
    databases.drop(url)


def engine_for(url: str) -> Engine:
    return create_engine(url)


def tables(url: str) -> set[str]:
    engine = engine_for(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def versions(url: str) -> list[str]:
    engine = engine_for(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())
    finally:
        engine.dispose()


def schema_diff(url: str) -> list:  # type: ignore[type-arg]
    engine = engine_for(url)
    try:
        with engine.connect() as conn:
            return compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()


def test_model_tables_are_known() -> None:
    # Guards the tests below: an empty metadata would compare equal to an empty database.
    assert MODEL_TABLES == {
        "audit_log",
        "decision_acks",
        "decisions",
        "deployment_settings",
        "deployment_state",
        "fleet_state",
        "overrides",
        "planner_state",
        "ticks",
    }


def test_upgrade_downgrade_upgrade(empty_url: str) -> None:
    upgrade(empty_url)
    assert tables(empty_url) == MODEL_TABLES | {"alembic_version"}
    assert versions(empty_url) == [head_revision()]

    downgrade(empty_url, "base")
    assert tables(empty_url) == {"alembic_version"}
    assert versions(empty_url) == []
    if empty_url.startswith("postgresql"):
        engine = engine_for(empty_url)
        try:
            with engine.connect() as conn:
                leftovers = (
                    conn.execute(
                        text(
                            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                            "WHERE n.nspname = 'public' AND c.relname <> 'alembic_version' "
                            "AND c.relname <> 'alembic_version_pkc'"
                        )
                    )
                    .scalars()
                    .all()
                )
        finally:
            engine.dispose()
        assert leftovers == [], "downgrade leaves sequences, indexes or tables behind"

    upgrade(empty_url)
    assert tables(empty_url) == MODEL_TABLES | {"alembic_version"}
    assert versions(empty_url) == [head_revision()]
    assert schema_diff(empty_url) == []


def test_migrated_schema_matches_models(db_url: str) -> None:
    assert schema_diff(db_url) == []


def test_schema_diff_sees_a_missing_index(db_url: str) -> None:
    """The comparison itself can fail: drop an index the models declare and it shows up."""
    engine = engine_for(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP INDEX ix_ticks_deployment_at"))
    finally:
        engine.dispose()
    diff = schema_diff(db_url)
    assert [(d[0], d[1].name) for d in diff] == [("add_index", "ix_ticks_deployment_at")]


def test_upgrade_on_a_migrated_database_is_a_no_op(db_url: str) -> None:
    upgrade(db_url)
    assert versions(db_url) == [head_revision()]
    assert schema_diff(db_url) == []


def _start_upgrades(url: str, count: int) -> list[subprocess.Popen[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
    env.update(
        {
            "PLANNER_DATABASE_URL": url,
            "PLANNER_CONFIG": str(REPO_ROOT / "examples" / "planner.yaml"),
            "PLANNER_HOST": "127.0.0.1",
            "PLANNER_PORT": "8080",
            "PLANNER_API_TOKENS": "",
            "PLANNER_LOG_LEVEL": "INFO",
        }
    )
    return [
        subprocess.Popen(
            [sys.executable, "-m", "app.cli", "db", "upgrade"],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]


def _until(predicate: Callable[[], bool], what: str, procs: list[subprocess.Popen[str]]) -> None:
    """Poll an observable state; the deadline only bounds a failing run."""
    deadline = time.monotonic() + 60
    while not predicate():
        exited = [p.returncode for p in procs if p.poll() is not None]
        if exited or time.monotonic() > deadline:
            for p in procs:
                p.kill()
            outputs = [p.communicate()[1] for p in procs]
            pytest.fail(f"never saw {what}; exited: {exited}; stderr: {outputs}")
        time.sleep(0.05)


@contextmanager
def migration_lock_held(url: str) -> Iterator[Callable[[], int]]:
    """Hold the planner's migration lock; yield a function counting processes blocked on it."""
    if url.startswith("postgresql"):
        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as holder, engine.connect() as watcher:
                holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})

                def waiting() -> int:
                    return watcher.execute(
                        text(
                            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                            "AND objid = :k "
                            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                        ),
                        {"k": MIGRATION_LOCK_KEY},
                    ).scalar_one()

                yield waiting
                holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
        finally:
            engine.dispose()
    else:
        database = Path(make_url(url).database or "")
        lock_path = database.with_name(database.name + ".migrate.lock")
        with open(lock_path, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            inode = os.fstat(fh.fileno()).st_ino

            def waiting() -> int:
                # Linux lists a blocked lock request as "N: -> FLOCK ADVISORY WRITE pid maj:min:inode ..."
                lines = Path("/proc/locks").read_text().splitlines()
                return sum(1 for ln in lines if "->" in ln and ln.split()[6].endswith(f":{inode}"))

            yield waiting
            fcntl.flock(fh, fcntl.LOCK_UN)


def test_concurrent_cli_upgrades(empty_url: str) -> None:
    """Two replicas starting at once: both wait on the migration lock, both succeed, the schema ends
    at head and the migration ran exactly once."""
    procs: list[subprocess.Popen[str]] = []
    with migration_lock_held(empty_url) as waiting:
        procs.extend(_start_upgrades(empty_url, 2))
        # Both are now lined up on the lock: releasing it makes them race for real.
        _until(lambda: waiting() == 2, "both upgrades waiting on the migration lock", procs)
    outputs = [p.communicate(timeout=120) for p in procs]
    results = [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]
    assert [r[0] for r in results] == [0, 0], [r[2] for r in results]
    # Every migration of the chain runs once: the first one's log line says "Running upgrade  -> <rev>".
    applied = sum(err.count("Running upgrade  -> ") for _, _, err in results)
    assert applied == 1, "exactly one process applies the migrations; the other finds them done"
    assert versions(empty_url) == [head_revision()]
    assert tables(empty_url) == MODEL_TABLES | {"alembic_version"}
    assert schema_diff(empty_url) == []


def test_a_stuck_migration_lock_ends_the_upgrade_after_a_bounded_wait(
    empty_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A planner holding the lock for ever (a hung migration) made every other one wait for ever,
    silently. Now the wait is logged when it starts and ends in TimeoutError, which the command
    line reports in one line; nothing was migrated."""
    from app.store import db
    from app.store.startup import describe_database_error

    monkeypatch.setattr(db, "MIGRATION_LOCK_WAIT_S", 0.5)
    # Bounded: the wait ends in TimeoutError (a wait for ever would hang, and the test's timeout
    # would end it).
    with migration_lock_held(empty_url), pytest.raises(TimeoutError) as info:
        upgrade(empty_url)
    assert "waiting up to 0.5 s" in caplog.text
    line = describe_database_error(info.value, empty_url)
    assert line is not None and line.startswith("PLANNER_DATABASE_URL: ")
    assert "another process has held the migration lock" in line and "for more than 0.5 s" in line
    assert tables(empty_url) == set()


# --- names ----------------------------------------------------------------------------------------


def migration_files() -> list[Path]:
    return sorted(p for p in VERSIONS_DIR.glob("*.py") if p.name != "__init__.py")


def test_migration_file_names() -> None:
    names = [p.name for p in migration_files()]
    assert names, "no migrations found"
    assert [n for n in names if not FILE_NAME.match(n)] == []


def test_single_head() -> None:
    assert len(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()) == 1


@dataclass(frozen=True)
class ConstraintName:
    table: str
    kind: str
    name: str | None
    expected: str


def constraint_names(url: str) -> list[ConstraintName]:
    engine = engine_for(url)
    try:
        insp = inspect(engine)
        found: list[ConstraintName] = []
        for table in sorted(MODEL_TABLES):
            pk = insp.get_pk_constraint(table)
            found.append(ConstraintName(table, "pk", pk["name"], f"pk_{table}"))
            for uq in insp.get_unique_constraints(table):
                found.append(
                    ConstraintName(table, "uq", uq["name"], f"uq_{table}_{'_'.join(uq['column_names'])}")
                )
            for fk in insp.get_foreign_keys(table):
                found.append(
                    ConstraintName(
                        table,
                        "fk",
                        fk["name"],
                        f"fk_{table}_{fk['constrained_columns'][0]}_{fk['referred_table']}",
                    )
                )
            for ix in insp.get_indexes(table):
                if ix.get("duplicates_constraint"):  # PostgreSQL: the index behind a unique constraint
                    continue
                found.append(
                    ConstraintName(
                        table,
                        "ix",
                        ix["name"],
                        f"ix_{table}_{'_'.join(c for c in ix['column_names'] if c)}",
                    )
                )
        return found
    finally:
        engine.dispose()


def test_constraint_names_follow_the_convention(db_url: str) -> None:
    found = constraint_names(db_url)
    assert [c for c in found if c.name != c.expected] == []
    # Every kind is present, so the check above covered something of each.
    assert sorted({c.kind for c in found}) == ["fk", "ix", "pk", "uq"]
    assert sorted(c.name for c in found if c.kind in ("uq", "fk")) == [
        "fk_decision_acks_decision_pk_decisions",
        "fk_decisions_tick_id_ticks",
        "uq_decisions_deployment_decision_id",
    ]
