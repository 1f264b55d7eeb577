"""How much of the planner's cost over the oracle is its forecast? The planner replayed with a
clairvoyant headroom, against the same cells of bench/replay_quality.py.

The learned headroom (`_growth_quantiles` in app/core/sla/demand.py: a quantile of how far the
level rose within one lead in the traffic's own past) is replaced, in this process only, by the
truth read from the trace: the highest 60 s request and prompt-token rate centred anywhere in
[now, now + lead], over the trailing 60 s rates now (the planner's trend level). The ramp term is
off (the truth already holds any ramp). Everything else is the planner as shipped: the lead it
measures (the 120 s estimate until its first scale-up is ready), the busiest 10 s, the queueing
model, the 60 s scale-down window. This is an experiment, not a policy: it reads the future.

    .venv/bin/python -m bench.clairvoyant_headroom [--workers 2]

Prints a markdown table (truth scale 1.0, start-up delays 30, 120 and 300 s, both workloads) and
writes bench/results/clairvoyant_headroom.json.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

import app.core.sla.demand as sla_demand
import app.core.sla.step as sla_step
from app.core.sla.types import Growth
from bench.replay_quality import DELAYS_S, WORKLOADS, run_cell, workload

ROOT = Path(__file__).resolve().parents[1]

LEVEL_S = 60.0  # the planner's trend window
STEP_S = 5.0


def clairvoyant(name: str) -> None:
    """Patch SLA scaling, in this process, to take its headroom from the trace `name`."""
    requests = workload(name)
    arrivals = np.array([r.arrival_s for r in requests])
    order = np.argsort(arrivals, kind="stable")
    arrivals = arrivals[order]
    tokens = np.concatenate([[0.0], np.cumsum(np.array([r.isl_tokens for r in requests], float)[order])])

    def rates(end_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        first = np.searchsorted(arrivals, end_s - LEVEL_S, "right")
        last = np.searchsorted(arrivals, end_s, "right")
        return (last - first) / LEVEL_S, (tokens[last] - tokens[first]) / LEVEL_S

    now_s = [0.0]
    learned_demand = sla_demand.demand_at

    def demand(state, now, lead_s, settings):  # type: ignore[no-untyped-def]
        now_s[0] = now
        return learned_demand(state, now, lead_s, settings)

    def growth(history, lead_s, settings):  # type: ignore[no-untyped-def]
        now = now_s[0]
        requests_now, tokens_now = rates(np.array([now]))
        if requests_now[0] <= 0:
            return Growth(1.0, 1.0, (1.0, 1.0), None)
        ahead_requests, ahead_tokens = rates(np.arange(now, now + lead_s + 1e-9, STEP_S) + LEVEL_S / 2)
        g = (max(1.0, ahead_tokens.max() / tokens_now[0]), max(1.0, ahead_requests.max() / requests_now[0]))
        return Growth(g[0], g[1], g, None)

    sla_step.demand_at = demand  # the step's own reference to `demand_at`
    sla_demand._growth_quantiles = growth
    sla_demand._slopes = lambda *args, **kwargs: (0.0, 0.0)


def one(cell: tuple[str, float]) -> dict:
    name, delay_s = cell
    clairvoyant(name)
    (row,) = run_cell(name, delay_s, 1.0, ("planner",))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    cells = [(name, float(delay)) for name in WORKLOADS for delay in DELAYS_S]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(one, cells))
    print("| workload | delay | SLO attainment | TTFT ok | ITL ok | GPU-hours | ÷ oracle |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['workload']} | {row['delay_s']:g} s | {row['slo_attainment']:.2%} | "
            f"{row['ttft_attainment']:.2%} | {row['itl_attainment']:.2%} | {row['gpu_hours']:.2f} | "
            f"{row['gpu_hours_over_oracle']:.2f} |"
        )
    print(f"\n{len(rows)} replays in {time.perf_counter() - started:.0f} s with {args.workers} workers")
    out = ROOT / "bench" / "results" / "clairvoyant_headroom.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
