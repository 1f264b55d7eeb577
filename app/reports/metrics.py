"""The planner's own Prometheus metrics (`dynamo_planner_*`), one registry per app instance."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge

from app.core.diagnostics import LoadDiagnostics, SlaDiagnostics, ThroughputDiagnostics, finite_number
from app.core.seed.load_types import LoadReason
from app.core.seed.throughput import ThroughputReason
from app.reports.cost_metrics import CostMetrics
from app.reports.shadow_metrics import ShadowMetrics

log = logging.getLogger(__name__)

_ROLE_GAUGES = {
    "prefill": "dynamo_planner_predicted_num_prefill_replicas",
    "decode": "dynamo_planner_predicted_num_decode_replicas",
    "workers": "dynamo_planner_predicted_num_workers_replicas",
}


# The reference's Enum states (§5.3), in its order: "unset" first, so a deployment's series starts
# there, and the states exist even before our code produces them, so dashboards read the same.
LOAD_STATES: tuple[str, ...] = tuple(r.value for r in LoadReason)
_REFERENCE_THROUGHPUT_STATES = (
    "unset",
    "disabled",
    "no_traffic_data",
    "predict_failed",
    "model_not_ready",
    "set_lower_bound",
    "scale",
)
THROUGHPUT_STATES: tuple[str, ...] = _REFERENCE_THROUGHPUT_STATES + tuple(
    r.value for r in ThroughputReason if r.value not in _REFERENCE_THROUGHPUT_STATES
)

# Per-engine gauges: the load record's engine row field -> (metric name, help). The reference's
# "in-flight" decode KV is what the engine has scheduled (in its running batch).
_ENGINE_GAUGES = {
    "queued_prefill_tokens": (
        "dynamo_planner_engine_queued_prefill_tokens",
        "Prompt tokens waiting in the engine's queue at its last forward pass",
    ),
    "queued_decode_kv_tokens": (
        "dynamo_planner_engine_queued_decode_kv_tokens",
        "KV tokens of decode requests waiting in the engine's queue",
    ),
    "scheduled_decode_kv_tokens": (
        "dynamo_planner_engine_inflight_decode_kv_tokens",
        "KV tokens of the decode requests in the engine's running batch",
    ),
    "estimated_ttft_ms": (
        "dynamo_planner_engine_estimated_ttft_ms",
        "TTFT a request arriving now would see on this engine (FPM regression)",
    ),
    "estimated_itl_ms": (
        "dynamo_planner_engine_estimated_itl_ms",
        "Next ITL on this engine with one more average request (FPM regression)",
    ),
}
_ENGINE_LABELS = ["deployment", "role", "worker_id", "dp_rank"]


def _engine_labels(engine: str) -> tuple[str, str]:
    """(worker_id, dp_rank) of a load record's engine id "<worker_id>:dp<rank>"."""
    worker, sep, rank = engine.rpartition(":dp")
    return (worker, rank) if sep and worker else (engine, "")


