"""A replay's outputs: summary.json, requests.csv.gz, replicas.csv, decisions.csv and report.html.

Per-request quantities come from one `request_table` (`app/sim/replay/request_table.py`, which also states
the SLO rules), computed once and shared by every file written here.
"""

from __future__ import annotations

import csv
import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.sim.replay.cost import timeline_cost
from app.sim.replay.request_table import RequestTable, request_table
from app.sim.replay.results import ReplayResult
from app.sim.replay.zero import summarize_zero
from app.sim.world.cluster import ROLES, ReplicaSample
from app.sim.world.engines import SimRequest
from app.sim.world.truth import TruthModel

REQUEST_COLUMNS = (
    "id",
    "arrival_s",
    "isl",
    "osl",
    "prefill_engine",
    "decode_engine",
    "ttft_ms",
    "itl_ms",
    "e2e_s",
    "met_slo",
)
REPLICA_COLUMNS = ("at_s", "role", "target", "billed", "ready", "starting", "draining")
DECISION_COLUMNS = ("at_s", "target_prefill", "target_decode", "reason")

# CSV precision: a microsecond is far below anything the simulation resolves, and full float reprs
# would double the size of a 600k-row requests table.
_SECONDS_DECIMALS = 6
_MS_DECIMALS = 3


def _share(mask: np.ndarray) -> float | None:
    return float(mask.mean()) if mask.size else None


def latency_stats(values: np.ndarray) -> dict[str, float | None]:
    """p50/p90/p99 (numpy's default, linear) and mean of the known (non-NaN) values."""
    known = values[~np.isnan(values)]
    if not known.size:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    p50, p90, p99 = np.percentile(known, [50.0, 90.0, 99.0])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(known.mean())}


def target_changes(timeline: Sequence[ReplicaSample]) -> tuple[dict[str, int], dict[str, int]]:
    """Per role: how many times the target changed, and Σ |Δ target|. A role's first sample is its
    starting point, not a change; samples that only record engines becoming ready or stopping
    repeat the target and count for nothing."""
    actions = dict.fromkeys(ROLES, 0)
    churn = dict.fromkeys(ROLES, 0)
    last: dict[str, int] = {}
    for sample in timeline:
        previous = last.get(sample.role)
        if previous is not None and sample.target != previous:
            actions[sample.role] = actions.get(sample.role, 0) + 1
            churn[sample.role] = churn.get(sample.role, 0) + abs(sample.target - previous)
        last[sample.role] = sample.target
    return actions, churn


def unservable_mask(
    requests: Sequence[SimRequest], truth: TruthModel, *, ttft_target_ms: float, itl_target_ms: float
) -> np.ndarray:
    """Per request, in order: could no allocation serve it within the targets in this world? The
    prompt alone on an idle prefill engine (`truth.prefill_request_s`, the world's chunking and
    prefix cost included) takes longer than the TTFT target, or, for more than one output token,
    the decode alone (batch 1, at the context the engine times it at: ISL + 1 + (OSL − 1) / 2)
    takes longer per token than the ITL target. Their misses are the world's, not the policy's."""
    late: dict[tuple[int, int], bool] = {}  # a trace repeats its shapes: each is timed once
    mask = np.zeros(len(requests), dtype=bool)
    for i, r in enumerate(requests):
        shape = (r.isl, r.osl)
        if shape not in late:
            isl, osl = shape
            prefill_ms = truth.prefill_request_s(isl) * 1000.0
            decode_ms = truth.decode_iteration_s(isl + 1 + (osl - 1) / 2, 1) * 1000.0 if osl > 1 else 0.0
            late[shape] = prefill_ms > ttft_target_ms or decode_ms > itl_target_ms
        mask[i] = late[shape]
    return mask


def unservable_requests(
    requests: Sequence[SimRequest], truth: TruthModel, *, ttft_target_ms: float, itl_target_ms: float
) -> int:
    """How many requests no allocation could serve within the targets (`unservable_mask`)."""
    return int(
        unservable_mask(requests, truth, ttft_target_ms=ttft_target_ms, itl_target_ms=itl_target_ms).sum()
    )


