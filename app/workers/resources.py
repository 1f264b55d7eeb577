"""The adapters a deployment's worker talks to besides the database: its traffic source, its FPM
subscribers and its connector. They are made in the lifespan, where the event loop they use
exists; the planner itself (profile, predictors) is built by app/planner_setup.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx

from app.config import DeploymentConfig, KubernetesConnectorConfig
from app.connectors.base import Connector
from app.core.types import Role
from app.sources.dynamo_discovery import DEFAULT_COMPONENTS, FileDiscovery
from app.sources.fpm import FpmSubscriber
from app.sources.frontend_scrape import FrontendScrapeSource
from app.sources.traffic import TrafficSource, make_traffic_source

log = logging.getLogger(__name__)


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
    """One ForwardPassMetrics subscriber per role with endpoints (listed, or found in Dynamo's
    discovery with `sources.fpm_discovery`), when load scaling is on or SLA scaling decides (it
    reads the engines' queues and speed), not started: the worker starts and stops them.
    `monotonic` as for `make_source`."""
    if not deployment.load.enabled and deployment.scaling.algorithm != "sla":
        return {}
    found = deployment.sources.fpm_discovery
    discovery = FileDiscovery(found.path) if found is not None else None
    subscribers = {}
    listed = deployment.fpm_endpoints_by_role()
    for role in deployment.roles:
        endpoints = listed.get(role, [])
        discover = None
        if found is not None and discovery is not None:
            component = found.components.get(role, DEFAULT_COMPONENTS[role])
            discover = discovery.fpm_discoverer(component, namespace=found.namespace)
        if not endpoints and discover is None:
            continue
        subscribers[role] = FpmSubscriber(
            endpoints,
            engine_timeout_s=deployment.load.engine_timeout_s,
            discover=discover,
            **({"discover_every_s": found.refresh_s} if found is not None else {}),
            **({"monotonic": monotonic} if monotonic is not None else {}),
        )
    return subscribers