_CAPACITY_DOC = "1 while SLA scaling's last order of the role did not become ready within the wait bound"
_SIGNAL_DOC = "1 while the signal has been missing for three ticks in a row (no count is lowered meanwhile)"
_DEGRADED_DOC = "Times a signal became unavailable (three ticks in a row without it)"


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
        # The worker lease (app/workers/loop.py): which process ticks each deployment, and the
        # hand-overs. Set at every lease check; while checks fail (the database is unreachable:
        # dynamo_planner_tick_failures rises) they keep the last check's values.
        self.leader = Gauge(
            "dynamo_planner_leader",
            "1 while this process holds the deployment's worker lease (it ticks the deployment), else 0",
            ["deployment"],
            registry=r,
        )
        self.lease_acquisitions = Counter(
            "dynamo_planner_lease_acquisitions",
            "Times this process took the deployment's worker lease (at start-up, or from a holder "
            "that stopped renewing it)",
            ["deployment"],
            registry=r,
        )
        self.lease_renewals = Counter(
            "dynamo_planner_lease_renewals",
            "Lease checks at which this process kept the deployment's worker lease",
            ["deployment"],
            registry=r,
        )
        self.lease_losses = Counter(
            "dynamo_planner_lease_losses",
            "Times this process found its worker lease taken by another process (its renewals came "
            "later than the lease's TTL)",
            ["deployment"],
            registry=r,
        )
        self.lease_expiry = Gauge(
            "dynamo_planner_lease_expiry_timestamp_seconds",
            "When the deployment's worker lease runs out, whoever holds it, as of this process's last "
            "lease check (Unix time of the holder's clock; absent while nobody holds it)",
            ["deployment"],
            registry=r,
        )
        self.cost = CostMetrics(r)  # the cost account's counters (app/reports/cost_metrics.py)
        self.shadow = ShadowMetrics(r)  # shadow mode's gauges (app/reports/shadow_metrics.py)
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
            states=list(THROUGHPUT_STATES),
            registry=r,
        )

        # Load scaling (reference §7.1), from the tick record's `load` section.
        self.load_decision = Enum(
            "dynamo_planner_load_scaling_decision",
            "Outcome of the last load step",
            ["deployment"],
            states=list(LOAD_STATES),
            registry=r,
        )
        self.estimated_ttft_ms = gauge(
            "dynamo_planner_estimated_ttft_ms", "Estimated TTFT of a request arriving now, max over engines"
        )
        self.estimated_itl_ms = gauge(
            "dynamo_planner_estimated_itl_ms", "Estimated next ITL, max over engines"
        )
        self.sla_target = {
            "ttft_ms": gauge(
                "dynamo_planner_sla_target_ttft_ms", "TTFT target the load step decided against"
            ),
            "itl_ms": gauge("dynamo_planner_sla_target_itl_ms", "ITL target the load step decided against"),
        }
        self.engine_gauges = {
            field: Gauge(name, doc, _ENGINE_LABELS, registry=r)
            for field, (name, doc) in _ENGINE_GAUGES.items()
        }
        self.regression_samples = Gauge(
            "dynamo_planner_regression_samples",
            "Forward passes in the FPM regression's window",
            ["deployment", "model"],
            registry=r,
        )
        self.regression_ready = Gauge(
            "dynamo_planner_regression_ready",
            "1 while the FPM regression can estimate latencies",
            ["deployment", "model"],
            registry=r,
        )
        self.regression_coefficient = Gauge(
            "dynamo_planner_regression_coefficient_seconds",
            "FPM regression coefficient: seconds per unit of the term (the intercept in seconds)",
            ["deployment", "model", "term"],
            registry=r,
        )
        # SLA scaling: the engines each role's demand needs (its wish, before the scale-down
        # stabilisation, the bounds of an override and the GPU budget).
        self.sla_wish = Gauge(
            "dynamo_planner_sla_wish_replicas",
            "Engines SLA scaling's last step found the role needs",
            ["deployment", "role"],
            registry=r,
        )
        # An order not ready within the wait bound (app/core/sla/shortfall.py), and a signal missing
        # three ticks in a row (app/workers/signals.py): what an operator alerts on, per role/signal.
        self.capacity_unavailable = Gauge(
            "dynamo_planner_capacity_unavailable", _CAPACITY_DOC, ["deployment", "role"], registry=r
        )
        self.signal_unavailable = Gauge(
            "dynamo_planner_signal_unavailable", _SIGNAL_DOC, ["deployment", "signal"], registry=r
        )
        self.degraded_signals = Counter(
            "dynamo_planner_degraded_signals_total", _DEGRADED_DOC, ["deployment", "signal"], registry=r
        )
        # The fleet step (app/workers/fleet.py), exported by the process that runs it (holds the
        # fleet lease); the others export nothing for it, as standby workers do for their ticks.
        self.fleet_budget_gpus = Gauge(
            "dynamo_planner_fleet_budget_gpus",
            "GPUs the fleet may use, per GPU type",
            ["gpu_type"],
            registry=r,
        )
        self.fleet_granted_gpus = Gauge(
            "dynamo_planner_fleet_granted_gpus",
            "GPUs the last fleet step granted (engines granted x GPUs per engine)",
            ["deployment", "role"],
            registry=r,
        )
        self.fleet_granted_engines = Gauge(
            "dynamo_planner_fleet_granted_engines",
            "Engines the last fleet step granted",
            ["deployment", "role"],
            registry=r,
        )
        self.fleet_wish_engines = Gauge(
            "dynamo_planner_fleet_wish_engines",
            "Engines the deployment's planner wished (its last proposal within its bounds)",
            ["deployment", "role"],
            registry=r,
        )
        self.fleet_cut = Gauge(
            "dynamo_planner_fleet_cut",
            "1 while the fleet grants the role fewer engines than it wishes",
            ["deployment", "role"],
            registry=r,
        )
        self.fleet_grant_changes = Counter(
            "dynamo_planner_fleet_grant_changes",
            "Fleet steps that changed the deployment's grant",
            ["deployment"],
            registry=r,
        )
        self.fleet_step_failures = Counter(
            "dynamo_planner_fleet_step_failures", "Fleet steps that raised", registry=r
        )
        # The labelled children set for each deployment by its last load step, so the next step
        # removes what it does not set again (departed engines disappear, rather than freeze at
        # their last value). Only this deployment's children: one registry serves all deployments.
        self._load_children: dict[str, list[tuple[Gauge, tuple[str, ...]]]] = {}
        self._load_lock = threading.Lock()

    def observe_fleet(self, budget_gpus: Mapping[str, int], grants: Mapping[str, Any]) -> None:
        """Export one fleet step: `grants` as app/workers/fleet.py stores them (DeploymentGrant.as_dict()
        with `gpus_per_engine`)."""
        for gpu_type, budget in budget_gpus.items():
            self.fleet_budget_gpus.labels(gpu_type).set(budget)
        for name, grant in grants.items():
            for role, g in grant["roles"].items():
                self.fleet_granted_engines.labels(name, role).set(g["engines"])
                gpus = grant["gpus_per_engine"].get(role, 1)
                self.fleet_granted_gpus.labels(name, role).set(g["engines"] * gpus)
                self.fleet_wish_engines.labels(name, role).set(g["wish"])
                self.fleet_cut.labels(name, role).set(1 if g["engines"] < g["wish"] else 0)

    def clear_fleet(self) -> None:
        """Drop the fleet gauges: this process no longer runs the fleet step, and the one that
        does exports them (two processes exporting different grants would read as a conflict)."""
        for gauge in (
            self.fleet_budget_gpus,
            self.fleet_granted_gpus,
            self.fleet_granted_engines,
            self.fleet_wish_engines,
            self.fleet_cut,
        ):
            gauge.clear()

    def add_notify_gauge(self) -> Gauge:
        if self.notify_connected is None:
            self.notify_connected = Gauge(
                "dynamo_planner_notify_listener_up",
                "1 while the PostgreSQL LISTEN connection for cross-process wake-ups is up",
                registry=self.registry,
            )
        return self.notify_connected

    def observe_throughput(
        self, deployment: str, record: ThroughputDiagnostics | Mapping[str, Any] | None
    ) -> None:
        """Export one throughput step's record; a value the step did not have is left out."""
        if not record:
            return
        step = ThroughputDiagnostics.model_validate(record)
        if step.reason in THROUGHPUT_STATES:
            self.throughput_decision.labels(deployment).state(step.reason)
        else:  # a new reason must not fail the tick that was already stored
            log.warning("[%s] throughput reason %r is not an exported state", deployment, step.reason)
        for (section, key), metric in self.throughput_gauges.items():
            value = finite_number(getattr(getattr(step, section), key, None))
            if value is not None:
                metric.labels(deployment).set(value)
        observed, predicted = step.observed, step.predicted
        duration_s = observed.duration_s if observed is not None else None
        if observed is not None and observed.num_req is not None and duration_s:
            self.observed_rps.labels(deployment).set(observed.num_req / duration_s)
        if predicted is not None and predicted.num_req is not None and duration_s:
            self.predicted_rps.labels(deployment).set(predicted.num_req / duration_s)

    def observe_load(
        self,
        deployment: str,
        load: LoadDiagnostics | Mapping[str, Any] | None,
        *,
        load_enabled: bool = True,
    ) -> None:
        """Export one tick's load record (the tick record's `load`, app/core/seed/load.py's step).

        None is a tick without a load step: with `load_enabled` (load scaling on, this was not a
        load tick) the last step's values stay; without it the decision reads `disabled` and the
        load gauges of the deployment go away. Missing values leave their gauges out."""
        with self._load_lock:
            if load is None:
                if load_enabled:
                    self.load_decision.labels(deployment)  # the series exists, at "unset" until a step
                    return
                self._replace_load_children(deployment, [])
                self.load_decision.labels(deployment).state(LoadReason.DISABLED.value)
                return
            step = LoadDiagnostics.model_validate(load)
            if step.reason in LOAD_STATES:
                self.load_decision.labels(deployment).state(step.reason)
            else:
                log.warning("[%s] load reason %r is not an exported state", deployment, step.reason)
            self._replace_load_children(deployment, self._load_values(deployment, step))

    def _load_values(
        self, deployment: str, load: LoadDiagnostics
    ) -> list[tuple[Gauge, tuple[str, ...], float]]:
        """Every labelled value a load record sets, as (gauge, labels, value)."""
        values: list[tuple[Gauge, tuple[str, ...], float]] = []

        def put(gauge: Gauge, labels: tuple[str, ...], value: Any) -> None:
            number = finite_number(value)
            if number is not None:
                values.append((gauge, labels, number))

        put(self.estimated_ttft_ms, (deployment,), load.estimated_ttft_ms)
        put(self.estimated_itl_ms, (deployment,), load.estimated_itl_ms)
        if load.targets is not None:
            for key, gauge in self.sla_target.items():
                put(gauge, (deployment,), getattr(load.targets, key))
        for role, section in (load.roles or {}).items():
            for row in section.engines:
                worker, rank = _engine_labels(row.engine)
                for field, gauge in self.engine_gauges.items():
                    put(gauge, (deployment, role, worker, rank), getattr(row, field, None))
        for model, diag in (load.models or {}).items():
            put(self.regression_samples, (deployment, model), diag.observations)
            if diag.ready is not None:
                put(self.regression_ready, (deployment, model), int(diag.ready))
            for key, value in (diag.coefficients or {}).items():
                # "intercept_s", "<feature>_s"; "clipped" and "rank" describe the fit, not a term.
                if isinstance(key, str) and key.endswith("_s"):
                    put(self.regression_coefficient, (deployment, model, key[:-2]), value)
        return values

    def _replace_load_children(
        self, deployment: str, values: list[tuple[Gauge, tuple[str, ...], float]]
    ) -> None:
        fresh = {(gauge, labels) for gauge, labels, _ in values}
        for gauge, labels in self._load_children.get(deployment, []):
            if (gauge, labels) not in fresh:
                gauge.remove(*labels)
        for gauge, labels, value in values:
            gauge.labels(*labels).set(value)
        self._load_children[deployment] = [(gauge, labels) for gauge, labels, _ in values]

    def observe_sla(self, deployment: str, sla: SlaDiagnostics | Mapping[str, Any] | None) -> None:
        """Export one SLA step's wishes (the tick record's `sla.roles[role].wish`). A step without
        a wish (no traffic data, no model) leaves the last one: unknown is not zero."""
        if not sla:
            return
        record = SlaDiagnostics.model_validate(sla)
        for role, section in (record.roles or {}).items():
            if (wish := finite_number(section.wish)) is not None:
                self.sla_wish.labels(deployment, role).set(wish)
            unavailable = role in (record.capacity_unavailable or {})
            self.capacity_unavailable.labels(deployment, role).set(1 if unavailable else 0)

    def observe_signals(
        self, deployment: str, read: Mapping[str, bool], became: set[str], unavailable: set[str]
    ) -> None:
        """After a tick's reads: every signal it assessed has its series; those unavailable are 1."""
        for signal in read:
            self.signal_unavailable.labels(deployment, signal).set(1 if signal in unavailable else 0)
            self.degraded_signals.labels(deployment, signal)
        for signal in became:
            self.degraded_signals.labels(deployment, signal).inc()

    def observe_lease(
        self, deployment: str, *, was_leader: bool, is_leader: bool, expires_at: datetime | None
    ) -> None:
        """After a lease check of `deployment`: who holds it now, and what changed."""
        self.leader.labels(deployment).set(1 if is_leader else 0)
        if is_leader and not was_leader:
            self.lease_acquisitions.labels(deployment).inc()
        elif is_leader:
            self.lease_renewals.labels(deployment).inc()
        elif was_leader:
            self.lease_losses.labels(deployment).inc()
        if expires_at is None:
            try:
                self.lease_expiry.remove(deployment)
            except KeyError:
                pass  # never set
        else:
            self.lease_expiry.labels(deployment).set(expires_at.timestamp())

    def init_lease(self, deployment: str) -> None:
        """The lease series of `deployment` exist (at 0) before its first lease check."""
        self.leader.labels(deployment).set(0)
        for counter in (self.lease_acquisitions, self.lease_renewals, self.lease_losses):
            counter.labels(deployment)

    def observe_decision(self, deployment: str, replicas: dict[str, int], status: str) -> None:
        for role, count in replicas.items():
            self.desired[role].labels(deployment).set(count)
        self.pending.labels(deployment).set(1 if status == "pending" else 0)
