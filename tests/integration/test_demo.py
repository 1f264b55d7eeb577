"""`planner demo` as a real process: the service, the simulated frontend and engines, and the
orchestrator talking over real HTTP and ZMQ, at high speed on a short trace.

The trace steps from 1 to 9 requests/s of 8000-token prompts, which one prefill engine cannot
serve, so the planner must scale prefill up; after the trace it scales back down.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import zmq

from app.core.perf.fpm import ForwardPassMetrics, ScheduledRequestMetrics
from app.sim.demo.live import FpmPublisher
from tests.support import REPO_ROOT, free_port

SPEED = 100.0
# Generous: the suite runs on a loaded 2-core machine.
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 45.0

SCHEDULED_FIELDS = {
    "num_prefill_requests",
    "sum_prefill_tokens",
    "var_prefill_length",
    "sum_prefill_kv_tokens",
    "num_decode_requests",
    "sum_decode_kv_tokens",
    "var_decode_kv_tokens",
}
QUEUED_FIELDS = SCHEDULED_FIELDS - {"sum_prefill_kv_tokens"}


def write_step_trace(path: Path) -> Path:
    """Mooncake JSONL: 1 request/s for 200 s, then 9 requests/s until 800 s (ISL 8000, OSL 50)."""
    lines, t_s = [], 0.0
    while t_s < 800.0:
        lines.append(json.dumps({"timestamp": round(t_s * 1000), "input_length": 8000, "output_length": 50}))
        t_s += 1.0 if t_s < 200.0 else 1.0 / 9.0
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class DemoProcess:
    """A running `planner demo`; its stdout lines are collected by a thread."""

    proc: subprocess.Popen[str]
    stderr_path: Path
    lines: list[str] = field(default_factory=list)
    _new: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._new.put(line)
        self._new.put(None)

    def output(self) -> str:
        stderr = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return "--- stdout ---\n" + "\n".join(self.lines[-40:]) + "\n--- stderr ---\n" + stderr[-4000:]

    def wait_for(self, predicate: Callable[[str], bool], what: str, timeout_s: float) -> str:
        """The first stdout line (already printed or to come) for which `predicate` holds."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if predicate(line):
                    return line
            seen = len(self.lines)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (self.proc.poll() is not None and self._new.empty()):
                raise AssertionError(f"never printed: {what}\n{self.output()}")
            try:
                self._new.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                pass

    def url(self, label: str) -> str:
        """A URL from the 'open:' list, by its label."""
        line = self.wait_for(
            lambda ln: ln.strip().startswith(label + " "), f"the {label} URL", START_TIMEOUT_S
        )
        return line.split()[-1]

    def final_state(self) -> dict[str, Any]:
        for line in reversed(self.lines):
            if line.startswith('{"demo": "stopped"'):
                return json.loads(line)
        raise AssertionError(f"no final JSON line\n{self.output()}")

    def interrupt(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGINT (Ctrl-C) and wait for the exit status."""
        self.proc.send_signal(signal.SIGINT)
        try:
            status = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"planner demo did not stop within {timeout_s} s of SIGINT\n{self.output()}"
            ) from None
        self._drain()
        return status

    def _drain(self) -> None:
        """Wait for the reader thread to have every line of the exited process."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self._new.get(timeout=0.5) is None:
                    return
            except queue.Empty:
                pass

    def wait_exit(self, timeout_s: float) -> int:
        try:
            status = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"planner demo did not exit within {timeout_s} s\n{self.output()}") from None
        self._drain()
        return status


def demo_env() -> dict[str, str]:
    # The demo gives the service its own settings; none of the caller's may leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
    env["PLANNER_LOG_LEVEL"] = "INFO"
    return env


