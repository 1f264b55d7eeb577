"""One `planner replay --from-store` run: the window's rebuilt workload (app/sim/replay/from_store.py)
through the simulated cluster under four policies, written as the usual outputs, one folder per
policy, with a comparison of them all and of what the deployment's decisions ordered.

- `planner`: SLA scaling with the stored settings (or the --config file's);
- `recorded`: the stored decisions, each ordered when it was made;
- `peak`: the highest count per role the stored decisions ordered in the window (or in force at
  its start), held all along: the static allocation the cost report's saving is measured
  against (app/core/cost/report.py), here with the attainment it would have had;
- `static`, `oracle`: as `planner replay` computes them.

`planner` and `recorded` start from the counts in force when the window starts (the last
decision before it; the first decision when the deployment has none before), static and the
oracle size their own, as in every replay.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from app.config import ConfigError
from app.core.traces import TraceRequest
from app.sim.replay.config import ReplayConfig
from app.sim.replay.cost import timeline_cost
from app.sim.replay.from_store import RecordedPolicy, StoredTick, engine_seconds, requests_from_ticks
from app.sim.replay.outputs import summarize, write_outputs
from app.sim.replay.policies import Policy, StaticPolicy
from app.sim.replay.run import ProgressLines, World, build_world, load_models, make_policy, run_policy
from app.sim.world.cluster import ROLES

FROM_STORE_POLICIES = ("planner", "recorded", "peak", "static", "oracle")
# The simulator holds every request of a run in memory (a few hundred bytes each, with its
# engines' bookkeeping) and replays some 30,000 a wall second: five million are gigabytes and
# minutes per policy. A longer window is asked for in pieces.
MAX_REQUESTS = 5_000_000
# The per-minute table's bin: an operator reads traffic by the minute.
MINUTE_S = 60.0


@dataclass(frozen=True)
class History:
    """What the store says about the window, as plain data (read by app/cli/replay_store.py)."""

    deployment: str
    start: datetime  # the replay's time 0: the start of the window's first tick interval
    ticks: list[StoredTick]
    # The decisions made inside the window: seconds from time 0, counts per role.
    decisions: list[tuple[float, dict[str, int]]]
    initial: dict[str, int]  # the counts in force at time 0
    end_s: float  # the end of the window's last tick interval
    source: dict[str, Any]  # how the store and the window were named, for summary.json


def check_window(history: History) -> None:
    """ConfigError unless the window holds between one and MAX_REQUESTS requests."""
    stored = sum(t.observation.num_req or 0.0 for t in history.ticks if t.observation is not None)
    if stored < 1:
        raise ConfigError(
            f"--since/--until: the window's {len(history.ticks)} ticks of {history.deployment!r} "
            "observed no request"
        )
    if stored > MAX_REQUESTS:
        raise ConfigError(
            f"--since/--until: the window holds {stored:,.0f} requests, more than the {MAX_REQUESTS:,} "
            "one replay simulates; replay a shorter window"
        )


def stored_engine_hours(history: History) -> dict[str, float]:
    """Per role, the engine-hours the stored decisions ordered over the window."""
    seconds = engine_seconds(history.decisions, start=history.initial, end_s=history.end_s)
    return {role: s / 3600.0 for role, s in seconds.items()}


def peak_counts(history: History) -> dict[str, int]:
    """Per role the highest count the window's decisions (or the counts in force at its start)
    ordered."""
    orders = [history.initial, *(counts for _, counts in history.decisions)]
    return {role: max(counts.get(role, 0) for counts in orders) for role in ROLES}


def _policy(name: str, history: History, world: World) -> Policy:
    if name == "recorded":
        return RecordedPolicy(history.initial, history.decisions)
    if name == "peak":
        peak = peak_counts(history)
        reason = f"peak: the stored decisions' highest counts held all along: {peak}"
        return StaticPolicy(peak, reason, name="peak")
    return make_policy(name, world)


def run_from_store(
    config: ReplayConfig,
    history: History,
    out: Path,
    *,
    policies: tuple[str, ...] = FROM_STORE_POLICIES,
    note: Callable[[str], None] | None = None,
    started_s: float | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Replay the window under each policy; write `out/<policy>/` and `out/comparison.json`,
    `out/per_minute.csv`. Returns the comparison. `quiet`: no notes or progress on stderr."""
    if quiet:
        note = note or (lambda message: None)
    note = note or (lambda message: print(message, file=sys.stderr, flush=True))
    started_s = time.perf_counter() if started_s is None else started_s
    sim = config.simulation.model_copy(
        update={
            "initial_prefill": history.initial.get("prefill"),
            "initial_decode": history.initial.get("decode"),
        }
    )
    config = ReplayConfig(path=config.path, deployment=config.deployment, simulation=sim)
    check_window(history)
    requests = requests_from_ticks(history.ticks, seed=sim.seed)
    note(
        f"store: {len(history.ticks)} ticks of {history.deployment!r} from {history.start.isoformat()}, "
        f"{len(requests)} requests over {history.end_s:.0f} s, {len(history.decisions)} decisions"
    )
    note("computing the clairvoyant oracle ...")
    world = build_world(config, requests, load_models(config))
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict[str, Any]] = {}
    for name in policies:
        policy = _policy(name, history, world)
        settings = {**history.source, "policy": name, "deployment": history.deployment, "seed": sim.seed}
        progress = None if quiet else ProgressLines(f"replay {name}", started_s=started_s, stream=sys.stderr)
        result = run_policy(
            world, policy, trace_name=f"store:{history.deployment}", settings=settings, progress=progress
        )
        summary = summarize(result, truth=world.truth)
        try:
            write_outputs(result, out / name, summary=summary)
        except OSError as exc:
            raise ConfigError(f"--out: cannot write the outputs to {out}: {exc.strerror or exc}") from None
        rows[name] = _row(summary, gpus=world.gpus_per_engine)
        # Over the window alone, as the stored decisions are counted: the run itself goes on
        # until its last request has finished.
        window = timeline_cost(
            result.timeline, gpus_per_engine=world.gpus_per_engine, cost_per_gpu_hour=1.0, end_s=history.end_s
        )
        rows[name]["window_engine_hours"] = sum(
            hours / world.gpus_per_engine[role] for role, hours in window.gpu_hours.items()
        )
    hours = stored_engine_hours(history)
    comparison = {
        **history.source,
        "deployment": history.deployment,
        "requests": len(requests),
        "window_s": history.end_s,
        "policies": rows,
        # What the deployment's own decisions ordered; its SLO attainment is not stored.
        "stored": {
            "engine_hours": sum(hours.values()),
            "engine_hours_by_role": hours,
            "gpu_hours": sum(h * world.gpus_per_engine[role] for role, h in hours.items()),
        },
    }
    (out / "comparison.json").write_text(
        json.dumps(comparison, indent=2, default=str) + "\n", encoding="utf-8"
    )
    _write_per_minute(out / "per_minute.csv", history, requests)
    return comparison


