"""A window of tick samples as the cost figures an operator reads (`/diagnostics/cost`, the
dashboard): GPU-hours per role and cost, per hour and per day, the idle share, and the saving
against the static allocation the same history would have needed.

The window runs from its first tick to its last: each interval between two of its ticks is billed
by `account.interval`, the rule the running account (and `/metrics`) uses, so that the report over
all ticks and the account of the last tick agree.

**The history's peak**, per role, is the most engines billed at any tick of the window that began
a billed interval (ordered, ready or still draining; starting engines included). A static
allocation that ran this history without scaling must hold each role's peak all the time: its
GPU-hours are the peaks' GPUs over the billed intervals, at the same GPUs per engine and price.
The saving is its cost less what was billed; negative when scaling cost more than the peak would
have (a history that never came down from its peak, plus the starts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from app.core.cost.account import SECONDS_PER_HOUR, CostSample, CostTotals, Interval, advance

SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class Bucket:
    """One hour or day of the caller's clock (Unix time: UTC), its part of the intervals."""

    start_s: float
    gpu_hours: float
    cost: float


@dataclass(frozen=True)
class CostReport:
    ticks: int
    first_s: float | None
    last_s: float | None
    gpu_hours: dict[str, float]  # per role
    cost: float
    cost_per_gpu_hour: float | None  # the last tick's
    billed_s: float  # the billed intervals' length
    unobserved_s: float
    idle_gpu_hours: float
    idle_share: float | None  # of the GPU-hours whose idleness was known; None: never known
    peak_engines: dict[str, int]
    static_gpu_hours: float
    static_cost: float
    saving: float
    saving_share: float | None  # of the static cost
    per_hour: list[Bucket] = field(default_factory=list)
    per_day: list[Bucket] = field(default_factory=list)

    @property
    def total_gpu_hours(self) -> float:
        return sum(self.gpu_hours.values())


def cost_report(samples: Iterable[CostSample]) -> CostReport:
    """The report over `samples`, in time order, streamed: memory for the buckets, not the ticks."""
    totals, previous = CostTotals(), None
    count, first_s, billed_s = 0, None, 0.0
    peak: dict[str, int] = {}
    # Per role, what one engine held over every billed interval would have used and cost: the
    # static allocation is the peaks times these (the peak is known only at the end).
    engine_gpu_s: dict[str, float] = {}
    engine_cost: dict[str, float] = {}
    hours, days = _Buckets(SECONDS_PER_HOUR), _Buckets(SECONDS_PER_DAY)
    for sample in samples:
        totals, billed = advance(totals, previous, sample)
        if billed is not None:
            _peaks(peak, billed)
            dt = billed.end_s - billed.start_s
            billed_s += dt
            price = billed.sample.cost_per_gpu_hour
            for role, gpus in billed.sample.gpus_per_engine.items():
                engine_gpu_s[role] = engine_gpu_s.get(role, 0.0) + gpus * dt
                engine_cost[role] = engine_cost.get(role, 0.0) + gpus * dt / SECONDS_PER_HOUR * price
            hours.add(billed)
            days.add(billed)
        previous = sample
        count += 1
        first_s = sample.at_s if first_s is None else first_s
    static_gpu_s = sum(n * engine_gpu_s.get(r, 0.0) for r, n in peak.items())
    static_cost = sum(n * engine_cost.get(r, 0.0) for r, n in peak.items())
    saving = static_cost - totals.cost
    return CostReport(
        ticks=count,
        first_s=first_s,
        last_s=previous.at_s if previous is not None else None,
        gpu_hours=totals.gpu_hours,
        cost=totals.cost,
        cost_per_gpu_hour=previous.cost_per_gpu_hour if previous is not None else None,
        billed_s=billed_s,
        unobserved_s=totals.unobserved_s,
        idle_gpu_hours=totals.idle_gpu_s / SECONDS_PER_HOUR,
        idle_share=totals.idle_gpu_s / totals.idle_known_gpu_s if totals.idle_known_gpu_s > 0 else None,
        peak_engines=peak,
        static_gpu_hours=static_gpu_s / SECONDS_PER_HOUR,
        static_cost=static_cost,
        saving=saving,
        saving_share=saving / static_cost if static_cost > 0 else None,
        per_hour=hours.out(),
        per_day=days.out(),
    )


def _peaks(peak: dict[str, int], billed: Interval) -> None:
    for role, n in (billed.sample.billed or {}).items():
        peak[role] = max(peak.get(role, 0), n)


class _Buckets:
    """Intervals' GPU-hours and cost per bucket of `length_s` (aligned on multiples of it), an
    interval across a boundary split in proportion to its time on each side."""

    def __init__(self, length_s: float) -> None:
        self.length_s = length_s
        self.gpu_s: dict[float, float] = {}
        self.cost: dict[float, float] = {}

    def add(self, i: Interval) -> None:
        total_gpu_s = sum(i.gpu_s.values())
        span = i.end_s - i.start_s
        start = i.start_s
        while start < i.end_s:
            bucket = math.floor(start / self.length_s) * self.length_s
            end = min(i.end_s, bucket + self.length_s)
            share = (end - start) / span
            self.gpu_s[bucket] = self.gpu_s.get(bucket, 0.0) + total_gpu_s * share
            self.cost[bucket] = self.cost.get(bucket, 0.0) + i.cost * share
            start = end

    def out(self) -> list[Bucket]:
        return [Bucket(b, self.gpu_s[b] / SECONDS_PER_HOUR, self.cost[b]) for b in sorted(self.gpu_s)]
