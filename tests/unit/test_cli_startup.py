"""Start-up failures of `planner serve` and `planner db upgrade` as real processes: each is one
line `planner: error: ...` naming the file or the URL, exit status 2, and quick; never a
traceback (they were 72 to 112 lines of one), never exit 1 or uvicorn's 3."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import demo_config, free_port, run_planner, write_config

REPO_ROOT = Path(__file__).resolve().parents[2]


def planner(*args: str, env: dict[str, str], timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    return run_planner(*args, env=env, timeout_s=timeout_s)


def migrated_sqlite(path: Path) -> Path:
    from app.store.db import upgrade

    upgrade(f"sqlite:///{path}")
    assert not path.with_name(path.name + "-wal").exists()  # checkpointed: the file is whole
    return path


@dataclass
class World:
    """What a case set up: the database URL, and settings to add."""

    tmp: Path
    database_url: str
    env: dict[str, str]


@dataclass(frozen=True)
class StartCase:
    name: str
    why: str
    args: tuple[str, ...]
    setup: Callable[[Path], World]
    expected: str  # the whole stderr line after "planner: error: "; {tmp} is the test's folder


def _sqlite(tmp: Path, name: str, **env: str) -> World:
    return World(tmp, f"sqlite:///{tmp / name}", dict(env))


def corrupt(tmp: Path) -> World:
    (tmp / "planner.db").write_bytes(b"these are not the bytes of an SQLite database\n" * 400)
    return _sqlite(tmp, "planner.db")


def truncated(tmp: Path) -> World:
    path = migrated_sqlite(tmp / "planner.db")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 100])  # a copy cut short, past SQLite's header
    return _sqlite(tmp, "planner.db")


def truncated_header(tmp: Path) -> World:
    path = migrated_sqlite(tmp / "planner.db")
    path.write_bytes(path.read_bytes()[:50])
    return _sqlite(tmp, "planner.db")


def missing_folder(tmp: Path) -> World:
    return _sqlite(tmp, "absent/planner.db")


def folder_not_file(tmp: Path) -> World:
    (tmp / "planner.db").mkdir()
    return _sqlite(tmp, "planner.db")


def not_migrated(tmp: Path) -> World:
    return _sqlite(tmp, "planner.db", PLANNER_APPLY_MIGRATIONS="false")


def bad_fpm_endpoint(tmp: Path) -> World:
    """A failure inside the app's lifespan (the FPM subscriber connects there)."""
    config = demo_config(mode="agg", load={"enabled": True}, sources={"fpm_endpoints": ["nonsense://x"]})
    config_path = write_config(tmp / "planner.yaml", config)
    return _sqlite(tmp, "planner.db", PLANNER_CONFIG=str(config_path))


TRUNCATED_LINE = "PLANNER_DATABASE_URL: {tmp}/planner.db: truncated ("
CASES = [
    StartCase(
        "serve_corrupt_sqlite",
        "a file that is not SQLite: named, not 72 lines of sqlite3.DatabaseError",
        ("serve",),
        corrupt,
        "PLANNER_DATABASE_URL: {tmp}/planner.db: not an SQLite database "
        "(a corrupt file, or another file at that path)",
    ),
    StartCase(
        "db_upgrade_corrupt_sqlite",
        "db upgrade checks the same way",
        ("db", "upgrade"),
        corrupt,
        "PLANNER_DATABASE_URL: {tmp}/planner.db: not an SQLite database "
        "(a corrupt file, or another file at that path)",
    ),  # fmt: skip
    StartCase(
        "serve_truncated_sqlite",
        "a database cut short (a partial copy): caught from its header before SQLite reads garbage",
        ("serve",),
        truncated,
        TRUNCATED_LINE,
    ),
    StartCase(
        "serve_truncated_header",
        "shorter than SQLite's 100-byte header",
        ("serve",),
        truncated_header,
        "PLANNER_DATABASE_URL: {tmp}/planner.db: truncated (50 bytes, shorter than SQLite's header); "
        "restore it from a backup",
    ),
    StartCase(
        "serve_missing_folder",
        "was a FileNotFoundError traceback from the migration lock file",
        ("serve",),
        missing_folder,
        "PLANNER_DATABASE_URL: {tmp}/absent/planner.db: its folder {tmp}/absent does not exist "
        "(create it, or set PLANNER_DATABASE_URL elsewhere)",
    ),
    StartCase(
        "db_upgrade_missing_folder",
        "the same for db upgrade",
        ("db", "upgrade"),
        missing_folder,
        "PLANNER_DATABASE_URL: {tmp}/absent/planner.db: its folder {tmp}/absent does not exist "
        "(create it, or set PLANNER_DATABASE_URL elsewhere)",
    ),  # fmt: skip
    StartCase(
        "serve_database_is_a_folder",
        "a folder where the file should be",
        ("serve",),
        folder_not_file,
        "PLANNER_DATABASE_URL: {tmp}/planner.db: a folder, not an SQLite database file",
    ),
    StartCase(
        "serve_not_migrated",
        "without migrations at start-up, a missing schema says what to run",
        ("serve",),
        not_migrated,
        "PLANNER_DATABASE_URL: {tmp}/planner.db: no database file; run `planner db upgrade` "
        "(or PLANNER_APPLY_MIGRATIONS=true)",
    ),
    StartCase(
        "serve_lifespan_failure",
        "a failure inside the app's start-up was uvicorn's traceback and exit 3",
        ("serve",),
        bad_fpm_endpoint,
        "start-up failed: SourceUnavailableError: fpm: 'nonsense://x' is not a ZMQ address",
    ),
]


