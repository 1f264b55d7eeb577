"""What a deployment's worker needs besides the database: its performance model (profile), its
load predictors (warm-started from a trace), its traffic source and its connector.

Profiles and warm-up traces are read when the app is built, so a broken file stops
`planner serve` with one line naming the deployment, the file and the key; sources and
connectors are made in the lifespan, where the event loop they use exists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from app.config import ConfigError, DeploymentConfig, KubernetesConnectorConfig
from app.connectors.base import Connector
from app.core.errors import ProfileError
from app.core.interpolation import PerfModel
from app.core.load import LoadModels, LoadSettings
from app.core.predictors import TrafficPredictor
from app.core.sla_scaling import SlaSettings
from app.core.traces import bucket_requests
from app.core.types import Role
from app.sources.fpm import FpmSubscriber
from app.sources.frontend_scrape import FrontendScrapeSource
from app.sources.profile_files import load_profile
from app.sources.traces import load_trace
from app.sources.traffic import TrafficSource, make_traffic_source

log = logging.getLogger(__name__)

# vLLM's default chunk size for chunked prefill, when a deployment does not declare its engines'.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass
class ModelResources:
    model: PerfModel | None
    model_error: str | None
    predictor: TrafficPredictor | None
    warmed_intervals: int
    # Load scaling's regressions, bootstrapped from the profile (None: load scaling is off).
    load_models: LoadModels | None = None
    load_settings: LoadSettings | None = None


def _resolve(path: str, base_dir: Path) -> Path:
    candidate = Path(path)
    return candidate if candidate.is_absolute() else base_dir / candidate


def build_model_resources(deployment: DeploymentConfig, *, base_dir: Path) -> ModelResources:
    """Load the profile and warm the predictors; relative paths are relative to `base_dir`
    (the deployments file's folder). Raises ConfigError naming the deployment and the file."""
    where = f"deployment {deployment.name!r}"
    model, model_error = None, "no profile configured (set `profile:` to a profiling-results folder)"
    profile = None
    if deployment.profile:
        try:
            profile = load_profile(_resolve(deployment.profile, base_dir))
            model = PerfModel.from_profile(profile)
            model_error = None
        except ProfileError as exc:
            raise ConfigError(f"{where}: profile: {exc}") from None

    predictor, warmed = None, 0
    throughput = deployment.throughput
    if throughput.enabled:
        try:
            params = dict(throughput.predictor.params)
            if throughput.predictor.type == "prophet":
                params.setdefault("step_s", throughput.interval_s)  # its time axis is the tick interval
            predictor = TrafficPredictor(throughput.predictor.type, params)
        except ValueError as exc:
            raise ConfigError(f"{where}: throughput.predictor: {exc}") from None
        if throughput.warmup_trace:
            path = _resolve(throughput.warmup_trace, base_dir)
            try:
                requests = load_trace(path)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{where}: throughput.warmup_trace: {exc}") from None
            warmed = predictor.warm(bucket_requests(requests, throughput.interval_s))
            log.info("[%s] predictors warmed with %d intervals from %s", deployment.name, warmed, path)
    load_models = load_settings = None
    if deployment.load.enabled:
        load_models = LoadModels(
            deployment.mode,
            max_samples=deployment.load.window,
            min_observations=deployment.load.min_observations,
        )
        if profile is not None:
            used = load_models.bootstrap(profile)
            log.info("[%s] load regressions bootstrapped from the profile: %s", deployment.name, used)
        load_settings = make_load_settings(deployment, model)
    return ModelResources(model, model_error, predictor, warmed, load_models, load_settings)


def make_sla_settings(deployment: DeploymentConfig, model: PerfModel | None) -> SlaSettings:
    """SLA scaling's settings from the deployment (app/core/sla_scaling.py)."""
    s = deployment.scaling
    decode = deployment.decode
    max_kv = decode.max_kv_tokens or (model.decode.max_kv_tokens if model is not None else 1)
    return SlaSettings(
        ttft_target_ms=deployment.sla.ttft_ms,
        itl_target_ms=deployment.sla.itl_ms,
        bounds=deployment.bounds(),
        chunk_tokens=deployment.prefill.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        max_kv_tokens=int(max_kv),
        quantile=s.quantile,
        prefill_max_utilisation=s.prefill_max_utilisation,
        decode_itl_margin=s.decode_itl_margin,
        decode_peak_quantile=s.decode_peak_quantile,
        level_window_s=s.level_window_s,
        burst_window_s=s.burst_window_s,
        trend_window_s=s.trend_window_s,
        lookback_s=s.lookback_s,
        scale_down_window_s=s.scale_down_window_s,
        scale_down_window_leads=s.scale_down_window_leads,
        startup_estimate_s=s.startup_estimate_s,
        trend=s.trend,
        history_s=s.history_s,
        growth_quantile=s.growth_quantile,
        growth_neighbour_share=s.growth_neighbour_share,
        growth_regression=s.growth_regression,
        cold_start_growth=s.cold_start_growth,
    )


def make_load_settings(deployment: DeploymentConfig, model: PerfModel | None) -> LoadSettings:
    """Targets, bounds and engine capabilities for load scaling. A pending target expires after
    five throughput intervals, as in the reference (§4.7), so a lost scaling request cannot
    freeze load scaling."""
    engines = deployment.workers if deployment.mode == "agg" else deployment.prefill
    kv_role = deployment.workers if deployment.mode == "agg" else deployment.decode
    return LoadSettings(
        mode=deployment.mode,
        ttft_target_ms=deployment.sla.ttft_ms,
        itl_target_ms=deployment.sla.itl_ms,
        sensitivity=deployment.load.sensitivity,
        bounds=deployment.bounds(),
        max_num_batched_tokens=engines.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        max_kv_tokens=kv_role.max_kv_tokens or (model.decode.max_kv_tokens if model is not None else None),
        pending_expiry_s=5 * deployment.throughput.interval_s,
    )


def make_connector(deployment: DeploymentConfig) -> Connector | None:
    """The connector that actuates; None for virtual (the decision in SQL is the actuation) and
    none (advisory)."""
    if isinstance(deployment.connector, KubernetesConnectorConfig):
        from app.connectors.kubernetes import KubernetesConnector

        return KubernetesConnector(deployment.connector, roles=deployment.roles)
    return None


def make_source(
    deployment: DeploymentConfig,
    client: httpx.AsyncClient,
    *,
    monotonic: Callable[[], float] | None = None,
) -> TrafficSource | None:
    """The deployment's traffic source. `monotonic` (accelerated time, PLANNER_TIME_SCALE) is the
    clock a direct frontend scrape measures its intervals with, so that a scrape interval is in
    the same seconds as the service's clock; Prometheus computes its own windows."""
    sources = deployment.sources
    if monotonic is not None and sources.prometheus is None and sources.frontend_url:
        return FrontendScrapeSource(
            sources.frontend_url, model_name=deployment.model_name, client=client, monotonic=monotonic
        )
    return make_traffic_source(deployment, client=client)


def make_fpm_subscribers(
    deployment: DeploymentConfig, *, monotonic: Callable[[], float] | None = None
) -> dict[Role, FpmSubscriber]:
    """One ForwardPassMetrics subscriber per role with endpoints, when load scaling is on or SLA
    scaling decides (it reads the engines' queues and speed), not started: the worker starts and
    stops them. `monotonic` as for `make_source`."""
    if not deployment.load.enabled and deployment.scaling.algorithm != "sla":
        return {}
    return {
        role: FpmSubscriber(
            endpoints,
            engine_timeout_s=deployment.load.engine_timeout_s,
            **({"monotonic": monotonic} if monotonic is not None else {}),
        )
        for role, endpoints in deployment.fpm_endpoints_by_role().items()
        if endpoints
    }
