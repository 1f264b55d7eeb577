"""Service settings (environment) and the deployments file (YAML), both validated at start-up.

Settings come from `PLANNER_*` variables; the deployments file lists what the planner manages.
A bad value stops start-up with one message that names the field (`ConfigError`).
"""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.core.sla.settings import SlaTuning
from app.core.types import Mode, Role, RoleBounds, roles_for_mode
from app.validation_messages import describe_validation_error, message

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent


class ConfigError(Exception):
    """A setting or the deployments file is invalid; the message names the field."""


# --- deployments file -------------------------------------------------------------------------


class Strict(BaseModel):
    # A typo in the YAML must be an error, not a silently ignored key.
    model_config = ConfigDict(extra="forbid")


class SlaTargets(Strict):
    ttft_ms: float = Field(gt=0, description="time to first token target (ms)")
    itl_ms: float = Field(gt=0, description="inter-token latency target (ms)")
    attainment_target: float = Field(
        default=0.99,
        gt=0,
        lt=1,
        description="share of requests that should meet both targets (SLA scaling's attainment sizing)",
    )


class RoleConfig(Strict):
    gpus_per_engine: int = Field(default=1, ge=1, description="GPUs one engine of the role uses")
    min_replicas: int = Field(default=1, ge=0, description="fewest engines of the role")
    max_replicas: int = Field(default=100, ge=1, description="most engines of the role")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, description="the engines' prefill chunk size (default 8192, vLLM's)"
    )
    max_kv_tokens: int | None = Field(
        default=None, ge=1, description="KV cache capacity per engine (default: the profile's)"
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        description="most requests one engine schedules at once (vLLM's max_num_seqs; default: no cap)",
    )

    @model_validator(mode="after")
    def _min_not_above_max(self) -> RoleConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})"
            )
        return self


_ACK_TIMEOUT = "an unacknowledged decision expires after this long (s)"


class VirtualConnectorConfig(Strict):
    """Decisions in SQL, long-polled and acknowledged by an orchestrator."""

    type: Literal["virtual"] = Field(description="virtual: an orchestrator applies the decisions")
    ack_timeout_s: float = Field(default=1800.0, gt=0, description=_ACK_TIMEOUT)


class NoneConnectorConfig(Strict):
    """Advisory (shadow) mode: decide, persist and export, actuate nothing."""

    type: Literal["none"] = Field(description="none: advisory, nothing is actuated")
    ack_timeout_s: float = Field(default=1800.0, gt=0, description=_ACK_TIMEOUT)


class KubernetesConnectorConfig(Strict):
    """Scale a Dynamo DynamoGraphDeployment (DGD); see docs/kubernetes.md."""

    type: Literal["kubernetes"] = Field(description="kubernetes: patch the DGD's replicas")
    dgd_name: str = Field(min_length=1, max_length=253, description="the DynamoGraphDeployment's name")
    namespace: str | None = Field(
        default=None, description="default: the planner's service account's namespace, else default"
    )
    kubeconfig: str | None = Field(
        default=None, description="default: in-cluster configuration, else the usual kubeconfig"
    )
    api_server: str | None = Field(
        default=None, description="an explicit API server URL (a local stand-in, a proxy)"
    )
    token_file: str | None = Field(default=None, description="bearer token file for api_server")
    ack_timeout_s: float = Field(default=1800.0, gt=0, description=_ACK_TIMEOUT)


ConnectorConfig = Annotated[
    VirtualConnectorConfig | NoneConnectorConfig | KubernetesConnectorConfig, Field(discriminator="type")
]


class PredictorConfig(Strict):
    type: Literal["constant", "arima", "kalman", "prophet"] = Field(
        default="constant", description="the load predictor of throughput scaling"
    )
    params: dict[str, float | int | bool | str] = Field(
        default_factory=dict, description="the predictor's parameters (docs/configuration.md)"
    )


class ThroughputConfig(Strict):
    enabled: bool = Field(default=True, description="run throughput scaling (scaling.algorithm seed)")
    interval_s: float = Field(default=180.0, gt=0, description="how often it observes and decides (s)")
    predictor: PredictorConfig = Field(default_factory=PredictorConfig, description="the load predictor")
    correction: bool = Field(default=True, description="correct the profile by observed TTFT and ITL")
    warmup_trace: str | None = Field(default=None, description="a request trace the predictors start from")


