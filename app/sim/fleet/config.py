"""A fleet file: several deployments, one trace or named workload each, under one GPU budget.

The file is a replay file (deployments + `simulation:`) with a `fleet:` section (app/config/fleet.py
`FleetConfig`) and, under `simulation.traces`, one trace or named workload per deployment; read
and validated here, with each deployment's requests as its replay sees them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, ValidationError, model_validator

from app.config import (
    ConfigError,
    DeploymentConfig,
    FleetConfig,
    Strict,
    format_validation_error,
    read_yaml_mapping,
    validate_deployments,
)
from app.core.traces import TraceRequest
from app.sim.replay.config import ReplayConfig, SimulationConfig, _SimulationSection


class TraceSpec(Strict):
    """One deployment's traffic: a trace file (relative to the fleet file) or a named workload."""

    trace: str | None = None
    workload: str | None = None  # app/sim/world/workload.py WORKLOADS
    rate_scale: float = Field(default=1.0, gt=0)  # below 1 thins the trace, above 1 multiplies it
    duration_s: float | None = Field(default=None, gt=0)  # keep only the arrivals before this
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _one_source(self) -> TraceSpec:
        if (self.trace is None) == (self.workload is None):
            raise ValueError("give exactly one of trace or workload")
        if self.workload is not None:
            from app.sim.world.workload import WORKLOADS

            if self.workload not in WORKLOADS:
                raise ValueError(f"workload: unknown {self.workload!r} (choose from {', '.join(WORKLOADS)})")
        return self


class _TracesSection(Strict):
    # Wrapped so that errors name the field as `simulation.traces.chat.workload`.
    traces: dict[str, TraceSpec]


@dataclass(frozen=True)
class FleetReplayConfig:
    path: Path
    deployments: tuple[DeploymentConfig, ...]
    fleet: FleetConfig
    simulation: SimulationConfig
    traces: dict[str, TraceSpec]

    @property
    def base_dir(self) -> Path:
        return self.path.resolve().parent

    def resolve(self, relative: str) -> Path:
        candidate = Path(relative).expanduser()
        return candidate if candidate.is_absolute() else self.base_dir / candidate

    def replay_config(self, deployment: DeploymentConfig) -> ReplayConfig:
        return ReplayConfig(path=self.path, deployment=deployment, simulation=self.simulation)


def is_fleet_file(path: str | Path) -> bool:
    """Whether a replay file has a `fleet:` section (then `planner replay` replays the fleet)."""
    return "fleet" in read_yaml_mapping(Path(path), what="replay file", hint="")


def load_fleet_config(path: str | Path) -> FleetReplayConfig:
    path = Path(path)
    raw = read_yaml_mapping(path, what="replay file", hint="")
    simulation_raw = dict(raw.pop("simulation", None) or {})
    traces_raw = simulation_raw.pop("traces", None)
    file = validate_deployments(raw, str(path))
    if file.fleet is None:
        raise ConfigError(f"{path}: fleet: required for a fleet replay")
    for d in file.deployments:
        if d.mode != "disagg":
            raise ConfigError(
                f"{path}: deployments: {d.name}: mode {d.mode}: the simulator models disagg only"
            )
        if not d.profile:
            raise ConfigError(f"{path}: deployments: {d.name}: profile: required for replay")
    try:
        simulation = _SimulationSection.model_validate({"simulation": simulation_raw}).simulation
        traces = _TracesSection.model_validate({"traces": traces_raw or {}}).traces
    except ValidationError as exc:
        message = format_validation_error(str(path), exc)
        raise ConfigError(message.replace(f"{path}: traces", f"{path}: simulation.traces")) from None
    names = [d.name for d in file.deployments]
    for name in traces:
        if name not in names:
            raise ConfigError(f"{path}: simulation.traces.{name}: no deployment named {name!r}")
    for name in names:
        if name not in traces:
            raise ConfigError(f"{path}: simulation.traces.{name}: every deployment needs a trace or workload")
    # The fleet replays SLA scaling (the planner's own algorithm) for every deployment.
    deployments = tuple(
        d.model_copy(update={"scaling": d.scaling.model_copy(update={"algorithm": "sla"})})
        for d in file.deployments
    )
    return FleetReplayConfig(path, deployments, file.fleet, simulation, traces)


def load_fleet_requests(config: FleetReplayConfig, name: str) -> list[TraceRequest]:
    from app.sim.world.workload import build_workload, expand_rate
    from app.sources.traces import load_trace

    spec = config.traces[name]
    try:
        if spec.workload is not None:
            requests = build_workload(spec.workload)
        else:
            requests = load_trace(config.resolve(spec.trace))  # type: ignore[arg-type]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"simulation.traces.{name}: {exc}") from None
    if spec.duration_s is not None:
        requests = [r for r in requests if r.arrival_s < spec.duration_s]
    requests = expand_rate(requests, spec.rate_scale, spec.seed)
    if not requests:
        raise ConfigError(f"simulation.traces.{name}: no requests")
    return requests
