"""What SLA scaling learns between ticks: the traffic samples, wishes and level history, the
measured scales and scaling latency. The planner owns one per deployment (app/core/planner.py)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from app.core.perf.fpm import ForwardPassMetrics
from app.core.sla.forecast import LevelPoint
from app.core.sla.latency import LatencyModels
from app.core.sla.quiet import QuietState
from app.core.sla.types import EngineKey, TrafficSample
from app.core.types import Role


@dataclass
class SlaState:
    samples: deque[TrafficSample] = field(default_factory=deque)
    wishes: deque[tuple[float, dict[Role, int]]] = field(default_factory=deque)
    # (t, prompt tokens per second, requests in decode at the target) of the level window, and
    # what that tick forecast of both: the level, or where a steady rise was under way, the
    # level it was carried to a lead ahead (the headroom is learned beyond it, demand.py)
    history: deque[tuple[float, float, float, float, float]] = field(default_factory=deque)
    # The level each tick saw (attainment sizing's history of pairs, forecast.py)
    levels: deque[LevelPoint] = field(default_factory=deque)
    scale: dict[Role, float] = field(default_factory=dict)
    # Decode's records, faded: (Σ batch × measured time, Σ batch × the profile's time, when last
    # added). Their ratio scales the profile's shape beyond the batches seen (learners.py).
    decode_floor_sums: tuple[float, float, float | None] = (0.0, 0.0, None)
    first_s: float | None = None
    # The decode engines' (t, Σ KV tokens, Σ requests) of the trend window's ticks: the context
    # decode is sized at (decode_wish.py).
    held: deque[tuple[float, float, int]] = field(default_factory=deque)
    # Scaling latency: the open scale-up orders (role -> (ordered at, count)) and the measurements.
    orders: dict[Role, tuple[float, int]] = field(default_factory=dict)
    lead_s: float | None = None
    seen: dict[tuple[Role, EngineKey], ForwardPassMetrics] = field(default_factory=dict)
    # The engines' learned iteration costs (None until the first tick with a model), the prefill
    # capacity correction from their busy time, and what quiet periods were like.
    latency: LatencyModels | None = None
    correction: float = 1.0
    # The prefill engines' latest forward passes at the last tick (t, per engine), for
    # `check_saturated`: their queues, and whether each ran a pass since.
    prefill_passes: tuple[float, dict[EngineKey, ForwardPassMetrics]] | None = None
    quiet: QuietState = field(default_factory=QuietState)
    last_tick_s: float | None = None
    lengths: tuple[float, float] | None = None  # the last (mean ISL, mean OSL) with traffic
    # Scale to zero: when a request was last seen (arriving, queued or in flight; the first tick
    # until then), and whether the deployment is at zero now.
    active_s: float | None = None
    asleep: bool = False

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
            quiet=self.quiet,
            last_tick_s=self.last_tick_s,
            lengths=self.lengths,
            active_s=self.active_s,
            asleep=self.asleep,
        )