class LoadConfig(Strict):
    enabled: bool = Field(default=False, description="run load scaling (scaling.algorithm seed)")
    interval_s: float = Field(default=5.0, gt=0, description="how often the load step decides (s)")
    sensitivity: float = Field(
        default=0.8, gt=0, le=1, description="scale down only with this share of the target to spare"
    )
    min_observations: int = Field(default=5, ge=1, description="forward passes before a regression estimates")
    window: int = Field(default=200, ge=1, description="forward passes each regression keeps")
    engine_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="an engine whose FPM publisher is silent this long leaves the inventory",
    )


class ScalingConfig(SlaTuning):
    """Which algorithm decides, how often, and SLA scaling's tunables (declared once, with their
    descriptions, in app/core/sla/settings.py). `sla` is the planner's own algorithm; `seed` is the
    reference's throughput and load modes, as the `throughput` and `load` sections set them."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    algorithm: Literal["sla", "seed"] = Field(
        default="seed", description="sla: the planner's own algorithm; seed: the reference's two modes"
    )
    interval_s: float = Field(default=5.0, gt=0, description="how often SLA scaling ticks")


class PrometheusSource(Strict):
    url: str = Field(description="the Prometheus server's URL")
    labels: dict[str, str] = Field(default_factory=dict, description="label matchers for every query")


class FpmDiscoveryConfig(Strict):
    """The engines' FPM publishers from Dynamo's discovery (app/sources/dynamo_discovery.py)."""

    backend: Literal["file"] = Field(default="file", description="Dynamo's discovery backend (file only)")
    path: str | None = Field(
        default=None,
        description="the file backend's folder (Dynamo's DYN_FILE_KV); default $DYN_FILE_KV, "
        "else $TMPDIR/dynamo_store_kv, as Dynamo",
    )
    namespace: str = Field(default="dynamo", description="the Dynamo namespace of the workers")
    components: dict[Role, str] = Field(
        default_factory=dict,
        description="Dynamo component per role; default prefill: prefill, decode: backend, "
        "workers: backend (Dynamo's defaults)",
    )
    refresh_s: float = Field(default=1.0, gt=0, description="how often discovery is read (s)")


class SourcesConfig(Strict):
    prometheus: PrometheusSource | None = Field(default=None, description="read traffic from Prometheus")
    frontend_url: str | None = Field(default=None, description="else scrape the frontend's /metrics directly")
    fpm_endpoints: list[str] | dict[Role, list[str]] = Field(
        default_factory=list,
        description="ZMQ endpoints of the engines' ForwardPassMetrics publishers, per role "
        "({prefill: [...], decode: [...]}); a plain list for a single-role mode",
    )
    fpm_discovery: FpmDiscoveryConfig | None = Field(
        default=None,
        description="find the FPM publishers in Dynamo's discovery (as workers come and go), "
        "besides any fpm_endpoints",
    )


class DeploymentConfig(Strict):
    name: str = Field(
        pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", description="the deployment's name (a DNS label)"
    )
    mode: Mode = Field(default="disagg", description="disagg (prefill + decode), agg, prefill or decode")
    connector: ConnectorConfig = Field(description="how decisions reach the cluster")
    sla: SlaTargets = Field(description="the latency targets")
    profile: str | None = Field(
        default=None, description="a profiling-results folder (relative to this file)"
    )
    model_name: str | None = Field(
        default=None, description="the model the frontend's metrics are labelled with"
    )
    prefill: RoleConfig = Field(default_factory=RoleConfig, description="prefill engines")
    decode: RoleConfig = Field(default_factory=RoleConfig, description="decode engines")
    workers: RoleConfig = Field(default_factory=RoleConfig, description="aggregated engines (mode agg)")
    gpu_budget: int | None = Field(default=None, ge=1, description="GPUs the deployment may use at most")
    throughput: ThroughputConfig = Field(default_factory=ThroughputConfig, description="throughput scaling")
    load: LoadConfig = Field(default_factory=LoadConfig, description="load scaling")
    scaling: ScalingConfig = Field(default_factory=ScalingConfig, description="which algorithm decides")
    sources: SourcesConfig = Field(
        default_factory=SourcesConfig, description="where traffic and FPM come from"
    )

    @model_validator(mode="after")
    def _fpm_endpoints_match_the_roles(self) -> DeploymentConfig:
        endpoints = self.sources.fpm_endpoints
        if isinstance(endpoints, dict):
            extra = sorted(set(endpoints) - set(self.roles))
            if extra:
                raise ValueError(
                    f"sources.fpm_endpoints: {', '.join(extra)} is not a role of mode {self.mode} "
                    f"(roles: {', '.join(self.roles)})"
                )
        elif endpoints and len(self.roles) > 1:
            raise ValueError(
                "sources.fpm_endpoints: mode disagg needs the endpoints per role, "
                "e.g. {prefill: [tcp://...], decode: [tcp://...]}"
            )
        return self

    @model_validator(mode="after")
    def _sla_scaling_sizes_prefill_and_decode(self) -> DeploymentConfig:
        if self.scaling.algorithm == "sla" and "workers" in self.roles:
            raise ValueError(
                f"scaling.algorithm: sla sizes prefill and decode engines; mode {self.mode} "
                "needs algorithm seed"
            )
        return self

    @model_validator(mode="after")
    def _scale_to_zero_needs_zero_minimums(self) -> DeploymentConfig:
        # Explicit rather than implied: the bounds stage, operator bounds and the fleet's grants
        # all read min_replicas, and a floor of 1 there would silently undo the zero. While awake,
        # SLA scaling itself keeps at least one engine of each role (app/core/sla/step.py).
        if not self.scaling.scale_to_zero.enabled:
            return self
        if self.scaling.algorithm != "sla":
            raise ValueError("scaling.scale_to_zero.enabled: scale to zero needs scaling.algorithm: sla")
        for role in self.roles:
            minimum = self.role(role).min_replicas
            if minimum != 0:
                raise ValueError(
                    f"{role}.min_replicas: scaling.scale_to_zero.enabled needs min_replicas: 0 "
                    f"(got {minimum}); while awake the planner keeps at least one engine of each role"
                )
        return self

    @property
    def roles(self) -> tuple[Role, ...]:
        return roles_for_mode(self.mode)

    def fpm_endpoints_by_role(self) -> dict[Role, list[str]]:
        endpoints = self.sources.fpm_endpoints
        if isinstance(endpoints, dict):
            return {role: list(endpoints.get(role, [])) for role in self.roles}
        return {self.roles[0]: list(endpoints)}

    def role(self, role: Role) -> RoleConfig:
        return getattr(self, role)

    @property
    def awaits_ack(self) -> bool:
        """Only an orchestrator behind the virtual connector acknowledges decisions."""
        return self.connector.type == "virtual"

    def bounds(self) -> dict[Role, RoleBounds]:
        """The configured min/max replicas of every role of the mode."""
        return {r: RoleBounds(self.role(r).min_replicas, self.role(r).max_replicas) for r in self.roles}

    @property
    def tick_interval_s(self) -> float:
        """The worker ticks at the fastest enabled cadence (the throughput interval if none is);
        SLA scaling at its own interval."""
        if self.scaling.algorithm == "sla":
            return self.scaling.interval_s
        intervals = [c.interval_s for c in (self.throughput, self.load) if c.enabled]
        return min(intervals) if intervals else self.throughput.interval_s


class VariantConfig(Strict):
    """One kind of engine a deployment may run (app/core/fleet/variants.py, docs/fleet.md). The
    first variant listed is the deployment's own hardware: its profile and GPUs per engine
    default to the deployment's, and must equal them when given."""

    name: str | None = Field(default=None, description="how grants name it (default: its gpu_type)")
    gpu_type: str = Field(description="which budget of fleet.budget_gpus its engines draw on")
    gpus_per_engine: dict[Role, Annotated[int, Field(ge=1)]] | None = Field(
        default=None, description="GPUs per engine, per role (default: the deployment's)"
    )
    profile: str | None = Field(
        default=None,
        description="its profiling-results folder, relative to this file (default: the deployment's)",
    )
    latency_scale: float = Field(
        default=1.0,
        gt=0,
        description="multiplies the profile's latencies: a GPU without a profile of its own, read as "
        "a scaled one (docs/fleet.md)",
    )
    price_per_gpu_hour: float = Field(gt=0, description="what one of its GPUs costs per hour")

    @property
    def label(self) -> str:
        return self.name or self.gpu_type


