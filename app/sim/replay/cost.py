"""What a replay's engines cost: the cluster's replica timeline billed by the planner's own rule
(app/core/cost/account.py), sampled at every change instead of every tick, so that its GPU-hours
are exactly the simulator's (every engine from its order until it stopped) and its cost those
GPU-hours at the deployment's `cost_per_gpu_hour`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from app.core.cost.account import CostSample, CostTotals, advance
from app.sim.world.cluster import ReplicaSample


def timeline_cost(
    timeline: Iterable[ReplicaSample],
    *,
    gpus_per_engine: Mapping[str, int],
    cost_per_gpu_hour: float,
    end_s: float,
) -> CostTotals:
    """The timeline's engines billed until `end_s` (the replay's end)."""
    billed: dict[str, int] = {}
    totals, previous = CostTotals(), None

    def sample(at_s: float) -> CostSample:
        return CostSample(at_s, dict(billed), {}, dict(gpus_per_engine), cost_per_gpu_hour)

    for row in timeline:
        if row.at_s > end_s:
            break  # ordered after the last request finished: the run has ended
        if previous is not None and row.at_s > previous.at_s:
            # The counts since the previous change, billed until this one.
            totals, _ = advance(totals, previous, sample(row.at_s), max_gap_s=math.inf)
        billed[row.role] = row.billed
        previous = sample(row.at_s)
    if previous is not None:
        totals, _ = advance(totals, previous, sample(end_s), max_gap_s=math.inf)
    return totals
