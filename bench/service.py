"""A real `planner serve` process for the API benchmarks (bench/api.py, bench/longpoll.py): a
fresh migrated database (SQLite, or PostgreSQL from PLANNER_TEST_POSTGRES_URL), the demo
deployment's config file, and the server process on a free loopback port."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.store.db import upgrade

REPO_ROOT = Path(__file__).resolve().parents[1]
# The same variable the test suite reads, so one PostgreSQL server serves both.
PG_ENV = "PLANNER_TEST_POSTGRES_URL"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_admin_url() -> str | None:
    """The server URL from PG_ENV, if set and answering."""
    url = os.environ.get(PG_ENV)
    if not url:
        return None
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception:
        return None
    finally:
        engine.dispose()
    return url


class PostgresDatabases:
    """A migrated template database created once, then fresh databases cloned from it; `close`
    drops them all."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self._admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self.template = f"planner_tmpl_{uuid.uuid4().hex[:8]}"
        self._execute(f'CREATE DATABASE "{self.template}"')
        upgrade(self._url_for(self.template))
        self._created: list[str] = []

    def _execute(self, sql: str) -> None:
        with self._admin.connect() as conn:
            conn.execute(text(sql))

    def _url_for(self, name: str) -> str:
        return make_url(self.admin_url).set(database=name).render_as_string(hide_password=False)

    def fresh(self) -> str:
        name = f"planner_t_{uuid.uuid4().hex[:10]}"
        self._execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        self._created.append(name)
        return self._url_for(name)

    def close(self) -> None:
        for name in [*self._created, self.template]:
            self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._admin.dispose()


class SqliteDatabases:
    """A migrated template file in `workdir`, copied for each fresh database."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.template = workdir / "template.db"
        upgrade(f"sqlite:///{self.template}")

    def fresh(self) -> str:
        path = self.workdir / f"t_{uuid.uuid4().hex[:10]}.db"
        shutil.copyfile(self.template, path)
        return f"sqlite:///{path}"

    def drop(self, url: str) -> None:
        Path(make_url(url).database or "").unlink(missing_ok=True)


def demo_config() -> dict[str, Any]:
    """The deployments file of examples/planner.yaml: the `demo` deployment."""
    return {
        "deployments": [
            {
                "name": "demo",
                "mode": "disagg",
                "connector": {"type": "virtual", "ack_timeout_s": 1800},
                "sla": {"ttft_ms": 500, "itl_ms": 50},
                "prefill": {"min_replicas": 1, "max_replicas": 8},
                "decode": {"min_replicas": 1, "max_replicas": 8},
            }
        ]
    }


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass
class PlannerProcess:
    """A real `planner serve` process on a free loopback port."""

    database_url: str
    config_path: Path
    tokens: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> PlannerProcess:
        """Start the server and wait until `/healthz` answers 200; RuntimeError (naming the log)
        when it exits or does not answer within `timeout_s`."""
        env = {
            **os.environ,
            "PLANNER_DATABASE_URL": self.database_url,
            "PLANNER_CONFIG": str(self.config_path),
            "PLANNER_HOST": "127.0.0.1",
            "PLANNER_PORT": str(self.port),
            "PLANNER_API_TOKENS": self.tokens,
            "PLANNER_LOG_LEVEL": "INFO",
            **self.extra_env,
        }
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve"],
            env=env,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"planner serve exited with {self.proc.returncode}; log: {self.log_path}")
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"planner serve did not answer /healthz within {timeout_s} s; log: {self.log_path}"
        )

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 10 s."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
