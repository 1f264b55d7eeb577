"""What `planner demo` is given and reads before anything starts: its options and their defaults,
its time limits, the plan (replay config, trace, truth model, warm start), the port held for the
planner service, and the deployments file that service reads.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.config import REPO_ROOT, ConfigError, DeploymentConfig
from app.core.traces import TraceRequest
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, ReplayConfig, load_replay_config, with_overrides
from app.sim.replay.oracle import required_engines
from app.sim.replay.run import load_models, load_requests
from app.sim.world.truth import TruthModel

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
    # The planner's SQLite file, kept after the run; None: one in the temporary directory.
    store: Path | None = None
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
    if options.store is not None:
        check_new_store(options.store)
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


def check_new_store(path: Path) -> None:
    """--store names a new file in a writable folder: every demo starts its simulated clock at
    the same instant, so a second run's ticks would interleave with the first's."""
    if path.exists() or path.is_symlink():
        raise ConfigError(
            f"--store: {path} exists; the demo writes a new database (remove it or pick another path)"
        )
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ConfigError(f"--store: {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--store: {path}: the folder {folder} is not writable")


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
    raw = deployment.with_absolute_paths(plan.replay.base_dir)
    raw["connector"] = {"type": "virtual", "ack_timeout_s": deployment.connector.ack_timeout_s}
    raw["model_name"] = model_name(deployment)
    raw["sources"] = {"frontend_url": frontend_url, "fpm_endpoints": fpm_endpoints}
    return {"deployments": [raw]}


def model_name(deployment: DeploymentConfig) -> str:
    return deployment.model_name or deployment.name