class CapacityShape(Strict):
    """The request shape a variant's capacity per engine is read at."""

    isl_tokens: float = Field(default=3000.0, gt=0, description="prompt length (tokens)")
    osl_tokens: float = Field(default=150.0, gt=0, description="output length (tokens)")


class FleetMemberConfig(Strict):
    """One deployment's place in the fleet (app/core/fleet/step.py, docs/fleet.md)."""

    priority: int = Field(default=0, description="higher is served first, and takes from lower at once")
    gpu_type: str | None = Field(default=None, description="which budget it draws on (default: the only one)")
    guaranteed_gpus: int = Field(default=0, ge=0, description="GPUs it gets whenever it wishes them")
    max_gpus: int | None = Field(
        default=None, ge=1, description="GPUs it may hold at most (default: the budget)"
    )
    variants: list[VariantConfig] = Field(
        default_factory=list,
        description="hardware variants (its own first), grown cheapest per unit of capacity first",
    )
    capacity_at: CapacityShape = Field(
        default_factory=CapacityShape, description="the request shape variants' capacities are read at"
    )

    @model_validator(mode="after")
    def _variant_names_unique(self) -> FleetMemberConfig:
        seen: set[str] = set()
        for i, v in enumerate(self.variants):
            if v.label in seen:
                raise ValueError(f"variants.{i}.name: {v.label!r} appears twice (name the variants)")
            seen.add(v.label)
        return self

    @model_validator(mode="after")
    def _guarantee_within_max(self) -> FleetMemberConfig:
        if self.max_gpus is not None and self.guaranteed_gpus > self.max_gpus:
            raise ValueError(f"guaranteed_gpus ({self.guaranteed_gpus}) is above max_gpus ({self.max_gpus})")
        return self