def quiet_env(world: World) -> dict[str, str]:
    """Settings under which a failing start-up prints nothing but its one line: a token (no
    warning about an open API) and warnings only (no INFO lines of the migration)."""
    return {
        "PLANNER_DATABASE_URL": world.database_url,
        "PLANNER_CONFIG": str(REPO_ROOT / "examples" / "planner.yaml"),
        "PLANNER_HOST": "127.0.0.1",
        "PLANNER_PORT": str(free_port()),  # a start that succeeded would not return: timeout
        "PLANNER_API_TOKENS": "viewer:viewer-token-1",
        "PLANNER_LOG_LEVEL": "WARNING",
        **world.env,
    }


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_start_up_failure_is_one_line(case: StartCase, tmp_path: Path) -> None:
    world = case.setup(tmp_path)
    result = planner(*case.args, env=quiet_env(world))
    expected = "planner: error: " + case.expected.replace("{tmp}", str(tmp_path))
    assert "Traceback" not in result.stderr, f"{case.why}:\n{result.stderr}"
    assert result.stderr.splitlines() == [result.stderr.strip()], (
        f"{case.why}: not one line:\n{result.stderr}"
    )
    assert result.stderr.startswith(expected), f"{case.why}: {result.stderr!r}"
    assert result.returncode == 2, case.why
    assert result.stdout == ""


@pytest.fixture
def locked_database(tmp_path: Path) -> Iterator[Path]:
    """A migrated SQLite database another process holds a write transaction open on."""
    path = migrated_sqlite(tmp_path / "planner.db")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            f"c = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE')\n"
            "c.execute('CREATE TABLE held (x)')\n"
            "print('locked', flush=True)\n"
            "time.sleep(300)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield path
    finally:
        holder.kill()
        holder.wait(timeout=10)


@pytest.mark.parametrize("command", [("serve",), ("db", "upgrade")], ids=" ".join)
def test_a_locked_database_fails_quickly_naming_the_lock(
    command: tuple[str, ...], locked_database: Path
) -> None:
    """It was 30 s of silence (SQLite's busy timeout), then 80 lines and exit 3."""
    world = World(locked_database.parent, f"sqlite:///{locked_database}", {})
    result = planner(*command, env=quiet_env(world))
    assert result.returncode == 2, result.stderr
    # The wait for the lock is bounded, and the line says by how much (SQLite's own busy timeout
    # is 30 s of silence).
    assert result.stderr.splitlines() == [
        f"planner: error: PLANNER_DATABASE_URL: {locked_database}: locked by another process "
        "(still locked after 5 s): another planner, or a tool holding a transaction open"
    ]


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    """uvicorn's bind error was a log record among the start-up lines and exit 1."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**quiet_env(_sqlite(tmp_path, "planner.db")), "PLANNER_PORT": str(port)}
        result = planner("serve", env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"planner: error: PLANNER_HOST, PLANNER_PORT: cannot listen on 127.0.0.1:{port}: "
        "Address already in use"
    ]
