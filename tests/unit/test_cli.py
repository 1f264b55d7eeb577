"""The `planner` command line as a real process: a bad setting is one line and a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, inspect

from tests.support import demo_config, run_planner

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPECTED_TABLES = {
    "alembic_version",
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


def planner(*args: str, env: dict[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return run_planner(*args, env=env, timeout_s=timeout_s)


def planner_env(tmp_path: Path, **given: str) -> dict[str, str]:
    env = {
        "PLANNER_DATABASE_URL": f"sqlite:///{tmp_path / 'planner.db'}",
        "PLANNER_CONFIG": str(REPO_ROOT / "examples" / "planner.yaml"),
        "PLANNER_HOST": "127.0.0.1",
        "PLANNER_PORT": "1",  # never reached: every case here must stop before listening
        "PLANNER_API_TOKENS": "",
        "PLANNER_LOG_LEVEL": "INFO",
    }
    env.update(given)
    return env


def stderr_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def write_yaml(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass(frozen=True)
class FailCase:
    name: str
    why: str
    args: tuple[str, ...]
    # PLANNER_* values; "{tmp}" is replaced by the test's tmp_path
    env: dict[str, str]
    expected_start: str  # the one stderr line starts with this (after "planner: error: ")
    exit_code: int


def _bad_sla_config(tmp: Path) -> str:
    config = demo_config(sla={"ttft_ms": -1, "itl_ms": 50})
    # `ttft:` for `ttft_ms:`: the typo, not the key it makes missing, is the news.
    write_yaml(tmp / "typo.yaml", demo_config(sla={"ttft": 500, "itl_ms": 50}))
    return str(write_yaml(tmp / "bad.yaml", config))


UNREACHABLE_PG = (
    "PLANNER_DATABASE_URL: postgresql+psycopg://postgres:***@127.0.0.1:1/planner: cannot reach the database: "
)
FAIL_CASES = [
    FailCase(
        "serve_bad_deployments_file",
        "a bad field stops start-up naming file and field",
        ("serve",),
        {"PLANNER_CONFIG": "{tmp}/bad.yaml"},
        "{tmp}/bad.yaml: deployments[0].sla.ttft_ms: ",
        2,
    ),
    FailCase(
        "serve_yaml_key_typo",
        "an unknown key is named, with the key it probably meant, not reported as the missing one",
        ("serve",),
        {"PLANNER_CONFIG": "{tmp}/typo.yaml"},
        "{tmp}/typo.yaml: deployments[0].sla: unknown key 'ttft' (did you mean 'ttft_ms'?)",
        2,
    ),
    FailCase(
        "serve_missing_deployments_file",
        "the missing file names PLANNER_CONFIG",
        ("serve",),
        {"PLANNER_CONFIG": "{tmp}/absent.yaml"},
        "{tmp}/absent.yaml: deployments file not found (set PLANNER_CONFIG)",
        2,
    ),
    FailCase(
        "serve_open_on_all_interfaces",
        "no tokens and not loopback: refuse to start",
        ("serve",),
        {"PLANNER_HOST": "0.0.0.0"},
        "PLANNER_HOST: refusing to listen on 0.0.0.0 without API tokens",
        2,
    ),
    FailCase(
        "serve_bad_token_entry",
        "a malformed token setting stops start-up",
        ("serve",),
        {"PLANNER_API_TOKENS": "admin:abcdefgh"},
        "PLANNER_API_TOKENS: role 'admin' is not one of",
        2,
    ),
    FailCase(
        "serve_bad_port", "the variable is named", ("serve",), {"PLANNER_PORT": "70000"}, "PLANNER_PORT: ", 2
    ),
    FailCase(
        "serve_bad_log_format",
        "the log formats are text and json",
        ("serve",),
        {"PLANNER_LOG_FORMAT": "xml"},
        "PLANNER_LOG_FORMAT: Input should be 'text' or 'json'",
        2,
    ),
    FailCase(
        "db_upgrade_unknown_scheme",
        "an unsupported database URL is a settings error",
        ("db", "upgrade"),
        {"PLANNER_DATABASE_URL": "mysql://u:p@127.0.0.1/db"},
        "PLANNER_DATABASE_URL: ",
        2,
    ),
    FailCase(
        "db_upgrade_unreachable_postgres",
        "an unreachable server names the setting and the URL, password masked; exit 2 as documented",
        ("db", "upgrade"),
        {"PLANNER_DATABASE_URL": "postgresql://postgres:s3cret@127.0.0.1:1/planner"},
        UNREACHABLE_PG,
        2,
    ),
    FailCase(
        "serve_unreachable_postgres",
        "serve as db upgrade: one line, exit 2 (it was 1)",
        ("serve",),
        {
            "PLANNER_DATABASE_URL": "postgresql://postgres:s3cret@127.0.0.1:1/planner",
            "PLANNER_API_TOKENS": "viewer:viewer-token-1",  # no warning about an open API
        },
        UNREACHABLE_PG,
        2,
    ),
    FailCase(
        "db_upgrade_unknown_revision",
        "a revision the migrations do not have is one line, not alembic's traceback",
        ("db", "upgrade", "nonsense"),
        {"PLANNER_LOG_LEVEL": "WARNING"},
        "PLANNER_DATABASE_URL: {tmp}/planner.db: migration: Can't locate revision identified by 'nonsense'",
        2,
    ),
    FailCase(
        "replay_unknown_flag",
        "a flag replay does not know is replay's one line, not the top level's usage",
        ("replay", "--workload", "diurnal", "--out", "{tmp}/out", "--bogus"),
        {},
        "unrecognized arguments: --bogus",
        2,
    ),
    FailCase(
        "bad_database_url",
        "the validator's sentence, without pydantic's 'Value error, ' before it",
        ("serve",),
        {"PLANNER_DATABASE_URL": "notaurl"},
        "PLANNER_DATABASE_URL: must start with sqlite:/// or postgresql://",
        2,
    ),
]


@pytest.mark.parametrize("case", FAIL_CASES, ids=lambda c: c.name)
def test_fails_with_one_line(case: FailCase, tmp_path: Path) -> None:
    _bad_sla_config(tmp_path)
    env = planner_env(tmp_path, **{k: v.replace("{tmp}", str(tmp_path)) for k, v in case.env.items()})
    # A process that started listening would not return: the timeout fails the test.
    result = planner(*case.args, env=env)
    lines = stderr_lines(result)
    assert result.returncode == case.exit_code, f"{case.why}: {result.stderr}"
    assert len(lines) == 1, f"{case.why}: expected one line, got {lines}"
    assert lines[0].startswith("planner: error: " + case.expected_start.replace("{tmp}", str(tmp_path))), (
        lines
    )
    assert "Traceback" not in result.stderr
    assert "s3cret" not in result.stderr
    assert result.stdout == ""


def test_help_lists_every_command_on_one_line_each(tmp_path: Path) -> None:
    """`planner --help` named only serve, db upgrade and openapi in its description, and the
    longer commands' help wrapped onto a second line."""
    result = planner("--help", env={**planner_env(tmp_path), "COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    commands = ("serve", "db", "openapi", "plan", "replay", "demo")
    assert lines[2] == "The `planner` command line: serve, db upgrade, openapi, plan, replay, demo."
    listed = lines[lines.index("commands:") + 2 :]  # after the title and the COMMAND line
    assert [line.split()[0] for line in listed] == list(commands), result.stdout
    for line in listed:
        assert len(line.split()) > 2 and len(line) <= 80, f"no one-line help: {line!r}"


def test_refusing_to_listen_touches_no_database(tmp_path: Path) -> None:
    """The exposure check runs before migrations: a refused start leaves nothing behind."""
    result = planner("serve", env=planner_env(tmp_path, PLANNER_HOST="0.0.0.0"))
    assert result.returncode == 2
    assert not (tmp_path / "planner.db").exists()


def test_db_upgrade_creates_the_schema(tmp_path: Path) -> None:
    db = tmp_path / "fresh.db"
    url = f"sqlite:///{db}"
    result = planner("db", "upgrade", env=planner_env(tmp_path, PLANNER_DATABASE_URL=url))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"database at head: {url}\n"
    engine = create_engine(url)
    try:
        assert set(inspect(engine).get_table_names()) == EXPECTED_TABLES
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all() == [
                "0006_deployment_config"
            ]
    finally:
        engine.dispose()


def test_db_upgrade_twice_is_a_no_op(tmp_path: Path) -> None:
    env = planner_env(tmp_path)
    assert planner("db", "upgrade", env=env).returncode == 0
    again = planner("db", "upgrade", env=env)
    assert again.returncode == 0, again.stderr
    assert "Running upgrade" not in again.stderr


def test_unknown_command_is_a_usage_error(tmp_path: Path) -> None:
    result = planner("frobnicate", env=planner_env(tmp_path))
    assert result.returncode == 2
    assert "invalid choice: 'frobnicate'" in result.stderr


def test_serve_resolves_the_example_profile_from_any_working_directory(tmp_path: Path) -> None:
    """Relative paths in a deployments file are relative to the file, not to where planner runs."""
    import httpx

    from tests.support import free_port

    port = free_port()
    env = {
        **os.environ,
        "PLANNER_DATABASE_URL": f"sqlite:///{tmp_path / 'planner.db'}",
        "PLANNER_CONFIG": str(REPO_ROOT / "examples" / "planner.yaml"),
        "PLANNER_HOST": "127.0.0.1",
        "PLANNER_PORT": str(port),
        "PLANNER_API_TOKENS": "",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        body = None
        for _ in range(300):  # a bounded wait for start-up, not a timing assertion
            if proc.poll() is not None:
                break
            try:
                r = httpx.post(
                    f"http://127.0.0.1:{port}/plan",
                    json={"deployment": "demo", "rps": 20, "isl": 3000, "osl": 150},
                    timeout=2,
                )
                body = r.json()
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert body is not None, proc.stdout.read().decode() if proc.poll() is not None else "no answer"
        assert (body["num_prefill"], body["num_decode"]) == (2, 1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
