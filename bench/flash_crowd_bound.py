"""What no causal policy can serve of `flash-crowd`: the requests that arrive before any engine
ordered on seeing the crowd could serve.

The crowd (40 -> 400 req/s within 20 s at minute 10) follows ten steady minutes that say nothing
of it. A policy that orders on the first tick that sees it (5 s) gets those engines a start-up
later; the requests of that span meet the engines the steady minutes justified, about a tenth
of what the crowd needs. Routed on arrival, they queue: within the span's first two seconds the
queue holds more than the 1 s TTFT target's work, and every request after that waits behind it.
Unless a policy holds the crowd's engines before it comes (in a trace whose crowd could come at
any minute: always, the cost of `static`), its SLO attainment on this workload is at most about
100% less the share printed here, whatever it does after. The bound is loose the other way too:
the queue built in that span also delays what arrives after it.

A planner decides on tick boundaries, so the second table counts from the onset to a start-up
after the first and the second tick boundary that has seen the crowd: ordering on the first reads
a single tick's rise (about 40 -> 88 requests/s) as the whole crowd, ordering on the second
has seen it twice (the planner's surge, `app/core/sla/demand.py`).

The third table is the other way out: holding the crowd's engines before it comes. The
clairvoyant oracle's plan (the replay's, in the `profile` world) is raised from the start to the
engines it bills for the crowd, until it bills them itself; the GPU-hours that adds, over the
oracle's, is the least a causal policy that serves the crowd's first start-up pays.

    .venv/bin/python -m bench.flash_crowd_bound
"""

from __future__ import annotations

import bisect
import math

from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
from app.sim.replay.run import build_world
from app.sim.world.workload import build_workload

TICK_S = 5.0
DELAYS_S = (30.0, 120.0, 300.0)


def main() -> int:
    requests = build_workload("flash-crowd")
    arrivals = sorted(r.arrival_s for r in requests)
    steady_rps = bisect.bisect(arrivals, 590.0) / 590.0
    # The onset: the first 5 s whose rate is three times the steady minutes'.
    onset_s = next(
        t
        for t in range(int(arrivals[-1]))
        if (bisect.bisect(arrivals, t + TICK_S) - bisect.bisect(arrivals, t)) / TICK_S > 3 * steady_rps
    )
    print(f"flash-crowd: {len(arrivals)} requests, steady {steady_rps:.1f} req/s, crowd from {onset_s} s\n")
    print("| start-up | requests before engines ordered on the crowd serve | share | attainment at most |")
    print("|---|---:|---:|---:|")
    for delay_s in DELAYS_S:
        first = bisect.bisect(arrivals, onset_s + TICK_S + delay_s) - bisect.bisect(arrivals, onset_s)
        share = first / len(arrivals)
        print(f"| {delay_s:g} s | {first} | {share:.1%} | {1 - share:.1%} |")
    first_tick_s = math.ceil(onset_s / TICK_S) * TICK_S
    second_tick_s = first_tick_s + TICK_S
    print(f"\n| start-up | attainment at most, ordered at {first_tick_s:g} s | ... at {second_tick_s:g} s |")
    print("|---|---:|---:|")
    for delay_s in DELAYS_S:
        cells = []
        for order_s in (first_tick_s, second_tick_s):
            lost = bisect.bisect(arrivals, order_s + delay_s) - bisect.bisect(arrivals, onset_s)
            cells.append(f"{1 - lost / len(arrivals):.2%}")
        print(f"| {delay_s:g} s | {' | '.join(cells)} |")
    print("\n| start-up | oracle GPU-hours | its crowd's engines | held from the start | ÷ oracle |")
    print("|---|---:|---|---:|---:|")
    for delay_s in DELAYS_S:
        oracle_gpu_h, crowd, from_s, held_gpu_h = _held_from_start(requests, delay_s)
        print(
            f"| {delay_s:g} s | {oracle_gpu_h:.2f} | {crowd} from {from_s:g} s | "
            f"{oracle_gpu_h + held_gpu_h:.2f} | {(oracle_gpu_h + held_gpu_h) / oracle_gpu_h:.2f}x |"
        )
    return 0


def _held_from_start(requests: list, delay_s: float) -> tuple[float, str, float, float]:
    """(the oracle's GPU-hours, its crowd's engines, when it bills them, the GPU-hours of holding
    them from t = 0 until then)."""
    config = with_overrides(load_replay_config(DEFAULT_REPLAY_CONFIG), startup_delay_s=delay_s)
    oracle = build_world(config, requests).oracle
    steps = oracle.timeline
    peak = max(steps, key=lambda step: sum(step.billed.values()))
    total = sum(peak.billed.values())
    ends = [step.at_s for step in steps[1:]] + [peak.at_s]
    engine_s = sum(
        (total - sum(step.billed.values())) * (end - step.at_s)
        for step, end in zip(steps, ends, strict=True)
        if step.at_s < peak.at_s
    )
    crowd = "/".join(f"{n}{role[0].upper()}" for role, n in peak.billed.items())
    return oracle.gpu_hours, crowd, peak.at_s, engine_s / 3600


if __name__ == "__main__":
    raise SystemExit(main())
