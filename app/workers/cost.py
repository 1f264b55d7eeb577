"""The deployment worker's cost account (app/core/cost/account.py): every tick stores its sample
(the engines billed from that tick on, those idle, GPUs per engine, the price) and the running
totals in its record's `cost` section; the totals advance `/metrics`' counters once the tick is
stored. The store's tick records are the account: a process that takes the lease (at start-up,
or from a leader that stopped) resumes the totals and the last sample from the last stored tick,
and its counters from those totals.

`CostMixin` is this part of `DeploymentWorker` (loop.py), which sets the attributes it names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from app.config import DeploymentConfig
from app.core.cost.account import CostSample, CostTotals, Interval, advance, resume, tick_sample
from app.core.planner import Planner
from app.core.types import Role
from app.reports.metrics import PlannerMetrics
from app.store import ticks as tick_store


@dataclass(frozen=True)
class CostStep:
    """One tick's account, adopted once the tick is stored (`commit_cost`)."""

    section: dict[str, Any]  # the tick record's `cost`
    totals: CostTotals
    sample: CostSample
    billed: Interval | None


class CostMixin:
    config: DeploymentConfig
    planner: Planner
    _metrics: PlannerMetrics
    _cost_totals: CostTotals
    _cost_sample: CostSample | None

    def cost_step(
        self, now: datetime, *, ordered: Mapping[Role, int] | None, ready: Mapping[Role, int] | None, fpm: Any
    ) -> CostStep:
        sample = tick_sample(
            now.timestamp(),
            self.config.roles,
            ordered=ordered,
            ready=ready,
            fpm=fpm,
            gpus_per_engine=self.planner.settings.gpus_per_engine,
            cost_per_gpu_hour=self.config.cost_per_gpu_hour,
        )
        totals, billed = advance(self._cost_totals, self._cost_sample, sample)
        return CostStep({**sample.as_json(), "totals": totals.as_json()}, totals, sample, billed)

    def commit_cost(self, step: CostStep) -> None:
        self._cost_totals, self._cost_sample = step.totals, step.sample
        if step.billed is not None:
            self._metrics.cost.observe(self.config.name, step.billed)

    def resume_cost(self, session: Session) -> None:
        """Continue the account of the last stored tick (none: a fresh one)."""
        last = tick_store.last_tick(session, self.config.name)
        record = last.record if last is not None and isinstance(last.record, Mapping) else {}
        self._cost_totals, self._cost_sample = resume(
            last.at.timestamp() if last is not None else None, record.get("cost")
        )
        self._metrics.cost.resume(self.config.name, self._cost_totals)