class FleetConfig(Strict):
    """Several deployments under one GPU budget per GPU type: the fleet step between their planners
    and the cluster. Deployments not listed under `deployments` have priority 0 and no guarantee."""

    budget_gpus: dict[str, Annotated[int, Field(ge=1)]] = Field(
        min_length=1, description="total GPUs per GPU type, e.g. {h200: 24}"
    )
    interval_s: float = Field(default=5.0, gt=0, description="how often the fleet step grants (s)")
    margin: float = Field(
        default=0.2, ge=0, description="a move between equal priorities must gain 1 + margin times its cost"
    )
    hold_s: float = Field(
        default=120.0, ge=0, description="... and both grants must have been unchanged this long (s)"
    )
    deployments: dict[str, FleetMemberConfig] = Field(
        default_factory=dict, description="per deployment: priority, gpu_type, guaranteed_gpus, max_gpus"
    )

    def member(self, name: str) -> FleetMemberConfig:
        found = self.deployments.get(name, FleetMemberConfig())
        if found.gpu_type is None:
            found = found.model_copy(update={"gpu_type": next(iter(self.budget_gpus))})
        return found


class DeploymentsFile(Strict):
    deployments: list[DeploymentConfig] = Field(min_length=1)
    fleet: FleetConfig | None = Field(default=None, description="a shared GPU budget (docs/fleet.md)")

    @field_validator("deployments")
    @classmethod
    def _unique_names(cls, deployments: list[DeploymentConfig]) -> list[DeploymentConfig]:
        seen: set[str] = set()
        for d in deployments:
            if d.name in seen:
                raise ValueError(f"deployment name {d.name!r} appears twice")
            seen.add(d.name)
        return deployments

    @model_validator(mode="after")
    def _fleet_matches_the_deployments(self) -> DeploymentsFile:
        fleet = self.fleet
        if fleet is None:
            return self
        names = {d.name for d in self.deployments}
        for name, entry in fleet.deployments.items():
            where = f"fleet.deployments.{name}"
            if name not in names:
                raise ValueError(f"{where}: no deployment named {name!r} (have: {', '.join(sorted(names))})")
            if entry.gpu_type is None and len(fleet.budget_gpus) > 1:
                raise ValueError(f"{where}.gpu_type: required with several GPU types in fleet.budget_gpus")
            if entry.gpu_type is not None and entry.gpu_type not in fleet.budget_gpus:
                types = ", ".join(fleet.budget_gpus)
                raise ValueError(f"{where}.gpu_type: {entry.gpu_type!r} has no budget (have: {types})")
            if entry.variants:
                _check_variants(where, entry, fleet, self.get(name))  # type: ignore[arg-type]
        if len(fleet.budget_gpus) > 1:
            missing = sorted(names - set(fleet.deployments))
            if missing:
                raise ValueError(f"fleet.deployments.{missing[0]}: gpu_type required with several GPU types")
        for gpu_type, budget in fleet.budget_gpus.items():
            # Guarantees are promises: all of them at once must fit the budget.
            guaranteed = sum(
                fleet.member(n).guaranteed_gpus for n in names if fleet.member(n).gpu_type == gpu_type
            )
            if guaranteed > budget:
                raise ValueError(
                    f"fleet.budget_gpus.{gpu_type}: {budget} GPUs, but the guarantees add up to {guaranteed}"
                )
        return self

    def get(self, name: str) -> DeploymentConfig | None:
        return next((d for d in self.deployments if d.name == name), None)


