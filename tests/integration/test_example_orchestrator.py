"""The shipped example orchestrator works against a real planner process, as the README says, and
survives the planner going away under it: killed, stopped, restarted, answering 5xx or 429 (it
retries with backoff, honouring Retry-After), and its own restarts (it resumes after the last
decision it applied, from its state file, never applying one twice). Answers retrying cannot fix
stop it with one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import (
    ORCH,
    TOKENS,
    VIEWER,
    PlannerProcess,
    SqliteDatabases,
    demo_config,
    expect,
    free_port,
    pin,
    start_or_fail,
    write_config,
)
from tests.support import REPO_ROOT as ROOT

ORCHESTRATOR = str(ROOT / "examples" / "orchestrator.py")
ORCH_TOKEN = ORCH["Authorization"].removeprefix("Bearer ")


def _run_orchestrator(planner: PlannerProcess, command: str, after: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            ORCHESTRATOR,
            "--url",
            planner.base_url,
            "--deployment",
            "demo",
            "--after",
            str(after),
            "--command",
            command,
            "--once",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_example_orchestrator_applies_and_acknowledges(db_url, tmp_path):
    config = write_config(tmp_path / "planner.yaml", demo_config())
    planner = PlannerProcess(db_url, config, log_path=tmp_path / "planner.log").start()
    try:
        with httpx.Client(base_url=planner.base_url, timeout=10) as client:
            pin = {
                "deployment": "demo",
                "action": "pin",
                "num_prefill": 3,
                "num_decode": 5,
                "reason": "readme",
            }
            assert client.post("/override", json=pin).status_code == 201

            done = _run_orchestrator(planner, "test {prefill} -eq 3", after=0)
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith("decision 1: succeeded")
            first = client.get("/decisions/1").json()
            assert (first["status"], first["observed"]) == ("succeeded", {"prefill": 3, "decode": 5})

            assert client.post("/override", json={**pin, "num_prefill": 4}).status_code == 201
            done = _run_orchestrator(planner, "test {prefill} -eq 3", after=1)
            assert done.returncode == 0, done.stderr
            second = client.get("/decisions/2").json()
            assert (second["status"], second["observed"]) == ("failed", None)
    finally:
        planner.stop()


# --- a long-running orchestrator under a planner that goes away ----------------------------------------


class Orchestrator:
    """The example orchestrator as a long-running process; its command appends
    `<id> <prefill> <decode>` to `applied`."""

    def __init__(self, workdir: Path, urls: list[str], *extra: str, name: str = "orchestrator") -> None:
        self.applied = workdir / "applied.txt"
        self.out_path, self.err_path = workdir / f"{name}.out", workdir / f"{name}.err"
        argv = [sys.executable, ORCHESTRATOR, "--deployment", "demo", "--token", ORCH_TOKEN]
        for url in urls:
            argv += ["--url", url]
        argv += ["--command", f"sh -c 'echo {{id}} {{prefill}} {{decode}} >> {self.applied}'"]
        argv += ["--wait-s", "2", "--max-backoff-s", "0.5", *extra]
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True)

    def applied_ids(self) -> list[int]:
        if not self.applied.exists():
            return []
        return [int(line.split()[0]) for line in self.applied.read_text().splitlines() if line.strip()]

    @property
    def out(self) -> str:
        return self.out_path.read_text()

    @property
    def err(self) -> str:
        return self.err_path.read_text()

    def wait_applied(self, ids: list[int], *procs: PlannerProcess) -> None:
        """Until the command ran for exactly `ids` and the last one was acknowledged (the
        orchestrator prints its line after the acknowledgement)."""
        deadline = time.monotonic() + 60
        while self.applied_ids() != ids or f"decision {ids[-1]}: " not in self.out:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                logs = "\n".join(p.log_path.read_text() for p in procs if p.log_path)
                raise AssertionError(
                    f"applied {self.applied_ids()}, expected {ids}; exit {self.proc.poll()}\n"
                    f"{self.out}\n{self.err}\n{logs}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def planner_on(sqlite_dbs: SqliteDatabases, tmp_path: Path) -> Iterator[Callable[..., PlannerProcess]]:
    """Start `planner serve` on this test's database (on a given port, to restart one in place).
    SQLite only: what is tested is the orchestrator's side (two replicas on PostgreSQL:
    tests/integration/test_failover.py)."""
    db_url = sqlite_dbs.fresh()
    config = write_config(tmp_path / "planner.yaml", demo_config())
    procs: list[PlannerProcess] = []

    def start(port: int | None = None) -> PlannerProcess:
        proc = PlannerProcess(db_url, config, tokens=TOKENS, log_path=tmp_path / f"planner-{len(procs)}.log")
        if port is not None:
            proc.port = port
        procs.append(proc)
        return start_or_fail(proc)

    yield start
    for proc in procs:
        proc.stop()
    sqlite_dbs.drop(db_url)


@pytest.fixture
def orchestrators() -> Iterator[list[Orchestrator]]:
    started: list[Orchestrator] = []
    yield started
    for orchestrator in started:
        orchestrator.stop()


def decision(client: httpx.Client, decision_id: int) -> dict[str, Any]:
    return expect(client.get(f"/decisions/{decision_id}", headers=VIEWER), 200)


def test_it_rides_out_a_killed_and_a_stopped_planner(
    planner_on: Callable[..., PlannerProcess], orchestrators: list[Orchestrator], tmp_path: Path
) -> None:
    first = planner_on()
    state_file = tmp_path / "state.json"
    orch = Orchestrator(tmp_path, [first.base_url], "--state-file", str(state_file))
    orchestrators.append(orch)
    with httpx.Client(base_url=first.base_url, timeout=10) as client:
        pin(client, 2, 2, "one", first)
        orch.wait_applied([1], first)
        assert decision(client, 1)["status"] == "succeeded"
    assert json.loads(state_file.read_text())["last_applied"] == 1

    # SIGKILL while the orchestrator holds a long-poll; a new process on the same port.
    first.kill()
    time.sleep(1.0)  # it retries against nothing meanwhile
    second = planner_on(first.port)
    with httpx.Client(base_url=second.base_url, timeout=10) as client:
        pin(client, 3, 3, "two", second)
        orch.wait_applied([1, 2], second)
        assert decision(client, 2)["status"] == "succeeded"

    # A graceful stop (SIGTERM) with a long-poll held, then a restart.
    second.stop()
    third = planner_on(first.port)
    with httpx.Client(base_url=third.base_url, timeout=10) as client:
        pin(client, 4, 4, "three", third)
        orch.wait_applied([1, 2, 3], third)
        assert [decision(client, i)["status"] for i in (1, 2, 3)] == ["succeeded"] * 3
    assert orch.proc.poll() is None, orch.err
    assert "unreachable" in orch.err, orch.err
    assert orch.out.splitlines() == [f"decision {i}: succeeded (exit status 0)" for i in (1, 2, 3)]


def test_a_restarted_orchestrator_resumes_after_the_last_decision_it_applied(
    planner_on: Callable[..., PlannerProcess], orchestrators: list[Orchestrator], tmp_path: Path
) -> None:
    planner = planner_on()
    state_file = tmp_path / "state.json"
    with httpx.Client(base_url=planner.base_url, timeout=10) as client:
        pin(client, 2, 2, "one", planner)
        orch = Orchestrator(tmp_path, [planner.base_url], "--state-file", str(state_file), name="first")
        orchestrators.append(orch)
        orch.wait_applied([1], planner)
        orch.stop()

        # Decision 2 comes while no orchestrator runs; the restarted one applies 2, not 1 again.
        pin(client, 3, 3, "two", planner)
        orch = Orchestrator(tmp_path, [planner.base_url], "--state-file", str(state_file), name="second")
        orchestrators.append(orch)
        orch.wait_applied([1, 2], planner)
        orch.stop()

        # A crash after applying decision 3 but before acknowledging it (the state file says so):
        # the restarted orchestrator acknowledges it without applying it again.
        pin(client, 4, 4, "three", planner)
        state_file.write_text(
            json.dumps(
                {
                    "deployment": "demo",
                    "last_applied": 3,
                    "acknowledged": False,
                    "status": "succeeded",
                    "observed": {"prefill": 4, "decode": 4},
                    "message": "applied before the crash",
                }
            )
        )
        orch = Orchestrator(tmp_path, [planner.base_url], "--state-file", str(state_file), name="third")
        orchestrators.append(orch)
        deadline = time.monotonic() + 30
        while decision(client, 3)["status"] == "pending":
            assert time.monotonic() < deadline and orch.proc.poll() is None, orch.err
            time.sleep(0.05)
        three = decision(client, 3)
        assert (three["status"], three["message"]) == ("succeeded", "applied before the crash")
        pin(client, 5, 5, "four", planner)
        orch.wait_applied([1, 2, 4], planner)
        orch.stop()
        assert json.loads(state_file.read_text())["last_applied"] == 4

        # Without a state file nor --after it starts from the planner's latest decision: nothing
        # to do while that one is settled, a pending one is applied.
        orch = Orchestrator(tmp_path, [planner.base_url], name="fourth")
        orchestrators.append(orch)
        time.sleep(1.0)
        assert orch.applied_ids() == [1, 2, 4]
        pin(client, 6, 6, "five", planner)
        orch.wait_applied([1, 2, 4, 5], planner)
        orch.stop()

        # Told to start further back, it is handed decision 5, already acknowledged: only a
        # pending decision is applied.
        orch = Orchestrator(tmp_path, [planner.base_url], "--after", "3", name="fifth")
        orchestrators.append(orch)
        deadline = time.monotonic() + 30
        while "decision 5 is succeeded: not applied" not in orch.err:
            assert time.monotonic() < deadline and orch.proc.poll() is None, orch.err
            time.sleep(0.05)
        assert orch.applied_ids() == [1, 2, 4, 5]


def test_it_moves_to_the_next_url_when_one_is_down(
    planner_on: Callable[..., PlannerProcess], orchestrators: list[Orchestrator], tmp_path: Path
) -> None:
    planner = planner_on()
    with httpx.Client(base_url=planner.base_url, timeout=10) as client:
        pin(client, 2, 2, "one", planner)
    # The first URL refuses connections (nothing listens there).
    dead = f"http://127.0.0.1:{free_port()}"
    orch = Orchestrator(tmp_path, [f"{dead},{planner.base_url}"], "--after", "0")
    orchestrators.append(orch)
    orch.wait_applied([1], planner)
    assert f"planner {dead} unreachable" in orch.err, orch.err
    assert f"trying {planner.base_url}" in orch.err, orch.err


@pytest.mark.parametrize(
    "case",
    [
        pytest.param({"token": "wrong-token-123", "status": "401"}, id="401-bad-token"),
        pytest.param({"deployment": "nope", "status": "404"}, id="404-unknown-deployment"),
    ],
)
def test_an_answer_retrying_cannot_fix_stops_it_with_one_line(
    planner_on: Callable[..., PlannerProcess], case: dict[str, str]
) -> None:
    planner = planner_on()
    done = subprocess.run(
        [
            sys.executable,
            ORCHESTRATOR,
            "--url",
            planner.base_url,
            "--deployment",
            case.get("deployment", "demo"),
            "--token",
            case.get("token", ORCH_TOKEN),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("orchestrator: GET ") and f"answered {case['status']}: " in lines[0], lines


# --- retry policy against a scripted server -------------------------------------------------------------


class Scripted:
    """A loopback server that answers each (method, path) with the next of its scripted answers
    ((status, headers, body)), the last one repeated; it records when each request came."""

    def __init__(self, script: dict[tuple[str, str], list[tuple[int, dict[str, str], Any]]]) -> None:
        self.script = {key: list(answers) for key, answers in script.items()}
        self.requests: list[tuple[float, str, str]] = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                path = self.path.split("?")[0]
                scripted.requests.append((time.monotonic(), self.command, path))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                answers = scripted.script.get((self.command, path)) or [(404, {}, {"detail": "no such path"})]
                status, headers, body = answers.pop(0) if len(answers) > 1 else answers[0]
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer  # noqa: N815 (http.server's names)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def times(self, method: str, path: str) -> list[float]:
        return [t for t, m, p in self.requests if (m, p) == (method, path)]

    def __enter__(self) -> Scripted:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


DECISION = {
    "id": 7,
    "deployment": "demo",
    "num_prefill": 2,
    "num_decode": 3,
    "num_workers": None,
    "status": "pending",
}
BUSY = {"detail": "shutting down"}


def test_5xx_and_429_are_retried_honouring_retry_after(tmp_path: Path) -> None:
    script = {
        ("GET", "/decisions/wait"): [
            (500, {}, BUSY),  # a held long-poll cut by a graceful shutdown
            (429, {"Retry-After": "1"}, {"detail": "too many waiters"}),
            (503, {"Retry-After": "1"}, BUSY),
            (200, {}, DECISION),
        ],
        ("POST", "/decisions/7/complete"): [
            (502, {}, None),
            (503, {"Retry-After": "1"}, BUSY),
            (200, {}, {**DECISION, "status": "succeeded"}),
        ],
    }
    with Scripted(script) as server:
        done = subprocess.run(
            [sys.executable, ORCHESTRATOR, "--url", server.url, "--after", "6", "--once"]
            + ["--max-backoff-s", "0.4"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    printed = "printed only: {'prefill': 2, 'decode': 3, 'workers': None}"
    assert done.stdout == f"decision 7: succeeded ({printed})\n"
    waits, acks = server.times("GET", "/decisions/wait"), server.times("POST", "/decisions/7/complete")
    assert len(waits) == 4 and len(acks) == 3, server.requests
    gaps = [b - a for a, b in zip(waits, waits[1:], strict=False)]
    # After the 500 a backoff under the 0.4 s cap (as the orchestrator says it chose: the wall
    # clock of a busy machine says nothing of it); after 429 and 503 their Retry-After of 1 s.
    delays = [float(d) for d in re.findall(r"retrying .* in ([0-9.]+) s", done.stderr)]
    assert len(delays) == 5 and delays[0] <= 0.4, done.stderr
    assert gaps[1] >= 1.0 and gaps[2] >= 1.0, gaps
    assert acks[2] - acks[1] >= 1.0, acks


@pytest.mark.parametrize("status", [401, 403, 404, 422])
def test_a_4xx_on_acknowledge_stops_it_with_one_line(tmp_path: Path, status: int) -> None:
    script = {
        ("GET", "/decisions/wait"): [(200, {}, DECISION)],
        ("POST", "/decisions/7/complete"): [(status, {}, {"detail": "body.status: not a status"})],
    }
    with Scripted(script) as server:
        done = subprocess.run(
            [sys.executable, ORCHESTRATOR, "--url", server.url, "--after", "6"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert done.stderr == (
        f"orchestrator: POST {server.url}/decisions/7/complete answered {status}: body.status: not a status\n"
    )
