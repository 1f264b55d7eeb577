"""Attainment sizing with one mechanism taken out at a time: what each mechanism earns.

Attainment sizing (`scaling.sizing: attainment`, app/core/sla/decide.py) is one rule (per horizon,
the fewest engines whose expected attainment over the learned demand scenarios meets
`sla.attainment_target`) plus the mechanisms listed in ABLATIONS. Each row replays the same cells
with one of them replaced by its neutral element (no term, no hold, no bound), in the same process
and the same world as the full rule, and reports the mean SLO attainment and GPU-hours over the
oracle's against the full rule's, and the worst cell either way. A mechanism earns its place when
taking it out loses attainment or costs GPU-hours on the workloads it was not tuned on: the
matrix's test half (`bench/replay_quality.py` HALVES) is the default.

    .venv/bin/python -m bench.sla_ablation [--workloads a,b | --half train|test]
        [--worlds profile,smooth] [--delay 120] [--workers 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

from app import planner_setup
from app.core.sla import decide, forecast, step, wish
from app.core.sla.settings import SlaTuning
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
from app.sim.replay.outputs import summarize
from app.sim.replay.request_table import request_table
from app.sim.replay.run import build_world, make_policy, run_policy
from bench.replay_quality import HALVES, workload, world_name

ROOT = Path(__file__).resolve().parents[1]


def _no_trim(original: Callable) -> Callable:
    def as_sized(role, sized, f, **_):  # the count sized at the scenarios' quantile, as it is
        return sized

    return as_sized


def _without_queue(original: Callable) -> Callable:
    def sized_on_demand_alone(*args, **kwargs):
        return original(*args, **{**kwargs, "with_held": False})

    return sized_on_demand_alone


def _released_at_once(original: Callable) -> Callable:
    def forecasts(*args, **kwargs):
        h = original(*args, **kwargs)
        return decide.Horizons(h.up, dataclasses.replace(h.keep, prior=0))

    return forecasts


# name -> (what is taken out, the module attribute replaced (where its caller looks it up) and its
# replacement made from the original; or a scaling: field and its neutral value).
ABLATIONS: dict[str, tuple[str, Any, Any]] = {
    "fewest by expected attainment": (
        "the count stays at the scenarios' quantile",
        (decide, "_fewest"),
        _no_trim,
    ),
    "queue terms": (
        "the count ignores the engines' queues (backlog drain, growth, decode's held requests)",
        (decide, "wishes_at"),
        _without_queue,
    ),
    "backlog growth": (
        "no prompts for what the queue gains before ordered engines serve",
        (wish, "backlog_growth"),
        lambda original: lambda *a, **k: 0.0,
    ),
    "hold while the prior leans": (
        "engines are released before the history holds a lead's pairs",
        (step, "forecasts"),
        _released_at_once,
    ),
    "calibration": (
        "the keep scenarios are not moved by how far past forecasts fell short",
        (forecast, "calibration"),
        lambda original: lambda *a, **k: forecast.Shift(),
    ),
    "keep window": (
        "a count is lowered as soon as the horizons allow, not only to the last lead's highest",
        "keep_window_leads",
        0.0,
    ),
    "utilisation cap": (
        "prefill is planned up to fully busy (prefill_max_utilisation 1)",
        "prefill_max_utilisation",
        1.0,
    ),
    "history-peak bound": ("no bound on the scenarios (forecast_cap)", "forecast_cap", 1e9),
    "cold-start growth": (
        "the prior is the level now, no growth (cold_start_growth)",
        "cold_start_growth",
        1.0,
    ),
}


@contextlib.contextmanager
def ablated(name: str | None) -> Iterator[dict[str, Any]]:
    """The scaling: overrides of `name`'s ablation, with its attribute replaced meanwhile."""
    if name is None:
        yield {}
        return
    _, target, replacement = ABLATIONS[name]
    if isinstance(target, str) and target in SlaTuning.model_fields:
        yield {target: replacement}
        return
    if isinstance(target, str):
        # A parameter of the model, not the deployment's: set where the settings are built.
        target = (planner_setup, "sla_settings")
        field, value = ABLATIONS[name][1], replacement
        replacement = lambda original: (  # noqa: E731
            lambda *a, **k: original(*a, **k).model_copy(update={field: value})
        )
    module, attribute = target
    original = getattr(module, attribute)
    setattr(module, attribute, replacement(original))
    try:
        yield {}
    finally:
        setattr(module, attribute, original)


