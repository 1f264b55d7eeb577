"""Shared fixtures. Every store and API test runs against SQLite and a real PostgreSQL.

PostgreSQL comes from PLANNER_TEST_POSTGRES_URL (`.ci/run` starts one and sets it). Without it
the PostgreSQL cases are skipped locally; under CI=true any skipped test fails the run.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.config import DeploymentsFile, Settings
from app.main import create_app
from app.workers.clock import ManualClock
from tests.support import PG_ENV, PostgresDatabases, SqliteDatabases, demo_config, postgres_admin_url

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
BACKENDS = ["sqlite", "postgresql"]


# --- CI: a skipped test is a failure ------------------------------------------------------------

_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes") and _skipped:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"CI=true and {len(_skipped)} test(s) were skipped (integration parts missing?): "
                + ", ".join(_skipped[:5]),
                red=True,
            )


# --- databases ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sqlite_dbs(tmp_path_factory: pytest.TempPathFactory) -> SqliteDatabases:
    return SqliteDatabases(tmp_path_factory.mktemp("sqlite"))


@pytest.fixture(scope="session")
def pg_dbs() -> Iterator[PostgresDatabases]:
    url = postgres_admin_url()
    if url is None:
        pytest.skip(f"no PostgreSQL: set {PG_ENV} to a server URL (make test under .ci/run does)")
    dbs = PostgresDatabases(url)
    yield dbs
    dbs.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def databases(backend: str, request: pytest.FixtureRequest) -> SqliteDatabases | PostgresDatabases:
    return request.getfixturevalue("sqlite_dbs" if backend == "sqlite" else "pg_dbs")


@pytest.fixture
def db_url(databases: SqliteDatabases | PostgresDatabases) -> Iterator[str]:
    """A fresh, migrated database for this test, on each backend."""
    url = databases.fresh()
    yield url
    databases.drop(url)


# --- the app in-process ---------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Api:
    app: FastAPI
    client: httpx.AsyncClient
    clock: ManualClock

    def auth(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


ApiFactory = Callable[..., Awaitable[Api]]


def make_settings(db_url: str, *, tokens: str = "", config_path: str | Path = "unused.yaml") -> Settings:
    # Every field given explicitly, so PLANNER_* variables of the caller's shell cannot leak in.
    return Settings(
        database_url=db_url,
        config=str(config_path),
        host="127.0.0.1",
        port=8080,
        api_tokens=tokens,
        api_tokens_file=None,
        log_level="INFO",
    )


@pytest.fixture
async def make_api(db_url: str) -> AsyncIterator[ApiFactory]:
    """Build the app on this test's database, run its lifespan, and talk to it over ASGI.

    Workers do not run on their own (`run_workers=False`): tests tick them explicitly at the
    manual clock's time."""
    stack = AsyncExitStack()

    async def make(config: dict[str, Any] | None = None, *, tokens: str = "", start: datetime = T0) -> Api:
        clock = ManualClock(start)
        app = create_app(
            make_settings(db_url, tokens=tokens),
            deployments=DeploymentsFile.model_validate(config or demo_config()),
            clock=clock,
            run_workers=False,
        )
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://planner")
        )
        return Api(app=app, client=client, clock=clock)

    yield make
    await stack.aclose()