def summarize(
    result: ReplayResult, *, table: RequestTable | None = None, truth: TruthModel | None = None
) -> dict[str, Any]:
    """The run's headline numbers, JSON-ready (plain floats and ints, None for undefined).
    `truth`, the world the run was in, gives `unservable_requests` and `truth` (None without)."""
    if table is None:
        table = request_table(result.requests, result.ttft_target_ms, result.itl_target_ms)
    finished = table.finished
    actions, churn = target_changes(result.timeline)
    summary = {
        "policy": result.policy,
        "trace": result.trace,
        "requests": len(table),
        "completed": int(finished.sum()),
        "unfinished": int((~finished).sum()),
        # Of the unfinished: cut off by an engine's removal (only with a removal grace period).
        "cut_off": int(result.cut_off),
        "slo_attainment": _share(table.met_slo),
        "ttft_attainment": _share(table.met_ttft),
        "itl_attainment": _share(table.met_itl),
        # Latency distributions are over finished requests only: an unfinished request's latency
        # is unknown (it is already counted as a miss above).
        "ttft_ms": latency_stats(table.ttft_ms[finished]),
        "itl_ms": latency_stats(table.itl_ms[finished]),
        "gpu_hours": float(result.gpu_hours),
        "oracle_gpu_hours": float(result.oracle_gpu_hours),
        "gpu_hours_over_oracle": (
            float(result.gpu_hours / result.oracle_gpu_hours) if result.oracle_gpu_hours else None
        ),
        "scaling_actions": sum(actions.values()),
        "scaling_actions_by_role": actions,
        "replica_churn": sum(churn.values()),
        "replica_churn_by_role": churn,
        "decisions": len(result.decisions),
        "targets": {"ttft_ms": float(result.ttft_target_ms), "itl_ms": float(result.itl_target_ms)},
        "startup_delay_s": float(result.startup_delay_s),
        "truth_scale": float(result.truth_scale),
        "truth": ",".join(truth.world) if truth is not None else None,
        "unservable_requests": (
            unservable_requests(
                result.requests,
                truth,
                ttft_target_ms=result.ttft_target_ms,
                itl_target_ms=result.itl_target_ms,
            )
            if truth is not None
            else None
        ),
        "gpus_per_engine": dict(result.gpus_per_engine),
        "simulated_s": float(result.end_s),
        "wall_s": float(result.wall_s),
        "simulated_s_per_wall_s": float(result.end_s / result.wall_s) if result.wall_s > 0 else None,
        "settings": result.settings,
    }
    summary.update(_cost(result))
    if result.scale_to_zero:
        # Only then: with scale to zero off, summary.json stays exactly what it was.
        summary["scale_to_zero"] = summarize_zero(
            result.timeline, result.requests, end_s=result.end_s, gpus_per_engine=result.gpus_per_engine
        )
    return summary


def _cost(result: ReplayResult) -> dict[str, Any]:
    """The engines' cost beside their GPU-hours: the timeline billed by the planner's rule, at
    the deployment's cost_per_gpu_hour (1 unless set: then cost reads as GPU-hours)."""
    price = float(result.cost_per_gpu_hour)
    totals = timeline_cost(
        result.timeline, gpus_per_engine=result.gpus_per_engine, cost_per_gpu_hour=price, end_s=result.end_s
    )
    return {
        "cost_per_gpu_hour": price,
        "cost": float(totals.cost),
        "gpu_hours_by_role": {role: float(h) for role, h in totals.gpu_hours.items()},
        "oracle_cost": float(result.oracle_gpu_hours * price),
    }


def _cells(values: np.ndarray, decimals: int) -> list[float | None]:
    """Rounded Python floats, None (the csv module writes an empty cell) where unknown."""
    cells = np.round(values, decimals).astype(object)
    cells[np.isnan(values)] = None
    return cells.tolist()


def _write_requests(path: Path, requests: Sequence[SimRequest], table: RequestTable) -> None:
    columns = zip(
        [r.id for r in requests],
        _cells(table.arrival_s, _SECONDS_DECIMALS),
        table.isl.tolist(),
        table.osl.tolist(),
        [r.prefill_engine for r in requests],
        [r.decode_engine for r in requests],
        _cells(table.ttft_ms, _MS_DECIMALS),
        _cells(table.itl_ms, _MS_DECIMALS),
        _cells(table.e2e_s, _SECONDS_DECIMALS),
        table.met_slo.astype(np.int8).tolist(),
        strict=True,
    )
    # Compressed: one row per request is tens of MB for an hour at 30x, a fifth of that gzipped;
    # zcat, pandas and numpy read it as it is.
    with gzip.open(path, "wt", newline="", encoding="utf-8", compresslevel=6) as f:
        writer = csv.writer(f)
        writer.writerow(REQUEST_COLUMNS)
        writer.writerows(columns)


def _write_replicas(path: Path, timeline: Sequence[ReplicaSample]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(REPLICA_COLUMNS)
        writer.writerows(
            (round(s.at_s, _SECONDS_DECIMALS), s.role, s.target, s.billed, s.ready, s.starting, s.draining)
            for s in timeline
        )


def _write_decisions(path: Path, result: ReplayResult) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(DECISION_COLUMNS)
        writer.writerows(
            (
                round(d.at_s, _SECONDS_DECIMALS),
                None if d.target is None else d.target.get("prefill"),
                None if d.target is None else d.target.get("decode"),
                d.reason,
            )
            for d in result.decisions
        )


def write_outputs(
    result: ReplayResult, out_dir: Path, *, summary: dict | None = None, truth: TruthModel | None = None
) -> dict[str, Path]:
    """Write every output file into `out_dir` (created if needed); returns their paths by kind:
    summary, requests, replicas, decisions, report. `truth` is summarize's (when it makes the
    summary)."""
    # Imported here, as before, so that importing this module for summarize() (the benchmarks do)
    # does not load plotly; there is no cycle to hide any more (app/sim/replay/request_table.py).
    from app.sim.replay.report import render_report

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = request_table(result.requests, result.ttft_target_ms, result.itl_target_ms)
    if summary is None:
        summary = summarize(result, table=table, truth=truth)
    paths = {
        "summary": out_dir / "summary.json",
        "requests": out_dir / "requests.csv.gz",
        "replicas": out_dir / "replicas.csv",
        "decisions": out_dir / "decisions.csv",
        "report": out_dir / "report.html",
    }
    # default=str: settings are "as given" and may hold Paths or other non-JSON values.
    paths["summary"].write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
    _write_requests(paths["requests"], result.requests, table)
    _write_replicas(paths["replicas"], result.timeline)
    _write_decisions(paths["decisions"], result)
    paths["report"].write_text(render_report(result, summary, table=table), encoding="utf-8")
    return paths