def start_demo(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> DemoProcess:
    stderr_path = tmp_path / "demo.stderr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "demo", *args],
        cwd=REPO_ROOT,
        env={**demo_env(), **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr_path.open("w"),
        text=True,
    )
    return DemoProcess(proc, stderr_path)


def service_pid(demo: DemoProcess) -> int:
    line = demo.wait_for(
        lambda ln: "starting the planner service" in ln, "the service's pid", START_TIMEOUT_S
    )
    return int(line.split("(pid ")[1].split(")")[0])


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # Still there: a zombie counts as gone only once reaped, so look at its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@pytest.fixture
def cleanup() -> Iterator[list[DemoProcess]]:
    """Whatever a failed test leaves running is killed (with its planner service)."""
    demos: list[DemoProcess] = []
    yield demos
    for demo in demos:
        if demo.proc.poll() is None:
            demo.proc.send_signal(signal.SIGINT)
            try:
                demo.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                demo.proc.kill()
                demo.proc.wait()


def receive_fpm(endpoints: list[str], want: int, timeout_s: float) -> list[tuple[str, list[bytes]]]:
    """Up to `want` multipart messages from SUB sockets connected to `endpoints`."""
    context = zmq.Context()
    sockets = []
    try:
        poller = zmq.Poller()
        for endpoint in endpoints:
            sock = context.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(endpoint)
            poller.register(sock, zmq.POLLIN)
            sockets.append((endpoint, sock))
        received: list[tuple[str, list[bytes]]] = []
        roles: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while (len(received) < want or roles != {"prefill", "decode"}) and time.monotonic() < deadline:
            ready = dict(poller.poll(200))
            for endpoint, sock in sockets:
                if sock in ready:
                    parts = sock.recv_multipart()
                    received.append((endpoint, parts))
                    with contextlib.suppress(Exception):  # checked properly by check_fpm_messages
                        roles.add(msgpack.unpackb(parts[2])["worker_id"].split("-")[0])
        return received
    finally:
        for _, sock in sockets:
            sock.close(linger=0)
        context.term()


def check_fpm_messages(received: list[tuple[str, list[bytes]]]) -> None:
    last_seq: dict[str, int] = {}
    for endpoint, parts in received:
        assert len(parts) == 3, parts
        topic, seq_bytes, payload = parts
        assert topic == b""
        assert len(seq_bytes) == 8
        seq = int.from_bytes(seq_bytes, "big")
        # Per socket the sequence increases (the subscriber may miss some: SUB drops at its HWM).
        assert seq > last_seq.get(endpoint, -1), (endpoint, seq, last_seq)
        last_seq[endpoint] = seq
        record = msgpack.unpackb(payload)
        assert set(record) == {"worker_id", "dp_rank", "wall_time", "scheduled_requests", "queued_requests"}
        assert record["worker_id"].split("-")[0] in ("prefill", "decode"), record
        assert record["dp_rank"] == 0
        assert isinstance(record["wall_time"], float) and record["wall_time"] >= 0
        assert set(record["scheduled_requests"]) == SCHEDULED_FIELDS
        assert set(record["queued_requests"]) == QUEUED_FIELDS
    roles = {msgpack.unpackb(parts[2])["worker_id"].split("-")[0] for _, parts in received}
    assert roles == {"prefill", "decode"}, roles


STARTUP_DELAY_S = 120.0  # examples/replay.yaml's simulation.startup_delay_s


def check_engines_at_the_end(final: dict[str, Any]) -> None:
    """The engines when the demo stopped, against what the orchestrator ordered: ready + starting
    is the target of every role; with no decision in flight every engine ordered is up, and a
    decision still in flight was placed less than a start-up delay before the end (its engines
    had no time to start; one older than that would be a stuck orchestrator)."""
    for role, target in final["targets"].items():
        assert final["ready"][role] + final["starting"][role] == target, final
    in_flight = final["in_flight"]
    if in_flight is None:
        assert final["starting"] == {role: 0 for role in final["targets"]}, final
        latest = final["latest_decision"]
        if latest is not None:
            assert final["ready"] == final["targets"] == latest["targets"], final
    else:
        assert final["targets"] == in_flight["targets"], final
        # A few simulated seconds for the orchestrator's poll at speed 100.
        assert final["sim_s"] - in_flight["applied_at_s"] < STARTUP_DELAY_S + 10.0, final


def replicas(decision: dict[str, Any]) -> dict[str, int]:
    return {"prefill": decision["num_prefill"], "decode": decision["num_decode"]}


def quiescent_snapshot(
    planner: httpx.Client, status_url: str, deployment: str, timeout_s: float
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The planner's decisions and the demo's state at a moment when nothing is in flight: the
    decisions did not change while the state was read, and no decision is being applied."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = planner.get("/decisions", params={"deployment": deployment}).json()["items"]
        state = httpx.get(status_url, timeout=10).json()
        after = planner.get("/decisions", params={"deployment": deployment}).json()["items"]
        if before == after and state["in_flight"] is None and after and after[-1]["status"] != "pending":
            return after, state
        time.sleep(0.2)
    raise AssertionError("the demo never settled (a decision was always in flight)")


@pytest.mark.timeout(300)
def test_demo_scales_the_simulated_cluster_over_http_and_zmq(
    tmp_path: Path, cleanup: list[DemoProcess]
) -> None:
    trace = write_step_trace(tmp_path / "step.jsonl")
    port = free_port()
    demo = start_demo(
        tmp_path, "--trace", str(trace), "--speed", str(SPEED), "--rate-scale", "1", "--port", str(port)
    )
    cleanup.append(demo)
    pid = service_pid(demo)
    status_url = demo.url("demo status (JSON)")
    planner_url = demo.url("planner API docs").removesuffix("/docs")
    assert planner_url == f"http://127.0.0.1:{port}"
    frontend = httpx.get(demo.url("simulated frontend"), timeout=10)
    assert frontend.status_code == 200
    assert frontend.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "dynamo_frontend_requests_total" in frontend.text

    # Engines publish FPM over ZMQ on loopback, one endpoint per engine.
    endpoints = httpx.get(status_url, timeout=10).json()["fpm"]["endpoints"]
    assert len(endpoints) == 64  # max_replicas of prefill + decode in examples/replay.yaml
    assert all(e.startswith("tcp://127.0.0.1:") for e in endpoints)
    # Prefill engines take the first 32 ports, decode engines the next 32: two of each.
    received = receive_fpm(endpoints[:2] + endpoints[32:34], want=200, timeout_s=60)
    assert len(received) >= 20, f"only {len(received)} FPM messages\n{demo.output()}"
    check_fpm_messages(received)

    # The planner decides, the orchestrator acknowledges over HTTP, the cluster follows.
    demo.wait_for(lambda ln: ln.startswith("end of the trace"), "the end of the trace", 180)
    with httpx.Client(base_url=planner_url, timeout=10) as planner:
        decisions, state = quiescent_snapshot(planner, status_url, "replay", timeout_s=60)
        acks = planner.get("/metrics").text
    assert max(d["num_prefill"] for d in decisions) >= 2, f"never scaled prefill up: {decisions}"
    assert [d["id"] for d in decisions] == list(range(1, len(decisions) + 1))
    # examples/replay.yaml asks for SLA scaling, which supersedes a decision whose engines are
    # still starting when its wish changes (the orchestrator applies the newest one at once, and
    # may never see one superseded between two of its long-polls). Every other decision is
    # acknowledged with the replicas it asked for, the last one included.
    assert all(d["source"] == "sla" for d in decisions), decisions
    assert all(d["status"] in ("succeeded", "superseded") for d in decisions), decisions
    succeeded = [d for d in decisions if d["status"] == "succeeded"]
    assert succeeded[-1] == decisions[-1]
    for d in succeeded:
        assert d["observed"] == replicas(d), d
        assert d["message"].startswith("planner demo:"), d
    assert state["acks"] == len(succeeded)
    assert len(succeeded) <= state["decisions_applied"] <= len(decisions)
    assert state["last_acked"] == {"id": decisions[-1]["id"], "replicas": replicas(decisions[-1])}
    assert state["ready"] == state["targets"] == replicas(decisions[-1])
    assert state["requests"]["completed"] == state["requests"]["total"] == len(trace.read_text().splitlines())
    assert state["fpm"]["sent"] > 0
    assert (
        f'dynamo_planner_decision_acks_total{{deployment="replay",outcome="accepted"}} {len(succeeded)}.0'
        in acks
    )

    # Ctrl-C: exit 0, the service stopped, the temporary directory removed.
    assert demo.interrupt() == 0, demo.output()
    final = demo.final_state()
    assert final["reason"] == "signal"
    # Stopped by SIGTERM (uvicorn re-raises it after a graceful shutdown), not killed after a timeout.
    assert final["planner"] == "stopped"
    # The planner may order engines between the snapshot above and Ctrl-C (it keeps deciding
    # after the trace): ready or still starting, as the orchestrator left them.
    check_engines_at_the_end(final)
    # The summary was printed once, at the end of the trace, not again at Ctrl-C.
    assert sum(ln.startswith(("end of the trace", "stopped")) for ln in demo.lines) == 1, demo.output()
    assert process_gone(pid)
    assert not Path(final["tmp_dir"]).exists()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{planner_url}/healthz", timeout=5)


@pytest.mark.timeout(240)
def test_demo_stops_after_duration_with_the_bundled_trace(tmp_path: Path, cleanup: list[DemoProcess]) -> None:
    demo = start_demo(
        tmp_path,
        "--speed",
        str(SPEED),
        "--rate-scale",
        "1",
        "--duration-s",
        "400",
        "--port",
        str(free_port()),
    )
    cleanup.append(demo)
    pid = service_pid(demo)
    assert demo.wait_exit(180) == 0, demo.output()
    final = demo.final_state()
    assert final["reason"] == "duration"
    assert final["sim_s"] == 400.0
    assert final["summary"]["sim_s"] == 400.0
    assert 0 < final["requests"]["completed"] <= final["requests"]["arrived"] == final["requests"]["total"]
    if final["latest_decision"] is None:
        # At the trace's own rate the engines it starts with may be right all along: nothing
        # decided, nothing moved.
        assert final["decisions_applied"] == 0
    check_engines_at_the_end(final)
    # The summary says which engines were still starting, as the final state does.
    assert final["summary"]["ready"] == final["ready"]
    assert final["summary"]["starting"] == final["starting"]
    assert any(ln.startswith("--duration-s reached") for ln in demo.lines)
    assert final["planner"] == "stopped"
    assert process_gone(pid)


@pytest.mark.timeout(120)
def test_ctrl_c_during_start_up_leaves_nothing_running(tmp_path: Path, cleanup: list[DemoProcess]) -> None:
    demo = start_demo(tmp_path, "--speed", str(SPEED), "--rate-scale", "1", "--port", str(free_port()))
    cleanup.append(demo)
    pid = service_pid(demo)
    assert demo.interrupt() == 0, demo.output()
    assert process_gone(pid)
    final = demo.final_state()
    assert final["planner"] == "stopped"
    assert not Path(final["tmp_dir"]).exists()
    # Stopped before the trace began: the summary still says so (nothing simulated yet).
    assert any(ln.startswith("stopped by SIGINT before the end of the trace") for ln in demo.lines), (
        demo.output()
    )
    assert final["summary"]["reason"] == "signal"


@pytest.mark.timeout(120)
def test_service_dying_stops_the_demo_with_an_error(tmp_path: Path, cleanup: list[DemoProcess]) -> None:
    demo = start_demo(tmp_path, "--speed", str(SPEED), "--rate-scale", "1", "--port", str(free_port()))
    cleanup.append(demo)
    pid = service_pid(demo)
    demo.url("planner API docs")  # running
    os.kill(pid, signal.SIGKILL)
    assert demo.wait_exit(60) == 1, demo.output()
    stderr = demo.stderr_path.read_text()
    assert "planner: error: the planner service exited with status -9" in stderr, stderr
    final = demo.final_state()
    assert not Path(final["tmp_dir"]).exists()
    assert any(ln.startswith("stopped early (service failed)") for ln in demo.lines), demo.output()
    assert final["summary"]["reason"] == "service_failed"


SIM_COST_S = 0.05  # wall seconds the simulator sleeps per simulated second: at most x20


@pytest.mark.timeout(300)
def test_a_simulator_that_cannot_keep_up_slows_the_clock_and_the_planner_follows(
    tmp_path: Path, cleanup: list[DemoProcess]
) -> None:
    """A deliberately slow simulator (it sleeps SIM_COST_S per simulated second, so it reaches
    at most x20 while --speed asks for x100): the clock slows, which the log says once; the
    frontend answers at once all along, the planner stays ready, its ticks keep their 5 simulated
    seconds and see the trace's own request rate (its clock is the slowed one), its decisions
    follow the step up; SIGTERM before the end still prints the summary."""
    trace = write_step_trace(tmp_path / "step.jsonl")
    demo = start_demo(
        tmp_path,
        *("--trace", str(trace), "--speed", str(SPEED), "--rate-scale", "1", "--port", str(free_port())),
        env={"PLANNER_DEMO_SIM_COST": str(SIM_COST_S)},
    )
    cleanup.append(demo)
    status_url = demo.url("demo status (JSON)")
    frontend_url = demo.url("simulated frontend")
    planner_url = demo.url("planner API docs").removesuffix("/docs")
    assert demo.url("live dashboard") == f"{planner_url}/dashboard"
    assert demo.url("diagnostics report") == f"{planner_url}/diagnostics/report?deployment=replay"
    slowest_answer_s = 0.0
    deadline = time.monotonic() + 150
    with httpx.Client(timeout=10) as client:
        while True:
            started = time.monotonic()
            assert client.get(frontend_url).status_code == 200
            slowest_answer_s = max(slowest_answer_s, time.monotonic() - started)
            ready = client.get(f"{planner_url}/readyz")
            assert ready.status_code == 200, ready.text
            state = client.get(status_url).json()
            if state["sim_s"] >= 450:
                break
            assert time.monotonic() < deadline, f"the simulation stalled at {state['sim_s']}\n{demo.output()}"
            time.sleep(0.5)
        ticks = client.get(
            f"{planner_url}/diagnostics", params={"deployment": "replay", "limit": 1000}
        ).json()
        decisions = client.get(f"{planner_url}/decisions", params={"deployment": "replay"}).json()["items"]
    assert slowest_answer_s < 2.0, slowest_answer_s
    assert state["clock_slowdowns"] >= 1, state
    stderr = demo.stderr_path.read_text()
    assert stderr.count("the simulator cannot keep up with speed x100") == 1, stderr[-3000:]

    # The planner's time is the simulator's: ticks 5 simulated seconds apart, and the trace's rate.
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    sla_ticks = [
        ((datetime.fromisoformat(t["at"]) - epoch).total_seconds(), t["record"])
        for t in ticks["items"]
        if t["record"]["sla"] is not None
    ]
    at_s = [at for at, _ in sla_ticks]
    gaps = sorted(b - a for a, b in zip(at_s, at_s[1:], strict=False))
    assert 4.0 <= gaps[len(gaps) // 2] <= 6.0, gaps
    observed = [(at, r["traffic"]["observed"]) for at, r in sla_ticks if at > 20 and r["traffic"]["observed"]]
    assert all(r["traffic"]["error"] is None for at, r in sla_ticks if at > 20), sla_ticks
    before = [o["num_req"] / o["duration_s"] for at, o in observed if 30 < at < 190]
    after = [o["num_req"] / o["duration_s"] for at, o in observed if 230 < at < 440]
    assert before and after, observed
    assert 0.7 <= statistics.mean(before) <= 1.3, before  # 1 request/s
    assert 7.0 <= statistics.mean(after) <= 11.0, after  # 9 requests/s
    # Decisions follow the step: prefill scaled up after it.
    created_s = [(datetime.fromisoformat(d["created_at"]) - epoch).total_seconds() for d in decisions]
    assert any(s > 200 and d["num_prefill"] >= 2 for s, d in zip(created_s, decisions, strict=True)), (
        decisions
    )

    demo.proc.send_signal(signal.SIGTERM)
    assert demo.wait_exit(STOP_TIMEOUT_S) == 0, demo.output()
    final = demo.final_state()
    assert final["reason"] == "signal"
    assert any(ln.startswith("stopped by SIGTERM before the end of the trace") for ln in demo.lines), (
        demo.output()
    )
    assert final["summary"]["reason"] == "signal"
    assert final["summary"]["clock_slowdowns"] >= 1
    # At most x20 simulated, and the clock slowed to less than that at least once.
    assert final["summary"]["slowest_clock_rate"] < 20.0, final["summary"]
    check_engines_at_the_end(final)


# --- the FPM publisher alone (real sockets, in-process) --------------------------------------------


def fpm_record(worker_id: str) -> ForwardPassMetrics:
    return ForwardPassMetrics(worker_id, 0, 0.02, ScheduledRequestMetrics(num_decode_requests=3))


def test_publisher_engines_take_the_lowest_free_slot_of_their_role() -> None:
    publisher = FpmPublisher({"prefill": 2, "decode": 1})
    try:
        base = publisher.base_port
        assert publisher.endpoints == [f"tcp://127.0.0.1:{base + n}" for n in range(3)]
        assert publisher.endpoints_by_role == {
            "prefill": [f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 1}"],
            "decode": [f"tcp://127.0.0.1:{base + 2}"],
        }
        for engine in ("prefill-1", "decode-1"):
            publisher.publish(fpm_record(engine))
        assert publisher.endpoint_of("prefill-1") == f"tcp://127.0.0.1:{base}"
        assert publisher.endpoint_of("decode-1") == f"tcp://127.0.0.1:{base + 2}"
        publisher.release_stopped({"decode-1"})  # prefill-1 stopped: its port is free again
        publisher.publish(fpm_record("prefill-2"))
        publisher.publish(fpm_record("prefill-3"))
        publisher.publish(fpm_record("prefill-4"))  # more prefill engines than slots: counted, not sent
        publisher.publish(fpm_record("decode-2"))  # the decode slot is taken
        assert publisher.endpoint_of("prefill-1") is None
        assert publisher.endpoint_of("prefill-2") == f"tcp://127.0.0.1:{base}"
        assert publisher.endpoint_of("prefill-3") == f"tcp://127.0.0.1:{base + 1}"
        assert (publisher.sent, publisher.dropped, publisher.unplaced) == (4, 0, 2)
    finally:
        publisher.close()


def test_publisher_never_blocks_on_a_slow_subscriber() -> None:
    """A subscriber that reads nothing fills the queues; then messages are dropped and counted."""
    publisher = FpmPublisher({"decode": 1}, sndhwm=100)
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVHWM, 100)
        sub.connect(publisher.endpoints[0])
        deadline = time.monotonic() + 30
        while publisher.sent == 0 or sub.poll(0) == 0:  # connected and subscribed
            assert time.monotonic() < deadline, "the subscriber never received anything"
            publisher.publish(fpm_record("decode-1"))
            time.sleep(0.01)
        # Publishing returns whatever the subscriber reads (a blocking publish would hang here,
        # and the test's timeout would end it): the excess is dropped and counted.
        for _ in range(50_000):  # more than the HWMs and the loopback socket buffers hold
            publisher.publish(fpm_record("decode-1"))
        assert publisher.dropped > 0
        assert publisher.sent + publisher.dropped >= 50_000
    finally:
        sub.close(linger=0)
        context.term()
        publisher.close()


@dataclass(frozen=True)
class BadInput:
    name: str
    args: tuple[str, ...]
    message: str  # the start of the one stderr line


BAD_INPUTS = [
    BadInput("missing_trace", ("--trace", "/nonexistent/trace.csv"), "planner: error: --trace: /nonexistent"),
    BadInput("bad_trace", ("--trace", "tests/data/traces/bad_azure_tokens.csv"), "planner: error: --trace: "),
    BadInput(
        "missing_config", ("--config", "/nonexistent/replay.yaml"), "planner: error: /nonexistent/replay.yaml"
    ),
    BadInput("zero_speed", ("--speed", "0"), "planner: error: argument --speed: must be a number > 0"),
    BadInput(
        "bad_rate_scale", ("--rate-scale", "x"), "planner: error: argument --rate-scale: must be a number"
    ),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda c: c.name)
def test_bad_input_is_one_line_and_status_2(case: BadInput, tmp_path: Path) -> None:
    args = list(case.args)
    if case.name == "missing_config":
        args += ["--port", str(free_port())]
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "demo", *args],
        cwd=REPO_ROOT,
        env=demo_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith(case.message), done.stderr
    assert done.stdout == ""


def test_bad_config_names_the_field(tmp_path: Path) -> None:
    config = (
        (REPO_ROOT / "examples" / "replay.yaml")
        .read_text()
        .replace("startup_delay_s: 120", "startup_delay_s: -1")
    )
    path = tmp_path / "replay.yaml"
    path.write_text(config.replace("../data/", str(REPO_ROOT / "data") + "/"))
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "demo", "--config", str(path)],
        cwd=REPO_ROOT,
        env=demo_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"planner: error: {path}: simulation.startup_delay_s: Input should be greater than or equal to 0"
    ]


def test_port_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "app.cli",
                "demo",
                "--port",
                str(port),
                "--trace",
                "tests/data/traces/azure_small.csv",
            ],
            cwd=REPO_ROOT,
            env=demo_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"planner: error: --port: 127.0.0.1:{port} is not free (Address already in use)"
    ]
