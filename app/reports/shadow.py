"""The shadow report (docs/shadow.md): over a window of a shadow deployment's tick records, how
often the planner's count agreed with the incumbent autoscaler's, what each side's engines would
cost, and the predicted attainment of each.

- **Agreement**: of the ticks where both counts are known for every role, the share where they
  are equal (`exact`) and where every role is within one engine (`within_one`). No such tick: None.
- **Engine-hours, GPU-hours, cost**: the cost account's billing rule (app/core/cost/account.py
  `interval`), applied to each side's counts: a tick's counts are billed until the next tick of
  the window, at that tick's GPUs per engine and price (its `cost` section); an interval whose
  counts are unknown, or longer than the account's largest billed gap, is not billed.
- **Predicted attainment**: per role, the mean over the ticks that predicted one of each side's
  predicted attainment (app/core/shadow.py), with its caveat: a prediction, not a measurement.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from app.core.cost.account import SECONDS_PER_HOUR, CostSample, interval
from app.core.diagnostics import ShadowDiagnostics, finite_number
from app.core.shadow import CAVEAT
from app.store import ticks as tick_store

DEFAULT_WINDOW_S = 3600.0
# A day: 17 280 ticks at SLA scaling's 5 s, each read as two small sections.
MAX_WINDOW_S = 86400.0
MAX_SHADOW_TICKS = 100_000
SIDES = ("incumbent", "planner")
EMPTY_NOTE = "no shadow tick in the window: nothing to compare yet"


@dataclass
class Side:
    """One side's account over the window."""

    engine_hours: dict[str, float] = field(default_factory=dict)
    gpu_hours: dict[str, float] = field(default_factory=dict)
    cost: float = 0.0
    billed_s: float = 0.0  # the time its engine-hours cover (the rest of the window is unknown)
    attainment_sums: dict[str, float] = field(default_factory=dict)
    attainment_ticks: dict[str, int] = field(default_factory=dict)

    @property
    def gpu_hours_total(self) -> float:
        return sum(self.gpu_hours.values())

    @property
    def mean_attainment(self) -> dict[str, float | None]:
        return {
            role: (self.attainment_sums[role] / n if n else None) for role, n in self.attainment_ticks.items()
        }


@dataclass
class ShadowReport:
    ticks: int = 0
    compared: int = 0  # ticks with both counts known for every role
    exact: int = 0
    within_one: int = 0
    first_s: float | None = None
    last_s: float | None = None
    sides: dict[str, Side] = field(default_factory=lambda: {s: Side() for s in SIDES})
    caveat: str = CAVEAT

    @property
    def exact_share(self) -> float | None:
        return self.exact / self.compared if self.compared else None

    @property
    def within_one_share(self) -> float | None:
        return self.within_one / self.compared if self.compared else None

    @property
    def note(self) -> str | None:
        return EMPTY_NOTE if self.ticks == 0 else None


def _counts(section: ShadowDiagnostics, side: str, roles: tuple[str, ...]) -> dict[str, int] | None:
    """The side's count of every role, or None when any is unknown."""
    out = {}
    for role in roles:
        row = (section.roles or {}).get(role)
        value = getattr(row, side) if row is not None else None
        if value is None or value != int(value):
            return None
        out[role] = int(value)
    return out


def _sample(at_s: float, counts: dict[str, int] | None, cost: Any, roles: tuple[str, ...]) -> CostSample:
    cost = cost if isinstance(cost, Mapping) else {}
    gpus = cost.get("gpus_per_engine") if isinstance(cost.get("gpus_per_engine"), Mapping) else {}
    price = finite_number(cost.get("cost_per_gpu_hour"))
    return CostSample(
        at_s=at_s,
        billed=counts,
        idle={},
        gpus_per_engine={r: int(g) if isinstance(g := gpus.get(r), int) and g >= 1 else 1 for r in roles},
        cost_per_gpu_hour=float(price) if price is not None else 1.0,
    )


def shadow_report(rows: Iterable[tuple[float, Any, Any]], roles: tuple[str, ...]) -> ShadowReport:
    """The report over `(at_s, shadow section, cost section)` rows, oldest first; rows without a
    shadow section (ticks before shadow mode was on) are left out."""
    report = ShadowReport()
    for side in report.sides.values():
        side.attainment_ticks = {r: 0 for r in roles}
        side.attainment_sums = {r: 0.0 for r in roles}
    previous: dict[str, CostSample] = {}
    for at_s, raw, cost in rows:
        if not isinstance(raw, Mapping):
            continue
        section = ShadowDiagnostics.model_validate(raw)
        report.ticks += 1
        report.first_s = at_s if report.first_s is None else report.first_s
        report.last_s = at_s
        counts = {side: _counts(section, side, roles) for side in SIDES}
        ran, ordered = counts["incumbent"], counts["planner"]
        if ran is not None and ordered is not None:
            report.compared += 1
            report.exact += ran == ordered
            report.within_one += all(abs(ran[r] - ordered[r]) <= 1 for r in roles)
        for name, side in report.sides.items():
            before = previous.get(name)
            billed = interval(before, at_s) if before is not None else None
            if billed is not None:
                for role, gpu_s in billed.gpu_s.items():
                    gpus = before.gpus_per_engine.get(role, 1)  # type: ignore[union-attr]
                    side.engine_hours[role] = (
                        side.engine_hours.get(role, 0.0) + gpu_s / gpus / SECONDS_PER_HOUR
                    )
                    side.gpu_hours[role] = side.gpu_hours.get(role, 0.0) + gpu_s / SECONDS_PER_HOUR
                side.cost += billed.cost
                side.billed_s += billed.end_s - billed.start_s
            previous[name] = _sample(at_s, counts[name], cost, roles)
            for role, row in (section.roles or {}).items():
                value = getattr(row, f"attainment_{name}")
                if value is not None and role in side.attainment_ticks:
                    side.attainment_ticks[role] += 1
                    side.attainment_sums[role] += float(value)
    return report


def read_shadow_report(
    session: Session, deployment: str, roles: tuple[str, ...], now: datetime, window_s: float
) -> ShadowReport:
    """The report over the stored ticks of the last `window_s` before `now` (inclusive)."""
    since = now - timedelta(seconds=window_s)
    until = now + timedelta(microseconds=1)
    rows = tick_store.latest_sections(session, deployment, since, until, MAX_SHADOW_TICKS, ("shadow", "cost"))
    return shadow_report(((at.timestamp(), r["shadow"], r["cost"]) for at, r in rows), roles)
