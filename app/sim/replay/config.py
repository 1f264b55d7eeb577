"""The replay file: a deployments file (what `planner serve` reads) plus a `simulation:` section.

`examples/replay.yaml` is the default. The deployment part is validated exactly as the service
validates it, so a policy replayed here is the one a deployment would run; the `simulation:`
section describes the world (start-up delay, truth) and the baselines. Command-line flags
override single fields for one run (`with_overrides`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, ValidationError, field_validator

from app.config import (
    REPO_ROOT,
    ConfigError,
    DeploymentConfig,
    Strict,
    format_validation_error,
    read_yaml_mapping,
    validate_deployments,
)
from app.sim.world.truth import parse_worlds

DEFAULT_REPLAY_CONFIG = REPO_ROOT / "examples" / "replay.yaml"
POLICIES = ("planner", "seed", "static", "reactive", "oracle")


class ReactiveConfig(Strict):
    """The HPA-like baseline: per role, desired = ceil(current × metric ÷ target) when the ratio
    is off by more than `tolerance`; scale-down takes the highest desired count of the last
    `scale_down_window_s` (HPA's stabilisation window)."""

    interval_s: float = Field(default=15.0, gt=0)
    tolerance: float = Field(default=0.1, ge=0, lt=1)
    scale_down_window_s: float = Field(default=300.0, ge=0)
    # Prefill: requests queued or running per ready engine.
    prefill_queue_target: float = Field(default=2.0, gt=0)
    # Decode: share of the KV cache in use (reserved or waiting) per ready engine.
    decode_kv_target: float = Field(default=0.3, gt=0, le=1)


class OracleConfig(Strict):
    interval_s: float = Field(default=60.0, gt=0)
    # Share of each interval's requests whose TTFT must meet the target on the oracle's engines.
    quantile: float = Field(default=0.99, gt=0, le=1)


class SimulationConfig(Strict):
    startup_delay_s: float = Field(default=120.0, ge=0)
    rate_scale: float = Field(default=1.0, gt=0)
    # Each copy of a request (rate_scale > 1) arrives within ±rate_spread_s of it.
    rate_spread_s: float = Field(default=0.5, ge=0, allow_inf_nan=False)
    truth_scale: float = Field(default=1.0, gt=0)
    truth_profile: str | None = None  # default: the deployment's profile
    # The world's latency shape (app/sim/world/truth.py WORLDS), names combined with commas.
    truth: str = "profile"
    seed: int = 0
    # Engines of each role at t = 0 for planner and reactive (static and oracle size their own);
    # None: the oracle's count at t = 0, so that no policy starts from a cold, empty cluster.
    initial_prefill: int | None = Field(default=None, ge=0)
    initial_decode: int | None = Field(default=None, ge=0)
    # How a removed engine goes (app/sim/world/cluster.py): None, it drains until empty; a
    # number, its termination grace period: what it still holds then is cut off.
    removal_grace_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    # With a grace period: whether the cluster removes the engines the policy names first.
    removal_hints: bool = True
    reactive: ReactiveConfig = Field(default_factory=ReactiveConfig)
    oracle: OracleConfig = Field(default_factory=OracleConfig)

    @field_validator("truth")
    @classmethod
    def _known_worlds(cls, value: str) -> str:
        return ",".join(parse_worlds(value))


class _SimulationSection(Strict):
    # Wrapped so that errors name the field as `simulation.startup_delay_s`.
    simulation: SimulationConfig


@dataclass(frozen=True)
class ReplayConfig:
    """Engine capabilities come from the deployment: `prefill.max_num_batched_tokens` (default
    8192) and `decode.max_kv_tokens` (default: the profile's)."""

    path: Path
    deployment: DeploymentConfig
    simulation: SimulationConfig

    @property
    def base_dir(self) -> Path:
        return self.path.resolve().parent

    def resolve(self, relative: str) -> Path:
        candidate = Path(relative).expanduser()
        return candidate if candidate.is_absolute() else self.base_dir / candidate


def load_replay_config(path: str | Path, deployment: str | None = None) -> ReplayConfig:
    path = Path(path)
    raw = read_yaml_mapping(path, what="replay file", hint="")
    simulation_raw = raw.pop("simulation", None) or {}
    deployments = validate_deployments(raw, str(path))
    if deployment is None:
        if len(deployments.deployments) > 1:
            names = ", ".join(d.name for d in deployments.deployments)
            raise ConfigError(
                f"{path}: {len(deployments.deployments)} deployments ({names}); pick one with --deployment"
            )
        chosen = deployments.deployments[0]
    else:
        found = deployments.get(deployment)
        if found is None:
            names = ", ".join(d.name for d in deployments.deployments)
            raise ConfigError(f"{path}: no deployment named {deployment!r} (have: {names})")
        chosen = found
    if chosen.mode != "disagg":
        raise ConfigError(
            f"{path}: deployment {chosen.name!r}: mode {chosen.mode}: "
            "the simulator models disaggregated serving only (mode: disagg)"
        )
    if not chosen.profile:
        raise ConfigError(
            f"{path}: deployment {chosen.name!r}: profile: required for replay (the simulator's truth)"
        )
    try:
        section = _SimulationSection.model_validate({"simulation": simulation_raw})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), exc, _SimulationSection)) from None
    return ReplayConfig(path=path, deployment=chosen, simulation=section.simulation)