def _row(summary: dict[str, Any], *, gpus: dict[str, int]) -> dict[str, Any]:
    by_role = summary["gpu_hours_by_role"]
    return {
        "slo_attainment": summary["slo_attainment"],
        "ttft_attainment": summary["ttft_attainment"],
        "itl_attainment": summary["itl_attainment"],
        "gpu_hours": summary["gpu_hours"],
        "engine_hours": sum(by_role[role] / gpus[role] for role in ROLES),
        "engine_hours_by_role": {role: by_role[role] / gpus[role] for role in ROLES},
        "cost": summary["cost"],
        "scaling_actions": summary["scaling_actions"],
    }


def _write_per_minute(path: Path, history: History, requests: list[TraceRequest]) -> None:
    """Per minute of the window: the requests, mean ISL and OSL the ticks stored (each tick in
    the minute its interval ended) beside those of the rebuilt workload."""
    minutes = int(history.end_s // MINUTE_S) + 1
    stored = np.zeros((minutes, 3))  # requests, Σ isl·n, Σ osl·n
    for tick in history.ticks:
        obs = tick.observation
        if obs is None or not obs.num_req:
            continue
        m = min(int(tick.end_s // MINUTE_S), minutes - 1)
        stored[m, 0] += obs.num_req
        stored[m, 1] += (obs.isl or 0.0) * obs.num_req
        stored[m, 2] += (obs.osl or 0.0) * obs.num_req
    rebuilt = np.zeros((minutes, 3))
    for r in requests:
        m = min(int(r.arrival_s // MINUTE_S), minutes - 1)
        rebuilt[m] += (1, r.isl_tokens, r.osl_tokens)

    def mean(table: np.ndarray, m: int, column: int) -> float | None:
        return round(table[m, column] / table[m, 0], 1) if table[m, 0] else None

    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(
            (
                "minute",
                "stored_requests",
                "stored_isl",
                "stored_osl",
                "rebuilt_requests",
                "rebuilt_isl",
                "rebuilt_osl",
            )
        )
        for m in range(minutes):
            writer.writerow(
                (
                    m,
                    round(stored[m, 0], 3),
                    mean(stored, m, 1),
                    mean(stored, m, 2),
                    int(rebuilt[m, 0]),
                    mean(rebuilt, m, 1),
                    mean(rebuilt, m, 2),
                )
            )
