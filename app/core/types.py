"""Boundary types of the decision core. Units are in the names; times are aware UTC datetimes.

Everything here is plain data: the worker loop builds a `TickSnapshot`, the core returns a
`TickResult`, the store persists both. Nothing in `app/core` reads the clock or does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from app.core.load import LoadTick
    from app.core.sla_scaling import SlaTick
    from app.core.throughput import ThroughputInput, ThroughputSettings

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


class OverrideAction(StrEnum):
    PIN = "pin"
    BOUNDS = "bounds"
    PAUSE = "pause"
    RESUME = "resume"


@dataclass(frozen=True)
class RoleBounds:
    min_replicas: int
    max_replicas: int


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
    created_at: datetime


@dataclass(frozen=True)
class TickSnapshot:
    """Everything one tick may look at."""

    deployment: str
    roles: tuple[Role, ...]
    config_bounds: dict[Role, RoleBounds]
    overrides: ActiveOverrides
    latest_decision: DecisionView | None
    # Throughput scaling's inputs, when it is enabled (None: disabled).
    throughput: ThroughputInput | None = None
    throughput_settings: ThroughputSettings | None = None
    gpus_per_engine: dict[Role, int] = field(default_factory=dict)
    budget_gpus: int | None = None
    # Load scaling's inputs on a load tick (None: not a load tick, or load scaling is off).
    load: LoadTick | None = None
    # With load scaling on, throughput only sets the floor of the load decisions.
    load_enabled: bool = False
    # SLA scaling's tick (None: the seed's modes decide).
    sla: SlaTick | None = None
    # A proposal made elsewhere (tests, later algorithms); None = no opinion.
    proposal: Replicas | None = None
    proposal_source: DecisionSource | None = None


@dataclass(frozen=True)
class Stage:
    """One step of the normalisation chain and why it did what it did."""

    name: str
    replicas: Replicas | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.name, "replicas": self.replicas, "reason": self.reason}


@dataclass(frozen=True)
class TickResult:
    """The core's answer for one tick: a target (or no opinion) with its reasons."""

    target: Replicas | None
    source: DecisionSource | None
    stages: tuple[Stage, ...]
    diagnostics: dict[str, Any]
    # Both modes on: the floor this tick's throughput step set, for the load ticks that follow.
    throughput_floor: Replicas | None = None

    @property
    def reasons(self) -> list[str]:
        return [f"{s.name}: {s.reason}" for s in self.stages]


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

    @property
    def complete(self) -> bool:
        values = (self.num_req, self.isl, self.osl, self.ttft_ms, self.itl_ms)
        return all(v is not None and v == v for v in values)  # v == v is False for NaN


@dataclass(frozen=True)
class TrafficForecast:
    """The predicted load of the next interval, and what the predictors had to say about it."""

    num_req: float
    isl: float
    osl: float
    notes: tuple[str, ...] = ()
