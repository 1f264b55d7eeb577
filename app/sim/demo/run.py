"""`planner demo`: the real service against a simulated cluster, in accelerated real time.

The demo process runs:
- the simulated cluster (`app/sim/world/cluster.py`) replaying a trace, in a thread of its own
  (`app/sim/demo/realtime.py`) that advances it in bounded slices on the **simulated clock**: a
  `SharedClockWriter` file the planner service reads too (`PLANNER_CLOCK_FILE`), running
  --speed simulated seconds per wall second, slower (said once in the log) while the simulator
  cannot keep up, so the planner always sees the traffic the trace has;
- the simulated frontend's `/metrics` (and the demo's `/status`) on a loopback port, in a thread
  of its own, answered from the simulator's latest snapshot, so a slow step never delays them;
- one ZMQ publisher per engine sending its ForwardPassMetrics every iteration
  (`sources.fpm_endpoints`);
- an orchestrator that long-polls the planner for decisions, orders the engines, and
  acknowledges once they are up (the event loop of the main thread).

The planner itself is `planner serve` in a child process with an SQLite database in a temporary
directory and a deployments file generated from the replay config; on the shared clock its 5 s
ticks and its ack timeout pass in simulated seconds, and every time its API shows is simulated:
`SIM_EPOCH` (2000-01-01T00:00:00Z) is the start of the trace.

Output: the URLs to open (the dashboard first), a status line every STATUS_EVERY_S wall seconds,
a summary when the trace or --duration-s ends, or when the demo stops before (Ctrl-C, SIGTERM, a
failure), and at exit one JSON line (`{"demo": "stopped", ...}`) with the final state.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.config import REPO_ROOT, ConfigError, DeploymentConfig, load_deployments
from app.core.traces import TraceRequest
from app.sim.demo.live import FpmPublisher, HttpEndpoint, Orchestrator, PlannerService, ServiceError
from app.sim.demo.realtime import PROMETHEUS_TEXT, SimulationThread
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, ReplayConfig, load_replay_config, with_overrides
from app.sim.replay.oracle import required_engines
from app.sim.replay.run import load_models, load_requests
from app.sim.world.cluster import ROLES, Cluster
from app.sim.world.truth import TruthModel
from app.workers.clock import SIM_EPOCH, SharedClockWriter

log = logging.getLogger(__name__)

DEFAULT_TRACE = REPO_ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
DEFAULT_SPEED = 10.0
# The bundled trace at its own rate fits on one engine of each role; 30× makes scaling matter.
DEFAULT_RATE_SCALE = 30.0
DEFAULT_PORT = 8080

STATUS_EVERY_S = 5.0  # wall seconds between status lines
READY_TIMEOUT_S = 90.0  # wall seconds for `planner serve` to migrate, scrape and tick once
STOP_TIMEOUT_S = 10.0  # wall seconds for the service to stop on SIGTERM before it is killed
SIM_STOP_TIMEOUT_S = 10.0  # wall seconds for the simulator thread to finish its slice
# Test knob: wall seconds the simulator sleeps per simulated second (a deliberately slow step).
SIM_COST_ENV = "PLANNER_DEMO_SIM_COST"


@dataclass(frozen=True)
class DemoOptions:
    config: Path = DEFAULT_REPLAY_CONFIG
    trace: Path = DEFAULT_TRACE
    speed: float = DEFAULT_SPEED
    rate_scale: float = DEFAULT_RATE_SCALE
    port: int = DEFAULT_PORT
    exit_at_end: bool = False
    duration_s: float | None = None  # stop after this many simulated seconds
    modes: tuple[str, ...] | None = None  # the planner's scaling modes; None: the file's
    log_level: str = "INFO"  # the service's PLANNER_LOG_LEVEL
    sim_cost_s: float = 0.0  # extra wall seconds per simulated second (tests: $PLANNER_DEMO_SIM_COST)


@dataclass
class DemoPlan:
    """Everything read and validated before anything starts (bad input: one line, exit 2)."""

    options: DemoOptions
    replay: ReplayConfig
    requests: list[TraceRequest]
    truth: TruthModel
    profile_dir: Path
    initial: dict[str, int]

    @property
    def deployment(self) -> DeploymentConfig:
        return self.replay.deployment


def prepare(options: DemoOptions) -> DemoPlan:
    """Read the replay config, the trace and the profile; ConfigError names what is wrong."""
    if not (math.isfinite(options.speed) and options.speed > 0):
        raise ConfigError(f"--speed: must be a number > 0, got {options.speed!r}")
    if not (math.isfinite(options.sim_cost_s) and options.sim_cost_s >= 0):
        raise ConfigError(f"{SIM_COST_ENV}: must be a number >= 0, got {options.sim_cost_s!r}")
    replay = with_overrides(
        load_replay_config(options.config), rate_scale=options.rate_scale, modes=options.modes
    )
    deployment = replay.deployment
    profile_dir = replay.resolve(deployment.profile or "")
    _, truth = load_models(replay)
    requests = load_requests(replay, Path(options.trace))
    if options.duration_s is not None:
        # Requests after the stop would never arrive: leave them out of the totals.
        requests = [r for r in requests if r.arrival_s <= options.duration_s]
    if not requests:
        raise ConfigError(f"--trace: {options.trace}: no requests before --duration-s {options.duration_s}")
    sim = replay.simulation
    # Start warm, as the replay does: the engines the oracle finds the first minute needs (a
    # cold 1 + 1 at 30x the trace's rate builds a backlog that takes minutes to drain).
    first = required_engines(
        [r for r in requests if r.arrival_s < sim.oracle.interval_s],
        truth,
        interval_s=sim.oracle.interval_s,
        ttft_target_ms=deployment.sla.ttft_ms,
        itl_target_ms=deployment.sla.itl_ms,
        quantile=sim.oracle.quantile,
    )
    initial = {role: max(1, counts[0] if counts else 1) for role, counts in first.items()}
    if sim.initial_prefill is not None:
        initial["prefill"] = sim.initial_prefill
    if sim.initial_decode is not None:
        initial["decode"] = sim.initial_decode
    return DemoPlan(options, replay, requests, truth, profile_dir.resolve(), initial)


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    reserve_port(port, host).close()


def reserve_port(port: int, host: str = "127.0.0.1") -> socket.socket:
    """Hold `port` for the planner service: bound and listening, so that no other bind takes it
    (the demo's own 64 FPM ports and its frontend come up first, and once took the port a test
    had picked), until it is closed just before the service starts. ConfigError if it is busy."""
    if not 1 <= port <= 65535:
        raise ConfigError(f"--port: must be between 1 and 65535, got {port}")
    sock = socket.socket()
    # As the server will (uvicorn sets SO_REUSEADDR): connections of an earlier run lingering in
    # TIME_WAIT do not make the port busy.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"--port: {host}:{port} is not free ({exc.strerror})") from None
    return sock


def service_deployments_file(
    plan: DemoPlan, *, frontend_url: str, fpm_endpoints: dict[str, list[str]]
) -> dict[str, Any]:
    """The replay config's deployment as `planner serve` reads it: absolute paths, the virtual
    connector (the demo's orchestrator), and the simulated frontend and engines as sources."""
    deployment = plan.deployment
    raw = deployment.model_dump(mode="json", exclude_none=True)
    raw["profile"] = str(plan.replay.resolve(deployment.profile or "").resolve())
    if deployment.throughput.warmup_trace:
        raw["throughput"]["warmup_trace"] = str(
            plan.replay.resolve(deployment.throughput.warmup_trace).resolve()
        )
    raw["connector"] = {"type": "virtual", "ack_timeout_s": deployment.connector.ack_timeout_s}
    raw["model_name"] = model_name(deployment)
    raw["sources"] = {"frontend_url": frontend_url, "fpm_endpoints": fpm_endpoints}
    return {"deployments": [raw]}


def model_name(deployment: DeploymentConfig) -> str:
    return deployment.model_name or deployment.name


def _clock_text(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Demo:
    """One demo run; `run()` returns the exit status."""

    def __init__(self, plan: DemoPlan, *, out: Callable[[str], None] | None = None) -> None:
        self.plan = plan
        self.options = plan.options
        self.out = out or (lambda line: print(line, flush=True))
        deployment = plan.deployment
        self._slots = {role: deployment.role(role).max_replicas for role in ROLES}
        self.publisher: FpmPublisher | None = None
        self.cluster: Cluster | None = None
        self.sim: SimulationThread | None = None
        self.clock: SharedClockWriter | None = None
        self.frontend = HttpEndpoint({"/metrics": self._metrics, "/status": self._status_json})
        self.service: PlannerService | None = None
        self.orchestrator: Orchestrator | None = None
        self.tmp_dir: Path | None = None
        self._wall_started = time.monotonic()
        self.end_reason: str | None = None  # "end_of_trace" or "duration", once the simulation reached it
        self.stop_reason = "stopped"
        self.stop_signal: str | None = None  # SIGINT or SIGTERM, when one stopped the demo
        self.summary: dict[str, Any] | None = None

    # --- the simulated clock ---------------------------------------------------------------

    def sim_now(self) -> float:
        """Simulated seconds: the shared clock the planner service reads too."""
        if self.clock is None:
            return 0.0
        now = self.clock.sim_s()
        duration = self.options.duration_s
        return min(now, duration) if duration is not None else now

    # --- HTTP: the frontend's /metrics and the demo's /status (the endpoint's own thread) -----

    def _metrics(self) -> tuple[str, bytes]:
        assert self.sim is not None
        return PROMETHEUS_TEXT, self.sim.snapshot.metrics

    def _status_json(self) -> tuple[str, bytes]:
        return "application/json", json.dumps(self.state()).encode()

    def state(self) -> dict[str, Any]:
        """The demo's state as JSON-able data: `/status` and the final line. Read from the
        simulator's latest snapshot, so any thread may call it."""
        snap = self.sim.snapshot if self.sim else None
        orchestrator = self.orchestrator.state if self.orchestrator else None
        last_acked = orchestrator.last_acked if orchestrator else None
        in_flight = orchestrator.in_flight if orchestrator else None
        latest = orchestrator.latest if orchestrator else None
        return {
            "sim_s": round(snap.sim_s, 3) if snap else 0.0,
            "speed": self.options.speed,
            # The simulated clock's rate now: --speed, or less while the simulator cannot keep up.
            "clock_rate": round(snap.clock_rate, 3) if snap else None,
            "clock_slowdowns": self.sim.slowdowns if self.sim else 0,
            "ready": dict(snap.ready) if snap else {},
            # Ordered and not serving yet (ready + starting = targets), and draining.
            "starting": dict(snap.starting) if snap else {},
            "draining": dict(snap.draining) if snap else {},
            "billed": dict(snap.billed) if snap else {},
            "targets": dict(snap.targets) if snap else {},
            "last_acked": {"id": last_acked.id, "replicas": last_acked.targets} if last_acked else None,
            "in_flight": (
                {
                    "id": in_flight.id,
                    "targets": in_flight.targets,
                    "applied_at_s": round(in_flight.applied_at_s, 3),
                }
                if in_flight
                else None
            ),
            "latest_decision": (
                {"id": latest.id, "targets": latest.targets, "status": latest.status} if latest else None
            ),
            "decisions_applied": len(orchestrator.applied) if orchestrator else 0,
            "acks": orchestrator.acks if orchestrator else 0,
            "requests": {
                "total": snap.requests_total if snap else len(self.plan.requests),
                "arrived": snap.arrived if snap else 0,
                "completed": snap.completed if snap else 0,
            },
            "fpm": {
                "sent": snap.fpm_sent if snap else 0,
                "dropped": snap.fpm_dropped if snap else 0,
                "unplaced": snap.fpm_unplaced if snap else 0,
                "endpoints": self.publisher.endpoints if self.publisher else [],
            },
            "ended": self.end_reason or (snap.ended if snap else None),
            # Wall seconds inside cluster.run_until, and CPU seconds of the whole demo process.
            "sim_busy_s": round(snap.busy_s, 3) if snap else 0.0,
            "sim_longest_step_s": round(self.sim.longest_slice_s, 3) if self.sim else 0.0,
            "cpu_s": round(time.process_time(), 3),
            "planner_url": self.service.base_url if self.service else None,
            "planner_pid": self.service.pid if self.service else None,
            "tmp_dir": str(self.tmp_dir) if self.tmp_dir else None,
        }

    # --- terminal output --------------------------------------------------------------------

    def _print_urls(self) -> None:
        assert self.service is not None and self.publisher is not None
        api, name = self.service.base_url, self.plan.deployment.name
        endpoints = self.publisher.endpoints
        o = self.options
        lines = [
            f"planner demo: deployment {name!r}, trace {o.trace.name} × {o.rate_scale:g} "
            f"({len(self.plan.requests):,} requests), speed ×{o.speed:g}",
            "",
            "open:",
            f"  live dashboard       {api}/dashboard",
            f"  diagnostics report   {api}/diagnostics/report?deployment={name}",
            f"  planner API docs     {api}/docs",
            f"  decisions            {api}/decisions?deployment={name}",
            f"  ticks (diagnostics)  {api}/diagnostics?deployment={name}&limit=5",
            f"  deployment state     {api}/deployments/{name}",
            f"  planner metrics      {api}/metrics",
            f"  simulated frontend   {self.frontend.url('/metrics')}",
            f"  demo status (JSON)   {self.frontend.url('/status')}",
            f"  engine FPM (ZMQ)     {endpoints[0]} ... {endpoints[-1]} (one per engine)",
            f"  planner log          {self.service.log_path}",
            "",
            f"Times in the planner's API are simulated: {SIM_EPOCH.isoformat()} is the start of the "
            f"trace, and the clock runs ×{o.speed:g} (slower while the simulator cannot keep up).",
            "Ctrl-C stops the demo.",
        ]
        for line in lines:
            self.out(line)

    def status_line(self, arrivals_rps: float, cpu_share: float | None = None) -> str:
        assert self.sim is not None
        snap = self.sim.snapshot
        parts = [f"sim {_clock_text(snap.sim_s)}", f"{arrivals_rps:7.1f} req/s"]
        for role in ROLES:
            starting = f" +{snap.starting[role]} starting" if snap.starting.get(role) else ""
            parts.append(f"{role} {snap.ready[role]} ready{starting}/{snap.billed[role]} billed")
        latest = self.orchestrator.state.latest if self.orchestrator else None
        if latest is None:
            parts.append("no decision yet")
        else:
            targets = " ".join(f"{role[0].upper()}{count}" for role, count in latest.targets.items())
            parts.append(f"decision #{latest.id} {targets} {latest.status}")
        note = clock_note(snap.clock_rate, self.options.speed)
        if note is not None:
            parts.append(note)
        if cpu_share is not None:
            # The whole demo process (simulation, ZMQ and HTTP), over the last status interval.
            parts.append(f"demo CPU {cpu_share:.0%}")
        return " | ".join(parts)

    async def _report(self) -> None:
        assert self.sim is not None
        snap = self.sim.snapshot
        last_sim, last_started = snap.sim_s, snap.arrived
        last_wall, last_cpu = time.monotonic(), time.process_time()
        while True:
            await asyncio.sleep(STATUS_EVERY_S)
            snap = self.sim.snapshot
            now, started = snap.sim_s, snap.arrived
            wall, cpu = time.monotonic(), time.process_time()
            rate = (started - last_started) / (now - last_sim) if now > last_sim else 0.0
            cpu_share = (cpu - last_cpu) / (wall - last_wall) if wall > last_wall else None
            last_sim, last_started, last_wall, last_cpu = now, started, wall, cpu
            self.out(self.status_line(rate, cpu_share))

    def _summary(self, cluster: Cluster, reason: str) -> dict[str, Any]:
        """What the run achieved; computed by the simulator thread when the trace or --duration-s
        ends, or by the main thread once that thread has stopped."""
        sla = self.plan.deployment.sla
        ttft_target_s, itl_target_s = sla.ttft_ms / 1000.0, sla.itl_ms / 1000.0
        done = [r for r in cluster.requests if r.finish_s is not None]
        ttft_ok = itl_ok = both = 0
        for r in done:
            ttft = r.ttft_s is not None and r.ttft_s <= ttft_target_s
            itl_s = r.itl_s
            itl = itl_s is None or itl_s <= itl_target_s  # one-token outputs have no ITL
            ttft_ok += ttft
            itl_ok += itl
            both += ttft and itl
        n = len(done) or 1
        orchestrator = self.orchestrator.state if self.orchestrator else None
        counts = {role: cluster.counts(role) for role in ROLES}
        return {
            "reason": reason,
            "sim_s": round(cluster.now, 3),
            "wall_s": round(time.monotonic() - self._wall_started, 1),
            "requests": len(cluster.requests),
            "arrived": cluster.frontend.started,
            "completed": len(done),
            "ttft_attainment": ttft_ok / n,
            "itl_attainment": itl_ok / n,
            "slo_attainment": both / n,
            "gpu_hours": cluster.gpu_seconds() / 3600.0,
            "decisions_applied": len(orchestrator.applied) if orchestrator else 0,
            "acks": orchestrator.acks if orchestrator else 0,
            # At the end: engines serving, and engines ordered that were still starting.
            "ready": {role: c[1] for role, c in counts.items()},
            "starting": {role: c[2] for role, c in counts.items()},
            "clock_slowdowns": self.sim.slowdowns if self.sim else 0,
            "slowest_clock_rate": round(self.sim.slowest_rate, 3) if self.sim else None,
        }

    def _summary_heading(self, s: dict[str, Any]) -> str:
        reason = s["reason"]
        if reason == "end_of_trace":
            return "end of the trace"
        if reason == "duration":
            return "--duration-s reached"
        if reason == "signal":
            return f"stopped by {self.stop_signal or 'a signal'} before the end of the trace"
        return f"stopped early ({reason.replace('_', ' ')})"

    def _print_summary(self, s: dict[str, Any]) -> None:
        sla = self.plan.deployment.sla
        engines = ", ".join(
            f"{role} {s['ready'][role]} ready"
            + (f" + {s['starting'][role]} starting" if s["starting"][role] else "")
            for role in ROLES
        )
        lines = [
            "",
            f"{self._summary_heading(s)}: sim {_clock_text(s['sim_s'])} "
            f"after {s['wall_s']:.0f} s of wall time",
            f"  requests          {s['completed']:,} completed of {s['arrived']:,} arrived "
            f"({s['requests']:,} in the trace)",
            f"  TTFT <= {sla.ttft_ms:g} ms    {s['ttft_attainment']:.1%}",
            f"  ITL <= {sla.itl_ms:g} ms       {s['itl_attainment']:.1%}",
            f"  both (SLO)        {s['slo_attainment']:.1%}",
            f"  GPU-hours         {s['gpu_hours']:.2f} (simulated)",
            f"  decisions         {s['decisions_applied']} applied, {s['acks']} acknowledged",
            f"  engines           {engines}",
        ]
        if s["clock_slowdowns"]:
            lines.append(
                f"  simulated clock   slowed {s['clock_slowdowns']} time(s), "
                f"to ×{s['slowest_clock_rate']:.2g} at the slowest "
                f"(the simulator could not keep up with ×{self.options.speed:g})"
            )
        snap = self.sim.snapshot if self.sim else None
        if snap is not None:
            lines.append(f"  FPM messages      {snap.fpm_sent:,} published, {snap.fpm_dropped:,} dropped")
        if not self.options.exit_at_end and s["reason"] == "end_of_trace":
            lines.append("the planner keeps running (it will scale down); Ctrl-C stops the demo")
        lines.append("")
        for line in lines:
            self.out(line)

    # --- the run ----------------------------------------------------------------------------

    async def run(self) -> int:
        """Start everything, run until the end (or a signal), stop everything."""
        tasks: list[asyncio.Task[None]] = []
        reserved = reserve_port(self.options.port)
        try:
            self.tmp_dir = Path(tempfile.mkdtemp(prefix="planner-demo-"))
            self.publisher = FpmPublisher(self._slots)
            deployment = self.plan.deployment
            self.cluster = Cluster(
                self.plan.truth,
                self.plan.requests,
                initial=self.plan.initial,
                startup_delay_s=self.plan.replay.simulation.startup_delay_s,
                gpus_per_engine={role: deployment.role(role).gpus_per_engine for role in ROLES},
                model_name=model_name(deployment),
                on_fpm=self.publisher.publish,
            )
            # The simulated world starts now, at the wall clock's pace while the planner starts
            # (a few simulated seconds), and runs at --speed from the moment the planner is ready.
            self.clock = SharedClockWriter(self.tmp_dir / "clock", rate=1.0)
            self.sim = SimulationThread(
                self.cluster,
                self.publisher,
                self.clock,
                speed=self.options.speed,
                duration_s=self.options.duration_s,
                summarize=self._summary,
                step_cost_s=self.options.sim_cost_s,
            )
            await self.frontend.start()
            self.sim.start()
            config_path = self.tmp_dir / "deployments.yaml"
            config = service_deployments_file(
                self.plan, frontend_url=self.frontend.url(), fpm_endpoints=self.publisher.endpoints_by_role
            )
            config_path.write_text(yaml.safe_dump(config, sort_keys=False))
            load_deployments(config_path)  # what the service will read must be valid
            self.service = PlannerService(
                settings_env={
                    "PLANNER_CONFIG": str(config_path),
                    "PLANNER_DATABASE_URL": f"sqlite:///{self.tmp_dir / 'planner.db'}",
                    "PLANNER_HOST": "127.0.0.1",
                    "PLANNER_PORT": str(self.options.port),
                    "PLANNER_CLOCK_FILE": str(self.clock.path),
                    "PLANNER_LOG_LEVEL": self.options.log_level.upper(),
                },
                log_path=self.tmp_dir / "planner.log",
                port=self.options.port,
            )
            reserved.close()
            self.service.start()
            self.out(f"starting the planner service on {self.service.base_url} (pid {self.service.pid}) ...")
            await self.service.wait_ready(READY_TIMEOUT_S)
            self.orchestrator = Orchestrator(
                base_url=self.service.base_url,
                deployment=deployment.name,
                cluster=self.sim,
                sim_now=self.sim_now,
            )
            self._print_urls()
            self.clock.set_rate(self.options.speed)
            tasks = [
                asyncio.create_task(self.orchestrator.run(), name="orchestrator"),
                asyncio.create_task(self._report(), name="status"),
            ]
            await self._until_done(tasks)
            return 0
        except ServiceError as exc:
            print(f"planner: error: {exc}", file=sys.stderr)
            self.stop_reason = "service_failed"
            return 1
        except (OSError, SimulatorError) as exc:
            print(f"planner: error: {exc}", file=sys.stderr)
            self.stop_reason = "failed"
            return 1
        except asyncio.CancelledError:
            self.stop_reason = "signal"
            return 0
        finally:
            reserved.close()
            await self._shutdown(tasks)

    async def _until_done(self, tasks: list[asyncio.Task[None]]) -> None:
        """Until the run ends (with --exit-at-end or --duration-s), a task or the simulator
        fails, or the service exits on its own. Prints the summary when the simulation ends."""
        assert self.service is not None and self.sim is not None
        stop_at_end = self.options.exit_at_end or self.options.duration_s is not None
        while True:
            for task in tasks:
                if task.done():
                    task.result()  # raises what it died of
                    raise RuntimeError(f"the {task.get_name()} task stopped")
            if self.sim.error is not None or not self.sim.alive:
                raise SimulatorError(f"the simulator stopped: {self.sim.error!r}")
            status = self.service.exit_status()
            if status is not None:
                raise ServiceError(
                    f"the planner service exited with status {status}; its log ends with:\n"
                    f"{self.service.log_tail()}"
                )
            snap = self.sim.snapshot
            if self.summary is None and snap.ended is not None and snap.summary is not None:
                self.end_reason = snap.ended
                self.summary = snap.summary
                self._print_summary(self.summary)
            if self.end_reason is not None and stop_at_end:
                self.stop_reason = self.end_reason
                return
            await asyncio.sleep(0.1)

    async def _shutdown(self, tasks: list[asyncio.Task[None]]) -> None:
        """Orchestrator first (no half-applied decision is acknowledged), then the simulator (its
        last orders applied), the summary if the run did not reach its end, the service, the
        sockets and the temporary directory. Runs on every exit path."""
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.sim is not None:
            stopped = await asyncio.to_thread(self.sim.stop, SIM_STOP_TIMEOUT_S)
            if not stopped:
                log.warning("the simulator did not stop within %g s", SIM_STOP_TIMEOUT_S)
            snap = self.sim.snapshot
            if self.summary is None and snap.summary is not None:
                # The simulation reached its end just before the stop: that is its summary.
                self.end_reason, self.summary = snap.ended, snap.summary
                self._print_summary(self.summary)
            elif self.summary is None and self.cluster is not None:
                # Ctrl-C, SIGTERM, a failure: the run did not reach its end, say what it did.
                self.summary = self._summary(self.cluster, self.stop_reason)
                self._print_summary(self.summary)
        service_status = None
        if self.service is not None:
            service_status = await self.service.stop(STOP_TIMEOUT_S)
        final = {"demo": "stopped", "reason": self.stop_reason, **self.state(), "summary": self.summary}
        final["planner"] = service_outcome(service_status)
        endpoints = final["fpm"].pop("endpoints")
        final["fpm"]["endpoint_count"] = len(endpoints)
        await self.frontend.close()
        if self.publisher is not None and (self.sim is None or not self.sim.alive):
            self.publisher.close()
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self.out(json.dumps(final))


# The simulated clock slows down when the simulation cannot keep up; within this share of the
# asked speed it is the slice's own jitter, not worth a word.
CLOCK_BEHIND_SHARE = 0.95


def clock_note(rate: float, speed: float) -> str | None:
    """What the status line says of the simulated clock: nothing at the asked speed, its actual
    speed and why when it runs slower (the machine cannot simulate the cluster that fast)."""
    if rate >= CLOCK_BEHIND_SHARE * speed:
        return None
    return f"clock ×{rate:.3g} of ×{speed:g} asked: the simulation cannot keep up"


def service_outcome(status: int | None) -> str:
    """How the planner service ended, in words: the demo stops it with SIGTERM, so a SIGTERM
    status is the clean stop it asked for, not a failure."""
    if status is None:
        return "not started"
    if status in (0, -signal.SIGTERM):
        return "stopped"
    if status == -signal.SIGKILL:
        return f"killed: it did not stop within {STOP_TIMEOUT_S:g} s"
    return f"exited with status {status}"


class SimulatorError(Exception):
    """The simulator thread died."""


def run_demo(options: DemoOptions) -> int:
    """`planner demo`: validate, then run until the end or Ctrl-C / SIGTERM. The exit status."""
    # One line per long-poll would bury the status lines.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    cost = os.environ.get(SIM_COST_ENV)
    if cost:
        try:
            options = dataclasses.replace(options, sim_cost_s=float(cost))
        except ValueError:
            raise ConfigError(f"{SIM_COST_ENV}: not a number: {cost!r}") from None
    plan = prepare(options)  # ConfigError: the caller prints one line and exits 2
    check_port_free(options.port)
    return asyncio.run(_main(plan))


async def _main(plan: DemoPlan) -> int:
    demo = Demo(plan)
    task = asyncio.create_task(demo.run())
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            demo.stop_signal = signal.Signals(signum).name
            print(f"\n{demo.stop_signal}: stopping the demo ...", file=sys.stderr, flush=True)
            task.cancel()
        else:
            print("still stopping (the service gets SIGKILL after 10 s) ...", file=sys.stderr, flush=True)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await task
    except asyncio.CancelledError:
        return 0
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
