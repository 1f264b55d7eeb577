"""The cost account's Prometheus counters (app/core/cost/account.py), on the planner's registry:
`dynamo_planner_gpu_hours_total{deployment,role}` and `dynamo_planner_cost_total{deployment}`.

They count what the ticks this process stored billed, from the account of the last stored tick
when it took the lease: the leader's counters are the account's totals (`/diagnostics/cost` over
all ticks). A standby's stay where they were when it last led.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from app.core.cost.account import SECONDS_PER_HOUR, CostTotals, Interval


class CostMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.gpu_hours = Counter(
            "dynamo_planner_gpu_hours",
            "GPU-hours billed: engines from their order to their removal, starting ones included",
            ["deployment", "role"],
            registry=registry,
        )
        self.cost = Counter(
            "dynamo_planner_cost",
            "Cost billed: GPU-hours times the deployment's cost_per_gpu_hour (default 1: GPU-hours)",
            ["deployment"],
            registry=registry,
        )
        # What each counter has counted, so that resuming an account adds only what it lacks
        # (a counter cannot be set, and must not go down).
        self._counted: dict[tuple[str, ...], float] = {}

    def _add(self, counter: Counter, labels: tuple[str, ...], amount: float) -> None:
        if amount > 0:
            counter.labels(*labels).inc(amount)
            self._counted[labels] = self._counted.get(labels, 0.0) + amount
        else:
            counter.labels(*labels)  # the series exists from the first tick on

    def observe(self, deployment: str, billed: Interval) -> None:
        for role, gpu_s in billed.gpu_s.items():
            self._add(self.gpu_hours, (deployment, role), gpu_s / SECONDS_PER_HOUR)
        self._add(self.cost, (deployment,), billed.cost)

    def resume(self, deployment: str, totals: CostTotals) -> None:
        """Raise the counters to a resumed account's totals."""
        for role, hours in totals.gpu_hours.items():
            labels = (deployment, role)
            self._add(self.gpu_hours, labels, hours - self._counted.get(labels, 0.0))
        self._add(self.cost, (deployment,), totals.cost - self._counted.get((deployment,), 0.0))
