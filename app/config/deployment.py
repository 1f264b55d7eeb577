"""One deployment of the deployments file: its SLA targets, roles, connector, seed modes, SLA
scaling settings and traffic sources (`DeploymentConfig`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from app.config.base import Strict
from app.core.sla.settings import SlaTuning
from app.core.types import Mode, Role, RoleBounds, roles_for_mode


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
# Shadow mode (docs/shadow.md): read what the incumbent autoscaler runs, decide, never write.
ConnectorMode = Literal["control", "shadow"]
_MODE = (
    "control: the planner's decisions are applied; shadow: the planner reads what runs and "
    "records what it would have ordered beside it, and never writes to the cluster"
)


class VirtualConnectorConfig(Strict):
    """Decisions in SQL, long-polled and acknowledged by an orchestrator."""

    type: Literal["virtual"] = Field(description="virtual: an orchestrator applies the decisions")
    mode: ConnectorMode = Field(default="control", description=_MODE)
    ack_timeout_s: float = Field(default=1800.0, gt=0, description=_ACK_TIMEOUT)


class NoneConnectorConfig(Strict):
    """Advisory: decide, persist and export, actuate nothing. It has no `mode`: there is nothing
    it reads of what runs to compare with (shadow mode is the virtual or Kubernetes connector's)."""

    type: Literal["none"] = Field(description="none: advisory, nothing is actuated")
    ack_timeout_s: float = Field(default=1800.0, gt=0, description=_ACK_TIMEOUT)


class KubernetesConnectorConfig(Strict):
    """Scale a Dynamo DynamoGraphDeployment (DGD); see docs/kubernetes.md."""

    type: Literal["kubernetes"] = Field(description="kubernetes: patch the DGD's replicas")
    mode: ConnectorMode = Field(default="control", description=_MODE)
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
    request_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="each Kubernetes API call gives up after this long (s); a read that times out "
        "misses the tick's inventory, a write fails the decision",
    )
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
    cost_per_gpu_hour: float = Field(
        default=1.0,
        gt=0,
        allow_inf_nan=False,
        description="what one of its GPUs costs per hour, in any currency (default 1: the cost "
        "figures read as GPU-hours); with hardware variants, the first variant's price_per_gpu_hour",
    )
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
        """Only an orchestrator behind the virtual connector acknowledges decisions, and only in
        control mode: a shadow decision is applied by nobody."""
        return self.connector.type == "virtual" and not self.shadow

    @property
    def shadow(self) -> bool:
        """Shadow mode: what runs is read, what the planner would order is recorded, nothing is
        written (docs/shadow.md)."""
        return getattr(self.connector, "mode", "control") == "shadow"

    def bounds(self) -> dict[Role, RoleBounds]:
        """The configured min/max replicas of every role of the mode."""
        return {r: RoleBounds(self.role(r).min_replicas, self.role(r).max_replicas) for r in self.roles}

    def with_absolute_paths(self, base_dir: Path) -> dict[str, Any]:
        """This entry as a deployments file would hold it (JSON-ready), its profile and warm-up
        trace resolved against `base_dir` (the folder of the file it came from), so that it reads
        the same files from anywhere."""
        raw = self.model_dump(mode="json", exclude_none=True)
        if self.profile:
            raw["profile"] = str((base_dir / Path(self.profile).expanduser()).resolve())
        if self.throughput.warmup_trace:
            raw["throughput"]["warmup_trace"] = str(
                (base_dir / Path(self.throughput.warmup_trace).expanduser()).resolve()
            )
        return raw

    @property
    def tick_interval_s(self) -> float:
        """The worker ticks at the fastest enabled cadence (the throughput interval if none is);
        SLA scaling at its own interval."""
        if self.scaling.algorithm == "sla":
            return self.scaling.interval_s
        intervals = [c.interval_s for c in (self.throughput, self.load) if c.enabled]
        return min(intervals) if intervals else self.throughput.interval_s
