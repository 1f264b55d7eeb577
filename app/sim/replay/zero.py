"""Scale to zero in a replay: the periods the cluster ran no engine, and each wake-up from them.

Read from what the run recorded (the replica timeline and the requests), not from the planner's
diagnostics, so the figures say what the cluster did whichever policy steered it:

- a **zero period** runs from the moment no engine of any role is billed until one is ordered
  again (the wake-up);
- each **wake-up** reports when it was ordered, when every role had an engine serving again,
  how many requests arrived while none could serve them (from the start of the zero period to
  that ready time: they waited at the router, counted by the frontend's queued gauge), and the
  TTFT of the first of them, the request that found the deployment asleep;
- **GPU-hours saved at zero**: the zero periods' length times the GPUs of one engine of each
  role, the floor the deployment keeps while awake. The replay with scale to zero off gives the
  whole difference (docs/scaling.md); this is the part the zero periods account for.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.sim.world.cluster import ROLES, ReplicaSample
from app.sim.world.engines import SimRequest


def zero_periods(timeline: Sequence[ReplicaSample], end_s: float) -> list[dict[str, float | None]]:
    """[{"start_s", "wake_s", "ready_s"}]: when no engine was billed, when one was ordered again
    (None: never, before `end_s`), when every role served again (None: not before `end_s`)."""
    last: dict[str, ReplicaSample] = {}
    periods: list[dict[str, float | None]] = []
    current: dict[str, float | None] | None = None
    for sample in timeline:
        last[sample.role] = sample
        if len(last) < len(ROLES):
            continue
        if current is None:
            if all(s.billed == 0 and s.target == 0 for s in last.values()):
                current = {"start_s": sample.at_s, "wake_s": None, "ready_s": None}
                periods.append(current)
            continue
        if current["wake_s"] is None and any(s.target > 0 for s in last.values()):
            current["wake_s"] = sample.at_s
        if current["wake_s"] is not None and all(s.ready > 0 for s in last.values()):
            current["ready_s"] = sample.at_s
            current = None
    for period in periods:
        if period["wake_s"] is not None and period["wake_s"] > end_s:
            period["wake_s"] = period["ready_s"] = None
    return periods


def summarize_zero(
    timeline: Sequence[ReplicaSample],
    requests: Sequence[SimRequest],
    *,
    end_s: float,
    gpus_per_engine: Mapping[str, int],
) -> dict[str, Any]:
    """The `scale_to_zero` block of summary.json (see the module docstring)."""
    arrivals = [r.arrival_s for r in requests]  # the cluster keeps them in arrival order
    periods = zero_periods(timeline, end_s)
    zero_s = 0.0
    wake_ups: list[dict[str, Any]] = []
    for period in periods:
        start = float(period["start_s"])  # type: ignore[arg-type]
        wake = period["wake_s"]
        zero_s += (wake if wake is not None else end_s) - start
        if wake is None:
            continue
        ready = period["ready_s"]
        first = bisect_left(arrivals, start)
        last = bisect_left(arrivals, ready if ready is not None else math.inf)
        waker = requests[first] if first < len(requests) else None
        ttft_ms = (
            (waker.first_token_s - waker.arrival_s) * 1000.0
            if waker is not None and waker.first_token_s is not None
            else None
        )
        wake_ups.append(
            {
                "at_s": float(wake),
                "zero_since_s": start,
                "ready_s": float(ready) if ready is not None else None,
                "requests_waited": last - first,
                "first_request_arrival_s": float(waker.arrival_s) if waker is not None else None,
                "first_request_ttft_ms": ttft_ms,
            }
        )
    ttfts = np.array([w["first_request_ttft_ms"] for w in wake_ups if w["first_request_ttft_ms"] is not None])
    floor_gpus = sum(gpus_per_engine.get(role, 1) for role in ROLES)
    return {
        "zero_periods": len(periods),
        "zero_s": zero_s,
        "wake_ups": len(wake_ups),
        "wake_up_ttft_ms": {
            "p50": float(np.percentile(ttfts, 50.0)) if ttfts.size else None,
            "max": float(ttfts.max()) if ttfts.size else None,
        },
        "gpu_hours_saved_at_zero": zero_s * floor_gpus / 3600.0,
        "wake_up_events": wake_ups,
    }
