"""SLA scaling's plain data: what a tick reads (`SlaInput`, `TrafficSample`), what the demand
forecast found (`Demand`, `Growth`) and what the step answers (`SlaResult`, `SlaReason`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.core.perf.fpm import ForwardPassMetrics
from app.core.sla.capacity import Bucket, LengthMix
from app.core.types import EngineKey, Replicas, Role


class SlaReason(StrEnum):
    NO_TRAFFIC_DATA = "no_traffic_data"
    MODEL_NOT_READY = "model_not_ready"
    NO_INVENTORY = "no_inventory"  # how many engines run is not known yet: no target
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    HOLD = "hold"  # the wish is below the count, the stabilisation window keeps it
    NO_CHANGE = "no_change"
    SCALED_TO_ZERO = "scaled_to_zero"  # quiet for scale_to_zero.quiet_s: every engine goes
    WAKE_UP = "wake_up"  # a request while at zero: one engine of each role at once
    # An order's engines did not come within the bound: capped at what is ready until the retry.
    CAPACITY_UNAVAILABLE = "capacity_unavailable"


@dataclass(frozen=True)
class TrafficSample:
    """One tick's traffic, as the frontend counted it."""

    end_s: float
    duration_s: float
    num_req: float
    isl: float | None  # mean input tokens
    osl: float | None  # mean output tokens
    isl_buckets: tuple[Bucket, ...] = ()
    # The frontend's gauges at `end_s` (None: not exported): waiting for an engine, being served.
    queued_requests: float | None = None
    inflight_requests: float | None = None


@dataclass(frozen=True)
class SlaInput:
    now_s: float
    traffic: TrafficSample | None
    fpm: Mapping[Role, Mapping[EngineKey, ForwardPassMetrics]]
    ready: Mapping[Role, int]
    expected: Mapping[Role, int]  # what the planner last ordered (starting engines included)
    # False while the caller cannot say how many engines run (a service that just started, before
    # the connector, an acknowledged decision or every role's FPM tells it): zeros are unknowns,
    # and a target computed from them could scale a running cluster down.
    inventory_known: bool = True
    # Every forward pass since the previous tick, per role (training data), and per role whether
    # that is all of them (then their wall times are the engines' busy time).
    fpm_new: Mapping[Role, Sequence[ForwardPassMetrics]] = field(default_factory=dict)
    fpm_complete: Mapping[Role, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class SlaResult:
    replicas: Replicas | None
    reason: SlaReason
    detail: str
    diagnostics: dict[str, Any]


@dataclass(frozen=True)
class Growth:
    """How far the levels may rise within a lead: (prompt tokens, decode requests) ratios."""

    tokens: float  # the larger of the two estimates
    flight: float
    neighbours: tuple[float, float]
    regression: tuple[float, float] | None  # None: `growth_regression` is off
    # The regression's ceiling: the history's median level over the level now (None: off)
    ceiling: tuple[float, float] | None = None


@dataclass(frozen=True)
class Demand:
    """What the engines must serve at `now + lead`."""

    request_rate_s: float  # the level
    token_rate_s: float  # prompt tokens per second to size prefill for
    in_flight_mean: float  # requests in decode at the ITL target, on average
    in_flight: float  # ... at the decode peak quantile: what decode is sized for
    isl: float
    osl: float
    mix: LengthMix
    dispersion: float  # index of dispersion of the per-tick request counts
    growth: Growth | None  # None: no forecast (`trend` off)
    growth_learned: bool  # False: the cold-start headroom (the history is still too short)
    ramp: tuple[float, float]  # slopes of the two levels per second (0 when falling)
    ramp_growth: tuple[float, float] | None  # their growth rates per second, if rising steadily
    level_in_flight: float  # requests in decode at the level alone (no forecast)
    surge: tuple[float, float] | None = None  # a rise under way: (lasted s, request rate carried to)
    flight_dispersion: float | None = None  # decode's if not `dispersion`: decide.SCENARIO_FLIGHT_DISPERSION
