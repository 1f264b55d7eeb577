"""Helpers shared by tests and benchmarks: fresh databases, configs, real server processes, and
the HTTP helpers the integration tests use against those processes."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.store.db import upgrade

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_planner(*args: str, env: dict[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `planner ARGS` as a process with exactly the PLANNER_* variables given (none inherited)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=REPO_ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


PG_ENV = "PLANNER_TEST_POSTGRES_URL"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_admin_url() -> str | None:
    """The server URL from PLANNER_TEST_POSTGRES_URL, if set and answering."""
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
    """Creates a migrated template once, then one fresh database per test cloned from it.

    Per-test databases (rather than a rolled-back transaction) because the code under test
    commits, LISTENs and runs in other processes, like production."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self._admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self.template = f"planner_tmpl_{uuid.uuid4().hex[:8]}"
        self._execute(f'CREATE DATABASE "{self.template}"')
        upgrade(self.url_for(self.template))
        self._created: list[str] = []

    def _execute(self, sql: str) -> None:
        with self._admin.connect() as conn:
            conn.execute(text(sql))

    def url_for(self, name: str) -> str:
        return make_url(self.admin_url).set(database=name).render_as_string(hide_password=False)

    def fresh(self, *, migrated: bool = True) -> str:
        name = f"planner_t_{uuid.uuid4().hex[:10]}"
        self._execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{self.template}"' if migrated else ""))
        self._created.append(name)
        return self.url_for(name)

    def drop(self, url: str) -> None:
        name = make_url(url).database
        self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        for name in [*self._created, self.template]:
            self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._admin.dispose()


class SqliteDatabases:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.template = workdir / "template.db"
        upgrade(f"sqlite:///{self.template}")

    def fresh(self, *, migrated: bool = True) -> str:
        path = self.workdir / f"t_{uuid.uuid4().hex[:10]}.db"
        if migrated:
            shutil.copyfile(self.template, path)
        return f"sqlite:///{path}"

    def drop(self, url: str) -> None:
        Path(make_url(url).database or "").unlink(missing_ok=True)


def demo_config(**overrides: Any) -> dict[str, Any]:
    """The deployments file of examples/planner.yaml, with top-level fields of `demo` replaced."""
    deployment: dict[str, Any] = {
        "name": "demo",
        "mode": "disagg",
        "connector": {"type": "virtual", "ack_timeout_s": 1800},
        "sla": {"ttft_ms": 500, "itl_ms": 50},
        "prefill": {"min_replicas": 1, "max_replicas": 8},
        "decode": {"min_replicas": 1, "max_replicas": 8},
    }
    deployment.update(overrides)
    return {"deployments": [deployment]}


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

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, like a crashed node."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


# --- talking to a real `planner serve` (integration tests) ----------------------------------------

TOKENS = "viewer:viewer-token-1,orchestrator:orch-token-1,operator:oper-token-1"
VIEWER = {"Authorization": "Bearer viewer-token-1"}
ORCH = {"Authorization": "Bearer orch-token-1"}
OPER = {"Authorization": "Bearer oper-token-1"}
# How the audit log and the pin reasons name the operator token (a fingerprint, not the token).
OPER_NAME = "token:" + hashlib.sha256(b"oper-token-1").hexdigest()[:10]


def log_tail(proc: PlannerProcess, lines: int = 60) -> str:
    if proc.log_path is None or not Path(proc.log_path).exists():
        return "(no log)"
    text = Path(proc.log_path).read_text(errors="replace").splitlines()
    return f"--- {proc.log_path} (last {lines} lines) ---\n" + "\n".join(text[-lines:])


def logs(*procs: PlannerProcess) -> str:
    return "\n".join(log_tail(p) for p in procs)


def expect(resp: httpx.Response, status: int, *procs: PlannerProcess) -> Any:
    """The JSON body of a response that must have `status`; otherwise fail with the servers' logs."""
    assert resp.status_code == status, (
        f"{resp.request.method} {resp.request.url} -> {resp.status_code}, expected {status}: {resp.text}\n"
        + logs(*procs)
    )
    return resp.json() if resp.content else None


def metric(client: httpx.Client, name: str) -> float | None:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def poll(condition: Callable[[], bool], what: str, *procs: PlannerProcess, steps: int = 400) -> None:
    """Wait (bounded) until `condition` holds; a wait, not a timing assertion."""
    for _ in range(steps):
        if condition():
            return
        time.sleep(0.025)
    raise AssertionError(f"never happened: {what}\n" + logs(*procs))


def pin(
    client: httpx.Client, prefill: int, decode: int, reason: str, *procs: PlannerProcess
) -> dict[str, Any]:
    """Pin `demo` to `prefill`/`decode` replicas as the operator; the created override."""
    return expect(
        client.post(
            "/override",
            headers=OPER,
            json={
                "deployment": "demo",
                "action": "pin",
                "num_prefill": prefill,
                "num_decode": decode,
                "reason": reason,
            },
        ),
        201,
        *procs,
    )


def acknowledge(
    client: httpx.Client, decision_id: int, prefill: int, decode: int, *procs: PlannerProcess
) -> dict[str, Any]:
    """Complete decision `decision_id` of `demo` as succeeded with the observed replicas."""
    return expect(
        client.post(
            f"/decisions/{decision_id}/complete",
            headers=ORCH,
            json={"status": "succeeded", "observed": {"prefill": prefill, "decode": decode}},
        ),
        200,
        *procs,
    )


def next_decision(
    client: httpx.Client, after: int, *procs: PlannerProcess, timeout_s: float | None = None
) -> dict[str, Any]:
    """Long-poll `GET /decisions/wait` for `demo` as the orchestrator; the decision (200) it returns."""
    params: dict[str, Any] = {"deployment": "demo", "after": after}
    if timeout_s is not None:
        params["timeout_s"] = timeout_s
    return expect(client.get("/decisions/wait", headers=ORCH, params=params), 200, *procs)


def held_wait(pool: Executor, proc: PlannerProcess, after: int, timeout_s: float) -> Future[httpx.Response]:
    """Run a long-poll `GET /decisions/wait` for `demo` on `proc` in `pool`: its response, later."""
    return pool.submit(
        httpx.get,
        f"{proc.base_url}/decisions/wait",
        headers=ORCH,
        params={"deployment": "demo", "after": after, "timeout_s": timeout_s},
        timeout=60,
    )


def start_or_fail(proc: PlannerProcess) -> PlannerProcess:
    """Start `proc`; a failed start fails the test with the tail of its log."""
    try:
        return proc.start()
    except RuntimeError as exc:
        raise AssertionError(f"{exc}\n{log_tail(proc)}") from None


@contextmanager
def planner_starter(database_url: str, workdir: Path) -> Iterator[Callable[..., PlannerProcess]]:
    """A function that starts `planner serve` on `database_url` with the demo config and TOKENS
    (and any `PLANNER_*` variables given to it), logging to `workdir`; every process it started
    is stopped on exit."""
    config = write_config(workdir / "planner.yaml", demo_config())
    procs: list[PlannerProcess] = []

    def start(**extra_env: str) -> PlannerProcess:
        proc = PlannerProcess(
            database_url,
            config,
            tokens=TOKENS,
            extra_env=extra_env,
            log_path=workdir / f"planner-{len(procs)}.log",
        )
        procs.append(proc)
        return start_or_fail(proc)

    try:
        yield start
    finally:
        for proc in procs:
            proc.stop()
