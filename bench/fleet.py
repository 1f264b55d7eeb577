"""A fleet under one GPU budget: the fleet step against static equal shares and first come first served.

Three deployments of examples/fleet.yaml, each with its own trace and SLA-scaling planner, share
24 H200 GPUs; alone, their wishes peak at 21 + 11 + 6 = 38 GPUs. Policies (app/sim/fleet/run.py):

- `fleet`: the fleet step (app/core/fleet/step.py): guarantees, priority, then marginal value, with
  hysteresis, others' engines taken only for the load now (not forecast headroom); each planner
  runs within its grant;
- `equal`: static equal shares: each planner within 24 / 3 = 8 GPUs, whatever the others do;
- `fcfs`: independent planners that ignore each other, clipped at the budget first come first
  served (an engine once granted is kept until its own planner lets it go);
- `oracle`: every future known: each deployment's clairvoyant r* (app/sim/replay/oracle.py), cut to the
  budget by the fleet step, each run on its cheapest schedule (app/sim/fleet/oracle.py).

Scenarios: `example` is the file as committed (chat: flash crowd, priority 3; code: bursty
gaps, priority 2; batch: diurnal, priority 1); `reversed` swaps chat's and batch's priorities
(the smooth diurnal deployment first, the flash crowd last), so that priority order is not
confounded with which trace is hardest to serve; `tight` is `example` with 12 GPUs instead of 24,
below what the oracle needs at the crowd's peak (18), so that the budget binds even for it (run
it with `--scenarios tight`); `tight-reversed` is `reversed` with 12 GPUs (a held-out check of
the fleet step's rules under a binding budget with the priorities swapped). Traces at a quarter
of their workload's rate, the first 25 minutes; start-up delay 120 s.

    .venv/bin/python -m bench.fleet [--scenarios example,reversed] [--policies fleet,equal,fcfs,oracle]
        [--trace-seed N]

Prints one markdown table per scenario: per deployment, SLO attainment, GPU-hours, GPU-hours over
the fleet oracle's plan, and grant changes (how many fleet ticks changed its grant), and the
fleet's request-weighted attainment.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from app.sim.fleet.config import load_fleet_config
from app.sim.fleet.outputs import fleet_summary
from app.sim.fleet.run import FLEET_POLICIES, run_fleet

ROOT = Path(__file__).resolve().parents[1]

EXAMPLE = ROOT / "examples" / "fleet.yaml"
# Below the 18 GPUs the fleet oracle needs at once for these traces (docs/fleet.md), above the
# guarantees' 8: a budget that binds even when every future is known.
TIGHT_GPUS = 12


def scenario(name: str):  # type: ignore[no-untyped-def]
    config = load_fleet_config(EXAMPLE)
    if name == "example":
        return config
    if name == "reversed":
        members = dict(config.fleet.deployments)
        chat, batch = members["chat"], members["batch"]
        members["chat"] = chat.model_copy(update={"priority": batch.priority})
        members["batch"] = batch.model_copy(update={"priority": chat.priority})
        fleet = config.fleet.model_copy(update={"deployments": members})
        return dataclasses.replace(config, fleet=fleet)
    if name == "tight":
        fleet = config.fleet.model_copy(update={"budget_gpus": {"h200": TIGHT_GPUS}})
        return dataclasses.replace(config, fleet=fleet)
    if name == "tight-reversed":
        reversed_ = scenario("reversed")
        fleet = reversed_.fleet.model_copy(update={"budget_gpus": {"h200": TIGHT_GPUS}})
        return dataclasses.replace(reversed_, fleet=fleet)
    raise SystemExit(f"unknown scenario {name!r} (example, reversed, tight, tight-reversed)")


def _ratio(gpu_hours: float, oracle_gpu_hours: float) -> str:
    return f"{gpu_hours / oracle_gpu_hours:.2f}x" if oracle_gpu_hours else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="example,reversed")
    parser.add_argument("--policies", default=",".join(FLEET_POLICIES))
    # Another sample of the same workloads (each trace's thinning to a quarter of its rate).
    parser.add_argument(
        "--trace-seed", type=int, default=None, help="every trace's seed (default: the file's)"
    )
    args = parser.parse_args()
    for name in args.scenarios.split(","):
        config = scenario(name)
        if args.trace_seed is not None:
            traces = {n: t.model_copy(update={"seed": args.trace_seed}) for n, t in config.traces.items()}
            config = dataclasses.replace(config, traces=traces)
            name = f"{name}, trace seed {args.trace_seed}"
        rows = []
        for policy in args.policies.split(","):
            print(f"{name}: {policy} ...", file=sys.stderr)
            run = run_fleet(config, policy)
            summary = fleet_summary(config, run)
            print(f"  {summary['wall_s']:.0f} s", file=sys.stderr)
            if policy == args.policies.split(",")[0]:
                print(
                    f"  oracle: {summary['oracle_gpu_hours']:.2f} GPU-hours, the budget cut r* in "
                    f"{summary['oracle_cut_intervals']} intervals",
                    file=sys.stderr,
                )
            rows.append(summary)
        budget = ", ".join(f"{g} {t}" for t, g in config.fleet.budget_gpus.items())
        print(f"\n### {name}: budget {budget} GPUs\n")
        header = ("policy", "deployment", "priority", "guaranteed", "trace", "SLO attainment", "GPU-hours")
        print("| " + " | ".join(header) + " | over oracle | grant changes |")
        print("|---|---|---|---|---|---|---|---|---|")
        for s in rows:
            for dep, d in s["deployments"].items():
                print(
                    f"| {s['policy']} | {dep} | {d['priority']} | {d['guaranteed_gpus']} | {d['trace']} "
                    f"| {d['slo_attainment']:.1%} | {d['gpu_hours']:.2f} "
                    f"| {_ratio(d['gpu_hours'], d['oracle_gpu_hours'])} | {d['grant_changes']} |"
                )
            total = (
                f"**{s['slo_attainment']:.1%}** | **{s['gpu_hours']:.2f}** "
                f"| **{_ratio(s['gpu_hours'], s['oracle_gpu_hours'])}**"
            )
            print(
                f"| {s['policy']} | **fleet** | | | | {total} "
                f"| {s['grant_changes']} (peak billed {s['peak_billed_gpus']}) |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
