"""Boundary types of the decision core. Units are in the names; times are seconds (`*_s`) on the
caller's clock: Unix time in the service, the simulator's clock in a replay.

Everything here is plain data shared by the core's rooms and its adapters; it imports nothing else
from the core. Nothing in `app/core` reads the clock or does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

Mode = Literal["disagg", "agg", "prefill", "decode"]
Role = Literal["prefill", "decode", "workers"]
ALL_ROLES: tuple[Role, ...] = ("prefill", "decode", "workers")

_ROLES_BY_MODE: dict[str, tuple[Role, ...]] = {
    "disagg": ("prefill", "decode"),
    "agg": ("workers",),
    "prefill": ("prefill",),
    "decode": ("decode",),
}


def roles_for_mode(mode: str) -> tuple[Role, ...]:
    return _ROLES_BY_MODE[mode]


# A replica target names every role of the deployment's mode: {"prefill": 3, "decode": 5}.
Replicas = dict[Role, int]
# An engine, as its forward passes name it: (worker_id, dp_rank).
EngineKey = tuple[str, int]


class DecisionSource(StrEnum):
    THROUGHPUT = "throughput"
    LOAD = "load"
    SLA = "sla"
    OVERRIDE = "override"


class DecisionStatus(StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SUPERSEDED = "superseded"
    EXPIRED = "expired"
    # Shadow mode: what the planner would have ordered, recorded and never applied.
    SHADOW = "shadow"


class OverrideAction(StrEnum):
    PIN = "pin"
    BOUNDS = "bounds"
    PAUSE = "pause"
    RESUME = "resume"


@dataclass(frozen=True)
class RoleBounds:
    min_replicas: int
    max_replicas: int

    def clamp(self, count: int) -> int:
        """The one place a count is brought within its bounds."""
        return max(self.min_replicas, min(self.max_replicas, count))


@dataclass(frozen=True)
class ActiveOverrides:
    """The overrides in force for one deployment at `now` (expired ones already left out)."""

    pin_id: int | None = None
    pin: Replicas | None = None
    bounds_id: int | None = None
    # Only the fields the operator set: {"prefill": {"min": 2}, "decode": {"max": 8}}.
    bounds: dict[Role, dict[str, int]] = field(default_factory=dict)
    pause_id: int | None = None

    @property
    def paused(self) -> bool:
        return self.pause_id is not None


@dataclass(frozen=True)
class DecisionView:
    """What the protocol needs to know about the latest decision of a deployment."""

    id: int
    replicas: Replicas
    source: DecisionSource
    status: DecisionStatus
    created_s: float  # when it was made, in the tick's seconds


@dataclass(frozen=True)
class Stage:
    """One step of the normalisation chain and why it did what it did."""

    name: str
    replicas: Replicas | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.name, "replicas": self.replicas, "reason": self.reason}


@dataclass(frozen=True)
class TrafficObservation:
    """What the frontend served over one interval, from Prometheus or a direct scrape.

    `num_req` is a count over `duration_s` (not a rate). Any field may be None: unknown is
    never the same as zero traffic, and the tick says so instead of scaling to zero."""

    duration_s: float
    num_req: float | None
    isl: float | None  # mean input tokens per request
    osl: float | None  # mean output tokens per request
    ttft_ms: float | None = None
    itl_ms: float | None = None
    request_duration_s: float | None = None
    # The ISL histogram over the interval: (upper bound in tokens, requests) per bucket, not
    # cumulative, the last bound inf; empty when the source has none.
    isl_buckets: tuple[tuple[float, float], ...] = ()
    # The frontend's gauges at the end of the interval (`dynamo_frontend_queued_requests`,
    # `dynamo_frontend_inflight_requests`): requests waiting for an engine, and requests being
    # served. None: the source has no such series. Scale to zero wakes on them (a request that
    # no engine serves shows here before any latency histogram moves).
    queued_requests: float | None = None
    inflight_requests: float | None = None

    @property
    def complete(self) -> bool:
        values = (self.num_req, self.isl, self.osl, self.ttft_ms, self.itl_ms)
        return all(v is not None and v == v for v in values)  # v == v is False for NaN

    def then(self, later: TrafficObservation) -> TrafficObservation:
        """This interval and the `later` one as one: durations, counts and histograms add, means
        are weighted by their request counts (an unknown count makes the merged means unknown)."""
        na, nb = self.num_req, later.num_req

        def mean(a: float | None, b: float | None) -> float | None:
            if na is None or nb is None:
                return None
            if not na:
                return b
            if not nb:
                return a
            if a is None or b is None:
                return None
            return (a * na + b * nb) / (na + nb)

        counts: dict[float, float] = {}
        for bound, n in (*self.isl_buckets, *later.isl_buckets):
            counts[bound] = counts.get(bound, 0.0) + n
        return TrafficObservation(
            duration_s=self.duration_s + later.duration_s,
            num_req=None if na is None or nb is None else na + nb,
            isl=mean(self.isl, later.isl),
            osl=mean(self.osl, later.osl),
            ttft_ms=mean(self.ttft_ms, later.ttft_ms),
            itl_ms=mean(self.itl_ms, later.itl_ms),
            request_duration_s=mean(self.request_duration_s, later.request_duration_s),
            isl_buckets=tuple(sorted(counts.items())),
            # Gauges are levels, not counts: the later reading is the merged interval's.
            queued_requests=later.queued_requests,
            inflight_requests=later.inflight_requests,
        )


@dataclass(frozen=True)
class TrafficForecast:
    """The predicted load of the next interval, and what the predictors had to say about it."""

    num_req: float
    isl: float
    osl: float
    notes: tuple[str, ...] = ()
