"""Shadow mode's Prometheus gauges (docs/shadow.md), on the planner's registry, for deployments in
shadow mode only: `dynamo_planner_shadow_agreement{deployment,kind}` (kind exact | within_one:
the share of the default window's ticks where the counts agree, app/reports/shadow.py) and
`dynamo_planner_shadow_engines{deployment,role,source}` (source incumbent | planner: the last
tick's counts). An unknown value leaves its series out rather than showing 0."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from app.core.diagnostics import ShadowDiagnostics
from app.reports.shadow import ShadowReport


class ShadowMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.agreement = Gauge(
            "dynamo_planner_shadow_agreement",
            "Shadow mode: share of the last hour's ticks where the planner's counts equal the "
            "incumbent's (kind=exact) or are within one engine per role (kind=within_one)",
            ["deployment", "kind"],
            registry=registry,
        )
        self.engines = Gauge(
            "dynamo_planner_shadow_engines",
            "Shadow mode: engines per role at the last tick, as the incumbent runs them "
            "(source=incumbent) and as the planner would have ordered them (source=planner)",
            ["deployment", "role", "source"],
            registry=registry,
        )

    def observe_tick(self, deployment: str, section: ShadowDiagnostics) -> None:
        for role, row in (section.roles or {}).items():
            for source, value in (("incumbent", row.incumbent), ("planner", row.planner)):
                if value is None:
                    self._drop(self.engines, deployment, role, source)
                else:
                    self.engines.labels(deployment, role, source).set(value)

    def observe_window(self, deployment: str, report: ShadowReport) -> None:
        for kind, share in (("exact", report.exact_share), ("within_one", report.within_one_share)):
            if share is None:
                self._drop(self.agreement, deployment, kind)
            else:
                self.agreement.labels(deployment, kind).set(share)

    @staticmethod
    def _drop(gauge: Gauge, *labels: str) -> None:
        try:
            gauge.remove(*labels)
        except KeyError:
            pass