def with_overrides(
    config: ReplayConfig,
    *,
    profile: str | None = None,
    prefill_gpus: int | None = None,
    decode_gpus: int | None = None,
    ttft_ms: float | None = None,
    itl_ms: float | None = None,
    startup_delay_s: float | None = None,
    truth_scale: float | None = None,
    truth_profile: str | None = None,
    truth: str | None = None,
    seed: int | None = None,
    rate_scale: float | None = None,
    rate_spread_s: float | None = None,
    removal_grace_s: float | None = None,
    removal_hints: bool | None = None,
    modes: tuple[str, ...] | None = None,
    scale_to_zero_quiet_s: float | None = None,
    scale_to_zero_forecast: bool = False,
) -> ReplayConfig:
    """The command line's flags over the file, for one run (None: keep the file's value).
    Paths given on the command line are relative to the current directory."""
    d, sim = config.deployment, config.simulation
    deployment_update: dict = {}
    if profile is not None:
        deployment_update["profile"] = str(Path(profile).resolve())
    if ttft_ms is not None or itl_ms is not None:
        sla = {"ttft_ms": ttft_ms, "itl_ms": itl_ms}
        deployment_update["sla"] = d.sla.model_copy(update={k: v for k, v in sla.items() if v is not None})
    if modes is not None:
        unknown = set(modes) - {"load", "throughput"}
        if unknown or not modes:
            raise ConfigError(
                f"--modes: expected load, throughput or both, got {','.join(modes) or 'nothing'}"
            )
        deployment_update["throughput"] = d.throughput.model_copy(update={"enabled": "throughput" in modes})
        deployment_update["load"] = d.load.model_copy(update={"enabled": "load" in modes})
        # The modes are the seed's: asking for them is asking for the seed.
        deployment_update["scaling"] = d.scaling.model_copy(update={"algorithm": "seed"})
    for role, gpus in (("prefill", prefill_gpus), ("decode", decode_gpus)):
        if gpus is not None:
            deployment_update[role] = d.role(role).model_copy(update={"gpus_per_engine": gpus})  # type: ignore[arg-type]
    if scale_to_zero_forecast and scale_to_zero_quiet_s is None:
        raise ConfigError("--zero-return-forecast: with --scale-to-zero QUIET_S")
    if scale_to_zero_quiet_s is not None:
        if modes is not None:
            raise ConfigError("--scale-to-zero: SLA scaling's (--policy planner), not the seed's --modes")
        # Scale to zero needs both minimums at 0 (app/config/deployment.py): the flag sets them, so that
        # the file's replay stays exactly what it was without it.
        for role in ("prefill", "decode"):
            base = deployment_update.get(role, d.role(role))
            deployment_update[role] = base.model_copy(update={"min_replicas": 0})
        zero = d.scaling.scale_to_zero.model_copy(
            update={
                "enabled": True,
                "quiet_s": scale_to_zero_quiet_s,
                "respect_return_forecast": scale_to_zero_forecast,
            }
        )
        deployment_update["scaling"] = d.scaling.model_copy(update={"scale_to_zero": zero})
    if truth is not None:
        try:
            truth = ",".join(parse_worlds(truth))
        except ValueError as exc:
            raise ConfigError(f"--truth: {exc}") from None
    simulation = {
        "startup_delay_s": startup_delay_s,
        "truth_scale": truth_scale,
        "truth_profile": str(Path(truth_profile).resolve()) if truth_profile is not None else None,
        "truth": truth,
        "seed": seed,
        "rate_scale": rate_scale,
        "rate_spread_s": rate_spread_s,
        "removal_grace_s": removal_grace_s,
        "removal_hints": removal_hints,
    }
    return ReplayConfig(
        path=config.path,
        deployment=d.model_copy(update=deployment_update),
        simulation=sim.model_copy(update={k: v for k, v in simulation.items() if v is not None}),
    )