def run_cell(name: str, world: str, delay_s: float, variants: list[str | None]) -> list[dict]:
    config = with_overrides(load_replay_config(DEFAULT_REPLAY_CONFIG), startup_delay_s=delay_s, truth=world)
    built = build_world(config, workload(name))
    rows = []
    for variant in variants:
        with ablated(variant) as overrides:
            scaling = config.deployment.scaling.model_copy(update={"sizing": "attainment", **overrides})
            w = dataclasses.replace(
                built,
                config=dataclasses.replace(
                    config, deployment=config.deployment.model_copy(update={"scaling": scaling})
                ),
            )
            result = run_policy(w, make_policy("planner", w), trace_name=name)
        table = request_table(result.requests, result.ttft_target_ms, result.itl_target_ms)
        s = summarize(result, table=table, truth=built.truth)
        rows.append(
            {
                "workload": name,
                "world": world_name(world, 1.0),
                "delay_s": delay_s,
                "ablation": variant or "",
                "slo_attainment": s["slo_attainment"],
                "gpu_hours_over_oracle": s["gpu_hours_over_oracle"],
            }
        )
    return rows


def summary(rows: list[dict]) -> str:
    full = {(r["workload"], r["world"]): r for r in rows if not r["ablation"]}
    lines = [
        "| taken out | what changes | mean attainment | mean GPU-h ÷ oracle | worst cell, attainment | "
        "worst cell, GPU-h ÷ oracle |",
        "|---|---|---|---|---|---|",
    ]
    base = list(full.values())
    lines.append(
        f"| nothing (the full rule) | | {np.mean([r['slo_attainment'] for r in base]):.2%} | "
        f"{np.mean([r['gpu_hours_over_oracle'] for r in base]):.3f} | | |"
    )
    for name, (what, _, _) in ABLATIONS.items():
        mine = [r for r in rows if r["ablation"] == name]
        if not mine:
            continue
        d_att = [r["slo_attainment"] - full[(r["workload"], r["world"])]["slo_attainment"] for r in mine]
        d_cost = [
            r["gpu_hours_over_oracle"] - full[(r["workload"], r["world"])]["gpu_hours_over_oracle"]
            for r in mine
        ]
        worst_att, worst_cost = int(np.argmin(d_att)), int(np.argmax(d_cost))
        attainment = np.mean([r["slo_attainment"] for r in mine])
        lines.append(
            f"| {name} | {what} | {attainment:.2%} ({100 * np.mean(d_att):+.2f}) | "
            f"{np.mean([r['gpu_hours_over_oracle'] for r in mine]):.3f} ({np.mean(d_cost):+.3f}) | "
            f"{100 * d_att[worst_att]:+.2f} ({mine[worst_att]['workload']} {mine[worst_att]['world']}) | "
            f"{d_cost[worst_cost]:+.3f} ({mine[worst_cost]['workload']} {mine[worst_cost]['world']}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--workloads", help="comma-separated (default: the test half)")
    chosen.add_argument("--half", choices=tuple(HALVES), default="test")
    parser.add_argument("--worlds", default="profile,smooth", help="comma-separated truth names")
    parser.add_argument("--delay", type=float, default=120.0, help="start-up delay, s")
    parser.add_argument("--ablations", default=",".join(ABLATIONS), help="comma-separated, of ABLATIONS")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "sla_ablation.json")
    args = parser.parse_args(argv)
    names = args.workloads.split(",") if args.workloads else list(HALVES[args.half])
    variants: list[str | None] = [None]
    for a in (x.strip() for x in args.ablations.split(",") if x.strip()):
        if a not in ABLATIONS:
            raise SystemExit(f"--ablations: unknown {a!r} (have: {', '.join(ABLATIONS)})")
        variants.append(a)
    cells = [(n, w) for n in names for w in args.worlds.split(",")]
    started = time.perf_counter()
    rows: list[dict] = []
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = [pool.submit(run_cell, n, w, args.delay, variants) for n, w in cells]
        for i, future in enumerate(as_completed(futures), 1):
            rows += future.result()
            print(
                f"[{i}/{len(cells)}] {rows[-1]['workload']} {rows[-1]['world']}", file=sys.stderr, flush=True
            )
    print(summary(rows))
    print(f"\n{len(cells)} cells x {len(variants)} variants in {time.perf_counter() - started:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
