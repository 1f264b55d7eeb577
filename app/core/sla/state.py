"""What SLA scaling learns between ticks: the traffic samples, wishes and level history, the
measured scales and scaling latency. The planner owns one per deployment (app/core/planner.py).

Each field is changed by one module, the step that owns it (named in the field's comment); the
others read it. Every record in it is a named, immutable tuple, so a tick's copy shares them."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from app.core.perf.fpm import ForwardPassMetrics
from app.core.sla.forecast import LevelPoint
from app.core.sla.latency import LatencyModels
from app.core.sla.quiet import QuietState
from app.core.sla.shortfall import Shortfall
from app.core.sla.types import EngineKey, TrafficSample
from app.core.types import Role


class Wish(NamedTuple):
    """What one tick asked for (its wish; under attainment sizing its up count): the window of
    step.py keeps the largest."""

    t_s: float
    counts: dict[Role, int]


class LevelRecord(NamedTuple):
    """One tick's levels over the level window, and what that tick forecast of both: the level,
    or where a steady rise was under way, the level it was carried to a lead ahead (the headroom
    is learned beyond it, demand.py)."""

    t_s: float
    tokens_s: float  # prompt tokens per second
    in_flight: float  # requests in decode at the ITL target
    forecast_tokens_s: float
    forecast_in_flight: float


class DecodeFloorSums(NamedTuple):
    """Decode's forward passes, faded: their ratio scales the profile's shape beyond the batches
    seen (learners.py)."""

    measured_s: float = 0.0  # Σ batch × measured time
    profiled_s: float = 0.0  # Σ batch × the profile's time
    updated_s: float | None = None  # when last added to


class HeldContext(NamedTuple):
    """The decode engines' context at one tick of the trend window (decode_wish.py)."""

    t_s: float
    kv_tokens: float
    requests: int


class Order(NamedTuple):
    """An open scale-up order: its age once the engines are ready is a scaling latency."""

    ordered_s: float
    count: int


class PrefillPasses(NamedTuple):
    """The prefill engines' latest forward passes at a tick, for `check_saturated`: their queues,
    and whether each ran a pass since (learners.py)."""

    t_s: float
    by_engine: Mapping[EngineKey, ForwardPassMetrics]


class SharePoint(NamedTuple):
    """One tick's prompt tokens and the tokens prefill computed for them (computed.py)."""

    t_s: float
    prompt_tokens: float
    computed_tokens: float


class Lengths(NamedTuple):
    """The last mean prompt and output lengths seen with traffic (step.py)."""

    isl: float
    osl: float


@dataclass
class SlaState:
    # The traffic samples of the lookback and the wishes of the stabilisation window (step.py).
    samples: deque[TrafficSample] = field(default_factory=deque)
    wishes: deque[Wish] = field(default_factory=deque)
    # The headroom's history (demand.py) and the levels attainment sizing learns from (forecast.py).
    history: deque[LevelRecord] = field(default_factory=deque)
    levels: deque[LevelPoint] = field(default_factory=deque)
    # Measured time over the profile's, per role, and decode's floor sums (learners.py).
    scale: dict[Role, float] = field(default_factory=dict)
    decode_floor_sums: DecodeFloorSums = DecodeFloorSums()
    first_s: float | None = None  # the first tick (step.py)
    held: deque[HeldContext] = field(default_factory=deque)  # decode_wish.py
    # Scaling latency: the open scale-up orders, opened by step.py's `place_orders` and closed by
    # learners.py's `update_lead`, and the measured lead.
    orders: dict[Role, Order] = field(default_factory=dict)
    lead_s: float | None = None
    # The forward passes already learned from, per engine (learners.py).
    seen: dict[tuple[Role, EngineKey], ForwardPassMetrics] = field(default_factory=dict)
    # The engines' learned iteration costs (None until the first tick with a model; step.py starts
    # them from the profile, learners.py trains them) and the prefill capacity correction from
    # their busy time (learners.py).
    latency: LatencyModels | None = None
    correction: float = 1.0
    prefill_passes: PrefillPasses | None = None  # learners.py
    # The share of prompt tokens prefill computes, the points it is read from, and each prefill
    # engine's queued tokens at the last tick (computed.py).
    computed_share: float = 1.0
    shares: deque[SharePoint] = field(default_factory=deque)
    prefill_queues: dict[EngineKey, float] | None = None
    quiet: QuietState = field(default_factory=QuietState)  # quiet.py's `observe`, each tick
    last_tick_s: float | None = None  # step.py
    lengths: Lengths | None = None  # step.py
    # Scale to zero: when a request was last seen (arriving, queued or in flight; the first tick
    # until then), and whether the deployment is at zero now (step.py).
    active_s: float | None = None
    asleep: bool = False
    # Orders whose engines did not come within the bound, per role (shortfall.py; learners.py's
    # `update_lead` records them, step.py caps and ends them). None: none.
    shortfalls: dict[Role, Shortfall] | None = None

    def copy(self) -> SlaState:
        """An independent copy for one tick to change. The elements (samples, tuples, records,
        the latency models and the quiet state) are immutable, so copying the containers is
        enough."""
        return SlaState(
            samples=deque(self.samples),
            wishes=deque(self.wishes),
            history=deque(self.history),
            levels=deque(self.levels),
            scale=dict(self.scale),
            decode_floor_sums=self.decode_floor_sums,
            first_s=self.first_s,
            held=deque(self.held),
            orders=dict(self.orders),
            lead_s=self.lead_s,
            seen=dict(self.seen),
            latency=self.latency,
            correction=self.correction,
            prefill_passes=self.prefill_passes,
            computed_share=self.computed_share,
            shares=deque(self.shares),
            prefill_queues=dict(self.prefill_queues) if self.prefill_queues is not None else None,
            quiet=self.quiet,
            last_tick_s=self.last_tick_s,
            lengths=self.lengths,
            active_s=self.active_s,
            asleep=self.asleep,
            shortfalls=dict(self.shortfalls) if self.shortfalls else None,
        )
