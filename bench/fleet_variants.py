"""Hardware variants in the fleet replay: examples/fleet-variants.yaml's one deployment (chat, a
flash crowd at a quarter of its rate, first 25 minutes, start-up delay 120 s) three ways:

- `variants`: its own H200 engines (budget 4 GPUs) and a stand-in "H100" variant (the H200
  profile with latencies x1.6, budget 24 GPUs), grown cheapest per unit of capacity first;
- `h200 only, 4`: no variants, the same 4 H200 GPUs;
- `h200 only, 28`: no variants, as many GPUs as both budgets together.

    .venv/bin/python -m bench.fleet_variants

Prints one markdown row per run: SLO attainment, GPU-hours (per variant), cost (H200 GPU-hours at
3.50 when there are no variants), the fleet oracle's GPU-hours, peak billed GPUs and grant changes.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from app.sim.fleet.config import load_fleet_config
from app.sim.fleet.outputs import fleet_summary
from app.sim.fleet.run import run_fleet

ROOT = Path(__file__).resolve().parents[1]

EXAMPLE = ROOT / "examples" / "fleet-variants.yaml"
H200_PRICE = 3.50  # the example's price of its own variant


def main() -> int:
    base = load_fleet_config(EXAMPLE)

    def only_h200(budget: int):  # type: ignore[no-untyped-def]
        member = base.fleet.deployments["chat"].model_copy(update={"variants": []})
        fleet = base.fleet.model_copy(
            update={"budget_gpus": {"h200": budget}, "deployments": {"chat": member}}
        )
        return dataclasses.replace(base, fleet=fleet)

    header = ("run", "SLO attainment", "GPU-hours", "by variant", "cost", "oracle GPU-hours", "peak billed")
    print("| " + " | ".join(header) + " | grant changes |")
    print("|---|---|---|---|---|---|---|---|")
    for label, config in (
        ("variants", base),
        ("h200 only, 4", only_h200(4)),
        ("h200 only, 28", only_h200(28)),
    ):
        print(f"{label} ...", file=sys.stderr)
        run = run_fleet(config, "fleet")
        s = fleet_summary(config, run)
        d = s["deployments"]["chat"]
        hours = d.get("gpu_hours_by_variant", {"h200-tp1": d["gpu_hours"]})
        cost = d.get("cost", d["gpu_hours"] * H200_PRICE)
        by_variant = ", ".join(f"{k} {v:.2f}" for k, v in hours.items())
        print(
            f"| {label} | {d['slo_attainment']:.1%} | {d['gpu_hours']:.2f} | {by_variant} | {cost:.2f} "
            f"| {s['oracle_gpu_hours']:.2f} | {s['peak_billed_gpus']} | {d['grant_changes']} |",
            flush=True,
        )
        print(f"  {s['wall_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