def _check_variants(
    where: str, entry: FleetMemberConfig, fleet: FleetConfig, deployment: DeploymentConfig
) -> None:
    """A variant draws on a budgeted GPU type, and the first one is the deployment's own
    hardware: the planner's wish is in engines of its own profile."""
    types = ", ".join(fleet.budget_gpus)
    for i, v in enumerate(entry.variants):
        if v.gpu_type not in fleet.budget_gpus:
            raise ValueError(f"{where}.variants.{i}.gpu_type: {v.gpu_type!r} has no budget (have: {types})")
        if v.gpus_per_engine is not None:
            extra = sorted(set(v.gpus_per_engine) - set(deployment.roles))
            if extra:
                raise ValueError(
                    f"{where}.variants.{i}.gpus_per_engine: {', '.join(extra)} is not a role of "
                    f"mode {deployment.mode} (roles: {', '.join(deployment.roles)})"
                )
    first = entry.variants[0]
    own_type = entry.gpu_type or next(iter(fleet.budget_gpus))
    if first.gpu_type != own_type:
        raise ValueError(
            f"{where}.variants.0.gpu_type: {first.gpu_type!r}, but the deployment's gpu_type is "
            f"{own_type!r} (the first variant is the deployment's own hardware)"
        )
    own_gpus = {r: deployment.role(r).gpus_per_engine for r in deployment.roles}
    if first.gpus_per_engine is not None and {**own_gpus, **first.gpus_per_engine} != own_gpus:
        raise ValueError(
            f"{where}.variants.0.gpus_per_engine: {first.gpus_per_engine}, but the deployment's "
            f"engines use {own_gpus} (the first variant is the deployment's own hardware)"
        )
    if first.profile is not None and first.profile != deployment.profile:
        raise ValueError(
            f"{where}.variants.0.profile: {first.profile!r}, but the deployment's profile is "
            f"{deployment.profile!r} (the first variant is the deployment's own hardware)"
        )
    if first.latency_scale != 1.0:
        raise ValueError(f"{where}.variants.0.latency_scale: the deployment's own hardware is not scaled")
    if deployment.profile is None and any(v.profile is None for v in entry.variants):
        i = next(i for i, v in enumerate(entry.variants) if v.profile is None)
        raise ValueError(f"{where}.variants.{i}.profile: required (the deployment has no profile)")


def format_validation_error(source: str, err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """The first problem, an unknown key before anything else (app/validation_messages.py)."""
    return describe_validation_error(source, err, model)


def load_deployments(path: str | Path) -> DeploymentsFile:
    path = Path(path)
    return validate_deployments(read_yaml_mapping(path), str(path))


def validate_deployments(raw: dict, source: str) -> DeploymentsFile:
    try:
        return DeploymentsFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc, DeploymentsFile)) from None


def read_yaml_mapping(
    path: Path, *, what: str = "deployments file", hint: str = " (set PLANNER_CONFIG)"
) -> dict:
    """A YAML file's top-level mapping; every failure is one ConfigError naming the file."""
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found{hint}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with a 'deployments' list")
    return raw


# --- service settings -------------------------------------------------------------------------

