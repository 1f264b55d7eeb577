"""The planner's own Prometheus metrics (`dynamo_planner_*`), one registry per app instance."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge

from app.core.throughput import ThroughputReason

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

        # Throughput scaling, as Dynamo's planner exports it (plus the deployment label).
        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["deployment"], registry=r)

        self.throughput_gauges = {
            ("observed", "ttft_ms"): gauge(
                "dynamo_planner_observed_ttft_ms", "Mean TTFT of the last interval"
            ),
            ("observed", "itl_ms"): gauge("dynamo_planner_observed_itl_ms", "Mean ITL of the last interval"),
            ("observed", "isl"): gauge(
                "dynamo_planner_observed_input_sequence_tokens", "Mean ISL of the last interval"
            ),
            ("observed", "osl"): gauge(
                "dynamo_planner_observed_output_sequence_tokens", "Mean OSL of the last interval"
            ),
            ("predicted", "isl"): gauge(
                "dynamo_planner_predicted_input_sequence_tokens", "Predicted mean ISL of the next interval"
            ),
            ("predicted", "osl"): gauge(
                "dynamo_planner_predicted_output_sequence_tokens", "Predicted mean OSL of the next interval"
            ),
            ("correction", "prefill"): gauge(
                "dynamo_planner_prefill_correction_factor", "Observed over profiled TTFT"
            ),
            ("correction", "decode"): gauge(
                "dynamo_planner_decode_correction_factor", "Observed over profiled ITL"
            ),
        }
        self.observed_rps = gauge(
            "dynamo_planner_observed_requests_per_second", "Requests/s of the last interval"
        )
        self.predicted_rps = gauge(
            "dynamo_planner_predicted_requests_per_second", "Predicted requests/s of the next interval"
        )
        self.throughput_decision = Enum(
            "dynamo_planner_throughput_scaling_decision",
            "Outcome of the last throughput step",
            ["deployment"],
            states=[r.value for r in ThroughputReason],
            registry=r,
        )

    def add_notify_gauge(self) -> Gauge:
        if self.notify_connected is None:
            self.notify_connected = Gauge(
                "dynamo_planner_notify_listener_up",
                "1 while the PostgreSQL LISTEN connection for cross-process wake-ups is up",
                registry=self.registry,
            )
        return self.notify_connected

    def observe_throughput(self, deployment: str, record: dict[str, Any] | None) -> None:
        """Export one throughput step's record; a value the step did not have is left out."""
        if not record:
            return
        self.throughput_decision.labels(deployment).state(record["reason"])
        for (section, key), metric in self.throughput_gauges.items():
            value = (record.get(section) or {}).get(key)
            if isinstance(value, int | float):
                metric.labels(deployment).set(value)
        observed, predicted = record.get("observed") or {}, record.get("predicted") or {}
        if observed.get("num_req") is not None and observed.get("duration_s"):
            self.observed_rps.labels(deployment).set(observed["num_req"] / observed["duration_s"])
        if predicted.get("num_req") is not None and observed.get("duration_s"):
            self.predicted_rps.labels(deployment).set(predicted["num_req"] / observed["duration_s"])

    def observe_decision(self, deployment: str, replicas: dict[str, int], status: str) -> None:
        for role, count in replicas.items():
            self.desired[role].labels(deployment).set(count)
        self.pending.labels(deployment).set(1 if status == "pending" else 0)
