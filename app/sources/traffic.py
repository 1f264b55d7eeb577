"""The traffic-source port, and the factory that picks a deployment's adapter.

A traffic source tells the tick loop what the frontend served over the last interval: request
count, mean input/output lengths, mean TTFT/ITL and request duration (`TrafficObservation`). Two
adapters implement it:

- `PrometheusSource` (`app/sources/prometheus.py`): PromQL over Prometheus' HTTP API, the queries
  of Dynamo's planner (reference notes §1.1);
- `FrontendScrapeSource` (`app/sources/frontend_scrape.py`): no Prometheus, the frontend's
  `/metrics` scraped directly and differenced between scrapes.

Both read the same Dynamo frontend metrics and follow the same rules (unknown is None, never 0;
a request count of exactly 0 is a confirmed idle window; failures raise `SourceUnavailableError`
with the reason): the metric names and those rules are in `app/sources/traffic_common.py`, which
the adapters import instead of this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import httpx

from app.core.types import TrafficObservation
from app.sources.frontend_scrape import FrontendScrapeSource
from app.sources.prometheus import PrometheusSource

if TYPE_CHECKING:
    from app.config import DeploymentConfig


@runtime_checkable
class TrafficSource(Protocol):
    """Where the throughput tick learns what the frontend served."""

    name: str

    async def check(self) -> None:
        """Raise `SourceUnavailableError` unless the source answers (start-up readiness)."""
        ...

    async def observe(self, interval_s: float) -> TrafficObservation:
        """What was served over the last `interval_s`; `SourceUnavailableError` when the source
        is down, times out or answers garbage. Fields the source cannot know are None."""
        ...


def make_traffic_source(
    deployment: DeploymentConfig, *, client: httpx.AsyncClient | None = None
) -> TrafficSource | None:
    """The deployment's traffic source: Prometheus if configured, else a direct scrape of
    `frontend_url`, else None (no throughput observations)."""
    sources = deployment.sources
    if sources.prometheus is not None:
        return PrometheusSource(
            sources.prometheus.url,
            labels=sources.prometheus.labels,
            model_name=deployment.model_name,
            client=client,
        )
    if sources.frontend_url:
        return FrontendScrapeSource(sources.frontend_url, model_name=deployment.model_name, client=client)
    return None
