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
from app.core.predictors import TrafficPredictor
from app.core.traces import bucket_requests
from app.sources.frontend_scrape import FrontendScrapeSource
from app.sources.profile_files import load_profile
from app.sources.traces import load_trace
from app.sources.traffic import TrafficSource, make_traffic_source

log = logging.getLogger(__name__)


@dataclass
class ModelResources:
    model: PerfModel | None
    model_error: str | None
    predictor: TrafficPredictor | None
    warmed_intervals: int


def _resolve(path: str, base_dir: Path) -> Path:
    candidate = Path(path)
    return candidate if candidate.is_absolute() else base_dir / candidate


def build_model_resources(deployment: DeploymentConfig, *, base_dir: Path) -> ModelResources:
    """Load the profile and warm the predictors; relative paths are relative to `base_dir`
    (the deployments file's folder). Raises ConfigError naming the deployment and the file."""
    where = f"deployment {deployment.name!r}"
    model, model_error = None, "no profile configured (set `profile:` to a profiling-results folder)"
    if deployment.profile:
        try:
            model = PerfModel.from_profile(load_profile(_resolve(deployment.profile, base_dir)))
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
    return ModelResources(model, model_error, predictor, warmed)


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