ApiRole = Literal["viewer", "orchestrator", "operator"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PLANNER_", extra="ignore")

    database_url: str = "sqlite:///planner.db"
    config: str = str(REPO_ROOT / "examples" / "planner.yaml")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    api_tokens: str = ""
    api_tokens_file: str | None = None
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning", "error"] = "INFO"
    # text: a line for people; json: one JSON object a line for log pipelines (app/logs.py).
    log_format: Literal["text", "json"] = "text"
    apply_migrations: bool = True
    # Folders POST /plan may read profiles from (comma-separated), besides configured profiles.
    profile_roots: str = str(REPO_ROOT / "data" / "profiles")
    # Demo and testing knob: the service's clock runs this many times faster than the wall clock
    # (`planner demo` sets it to its --speed). Intervals, timeouts and leases are in scaled seconds.
    time_scale: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    # The per-deployment worker lease, for several replicas on one PostgreSQL database
    # (docs/operations.md): the holder renews it every lease_renew_s, a standby asks as often and
    # at its expiry, so a replica that dies (even SIGKILLed) hands its deployments over within
    # lease_ttl_s. Seconds of the service's clock.
    lease_ttl_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    lease_renew_s: float = Field(default=10.0, gt=0, allow_inf_nan=False)

    @field_validator("lease_renew_s")
    @classmethod
    def _renewed_before_it_expires(cls, renew_s: float, info: ValidationInfo) -> float:
        ttl_s = info.data.get("lease_ttl_s")
        if ttl_s is not None and renew_s >= ttl_s:
            raise ValueError(f"must be shorter than PLANNER_LEASE_TTL_S ({ttl_s:g} s)")
        return renew_s

    # Demo knob: the service's clock is the one another process drives through this file
    # (`planner demo`'s simulated clock, app/workers/clock.py SharedClock); overrides time_scale.
    clock_file: str | None = None
    # A request body above this is refused with 413 before it is read (JSON bodies here are small).
    max_body_bytes: int = Field(default=1024 * 1024, ge=1)
    # Held GET /decisions/wait requests this process keeps at once, in total and per caller (one
    # token; all loopback callers when no tokens are set); beyond them it answers 429.
    max_held_longpolls: int = Field(default=1000, ge=1)
    max_held_longpolls_per_caller: int = Field(default=200, ge=1)

    @field_validator("database_url")
    @classmethod
    def _known_driver(cls, url: str) -> str:
        # Plain postgresql:// means psycopg 3 here (the only PostgreSQL driver we install).
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        if not (url.startswith("sqlite") or url.startswith("postgresql+psycopg://")):
            raise ValueError("must start with sqlite:/// or postgresql://")
        return url

    def tokens(self) -> dict[str, ApiRole]:
        """token → role, from PLANNER_API_TOKENS (`role:token,...`) and PLANNER_API_TOKENS_FILE."""
        entries = [e for e in self.api_tokens.split(",") if e.strip()]
        source = "PLANNER_API_TOKENS"
        if self.api_tokens_file:
            try:
                text = Path(self.api_tokens_file).read_text()
            except OSError as exc:
                raise ConfigError(
                    f"PLANNER_API_TOKENS_FILE: cannot read {self.api_tokens_file}: {exc}"
                ) from None
            entries += [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
            source = "PLANNER_API_TOKENS / PLANNER_API_TOKENS_FILE"
        tokens: dict[str, ApiRole] = {}
        for number, entry in enumerate(entries, start=1):
            role, sep, token = entry.strip().partition(":")
            if not sep or not token:
                # Never echo the entry: without a colon it is most likely a bare secret.
                raise ConfigError(f"{source}: entry {number} is not 'role:token'")
            if role not in ("viewer", "orchestrator", "operator"):
                raise ConfigError(f"{source}: role {role!r} is not one of viewer, orchestrator, operator")
            if len(token) < 8:
                raise ConfigError(f"{source}: the {role} token is shorter than 8 characters")
            tokens[token] = role  # type: ignore[assignment]
        return tokens

    def is_loopback_host(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def check_auth_exposure(self) -> None:
        """Without tokens the API is open, so it may only listen on loopback."""
        if not self.tokens():
            if not self.is_loopback_host():
                raise ConfigError(
                    f"PLANNER_HOST: refusing to listen on {self.host} without API tokens; "
                    "set PLANNER_API_TOKENS (role:token,...) or listen on 127.0.0.1"
                )
            log.warning(
                "no API tokens configured: the API is open to every local process, listening on %s only",
                self.host,
            )


def load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = "PLANNER_" + str(first["loc"][0]).upper() if first["loc"] else "PLANNER_*"
        raise ConfigError(f"{field}: {message(first)}") from None
