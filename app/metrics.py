"""The planner's own Prometheus metrics (`dynamo_planner_*`), one registry per app instance."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

_ROLE_GAUGES = {
    "prefill": "dynamo_planner_predicted_num_prefill_replicas",
    "decode": "dynamo_planner_predicted_num_decode_replicas",
    "workers": "dynamo_planner_predicted_num_workers_replicas",
}


class PlannerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # Desired (decided) replicas, as in Dynamo's planner_metrics; labelled by deployment
        # because one planner manages several deployments.
        self.desired = {
            role: Gauge(name, f"Replicas of the latest {role} decision", ["deployment"], registry=r)
            for role, name in _ROLE_GAUGES.items()
        }
        self.ready = {
            "prefill": Gauge(
                "dynamo_planner_num_prefill_replicas",
                "Prefill replicas last confirmed by the orchestrator",
                ["deployment"],
                registry=r,
            ),
            "decode": Gauge(
                "dynamo_planner_num_decode_replicas",
                "Decode replicas last confirmed by the orchestrator",
                ["deployment"],
                registry=r,
            ),
            "workers": Gauge(
                "dynamo_planner_num_workers_replicas",
                "Aggregated workers last confirmed by the orchestrator",
                ["deployment"],
                registry=r,
            ),
        }
        self.decisions = Counter(
            "dynamo_planner_decisions", "Decisions created", ["deployment", "source"], registry=r
        )
        self.acks = Counter(
            "dynamo_planner_decision_acks", "Acknowledgements received", ["deployment", "outcome"], registry=r
        )
        self.ticks = Counter("dynamo_planner_ticks", "Worker ticks completed", ["deployment"], registry=r)
        self.tick_failures = Counter(
            "dynamo_planner_tick_failures", "Worker ticks that raised", ["deployment"], registry=r
        )
        self.pending = Gauge(
            "dynamo_planner_pending_decision",
            "1 while the latest decision awaits acknowledgement",
            ["deployment"],
            registry=r,
        )
        self.paused = Gauge(
            "dynamo_planner_paused", "1 while automatic scaling is paused", ["deployment"], registry=r
        )
        self.waiters = Gauge(
            "dynamo_planner_decision_waiters", "Requests held in GET /decisions/wait", registry=r
        )
        # Only on PostgreSQL, where a listener exists: a constant 0 on SQLite would read as an outage.
        self.notify_connected: Gauge | None = None

    def add_notify_gauge(self) -> Gauge:
        if self.notify_connected is None:
            self.notify_connected = Gauge(
                "dynamo_planner_notify_listener_up",
                "1 while the PostgreSQL LISTEN connection for cross-process wake-ups is up",
                registry=self.registry,
            )
        return self.notify_connected

    def observe_decision(self, deployment: str, replicas: dict[str, int], status: str) -> None:
        for role, count in replicas.items():
            self.desired[role].labels(deployment).set(count)
        self.pending.labels(deployment).set(1 if status == "pending" else 0)
