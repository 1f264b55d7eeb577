"""`Demo`: one run of `planner demo`. It starts the simulated cluster, its endpoints, the planner
service and the orchestrator, supervises them, prints the status and the summary, and stops
everything on every exit path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from app.config import load_deployments
from app.sim.demo.live import FpmPublisher, HttpEndpoint, PlannerService, ServiceError
from app.sim.demo.orchestrator import Orchestrator
from app.sim.demo.plan import (
    READY_TIMEOUT_S,
    SIM_STOP_TIMEOUT_S,
    STATUS_EVERY_S,
    STOP_TIMEOUT_S,
    DemoPlan,
    model_name,
    reserve_port,
    service_deployments_file,
)
from app.sim.demo.realtime import PROMETHEUS_TEXT, SimulationThread
from app.sim.demo.status import _clock_text, clock_note, service_outcome
from app.sim.world.cluster import ROLES, Cluster
from app.workers.clock import SIM_EPOCH, SharedClockWriter

log = logging.getLogger(__name__)


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
            # Every report of the engines ready the orchestrator sent: [simulated s, per role].
            "ready_reports": [[t, r] for t, r in orchestrator.ready_log] if orchestrator else [],
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

    def _store_path(self) -> Path:
        """The planner's SQLite file: --store's (kept), or one in the temporary directory."""
        assert self.tmp_dir is not None
        store = self.options.store
        return store.resolve() if store is not None else self.tmp_dir / "planner.db"

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
                    "PLANNER_DATABASE_URL": f"sqlite:///{self._store_path()}",
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


class SimulatorError(Exception):
    """The simulator thread died."""
