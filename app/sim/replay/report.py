"""The replay's HTML report: one self-contained page (plotly.js inline) with the headline numbers and
six panels on a shared time axis in minutes.

Everything plotted is aggregated per time bin or is a replica/decision change, so the page's size
grows with the trace's duration, not with its request count (plotly.js itself is ~4.5 MB of it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.plotting import LOG_AXIS, figure_html, hover_text, html_page, lay_out_panels, legend_name
from app.sim.replay.request_table import RequestTable, request_table
from app.sim.replay.results import DecisionEvent, OracleStep, ReplayResult
from app.sim.world.cluster import ReplicaSample

LOAD_BIN_S = 10.0
MIX_BIN_S = 60.0
LATENCY_BIN_S = 10.0

SCALE_UP, SCALE_DOWN, MIXED, HOLD = "scale up", "scale down", "up and down", "hold"
_KIND_COLOURS = {SCALE_UP: "#2ca02c", SCALE_DOWN: "#d62728", MIXED: "#9467bd", HOLD: "#7f7f7f"}
_ROLE_COLOURS = {"billed": "#1f77b4", "ready": "#2ca02c", "target": "#ff7f0e", "oracle": "#7f7f7f"}

_PANEL_TITLES = (
    "Load: requests/s per 10 s (left), mean ISL/OSL per minute (right)",
    "Prefill replicas",
    "Decode replicas",
    "TTFT per 10 s of arrivals (ms, log)",
    "ITL per 10 s of arrivals (ms, log)",
    "Policy decisions",
)


def binned_percentiles(
    times_s: np.ndarray, values: np.ndarray, bin_s: float, qs: Sequence[float]
) -> tuple[np.ndarray, np.ndarray]:
    """The start (s) of every non-empty bin of `times_s` and, per bin, the percentiles `qs` of its
    `values` (numpy's default linear method), shape (len(qs), bins). NaN values are left out.

    One sort for all bins: a loop of np.percentile over thousands of bins is what makes a report
    of a long trace slow."""
    keep = ~(np.isnan(values) | np.isnan(times_s))
    bins = np.floor(times_s[keep] / bin_s).astype(np.int64)
    vals = values[keep]
    order = np.lexsort((vals, bins))
    bins, vals = bins[order], vals[order]
    labels, starts, counts = np.unique(bins, return_index=True, return_counts=True)
    out = np.empty((len(qs), labels.size))
    for i, q in enumerate(qs):
        position = starts + (counts - 1) * (q / 100.0)
        lo = np.floor(position).astype(np.int64)
        hi = np.minimum(lo + 1, starts + counts - 1)
        out[i] = vals[lo] + (vals[hi] - vals[lo]) * (position - lo)
    return labels * bin_s, out


def _rate_per_bin(times_s: np.ndarray, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Start (s) of every bin from 0 to the last arrival, empty ones included, and events/s in it."""
    if not times_s.size:
        return np.empty(0), np.empty(0)
    counts = np.bincount(np.floor(times_s / bin_s).astype(np.int64))
    return np.arange(counts.size) * bin_s, counts / bin_s


def _mean_per_bin(times_s: np.ndarray, values: np.ndarray, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Start (s) of every bin and the mean of `values` in it (NaN, a gap in the line, if empty)."""
    if not times_s.size:
        return np.empty(0), np.empty(0)
    bins = np.floor(times_s / bin_s).astype(np.int64)
    counts = np.bincount(bins)
    sums = np.bincount(bins, weights=values.astype(float))
    means = np.full(counts.size, np.nan)
    np.divide(sums, counts, out=means, where=counts > 0)
    return np.arange(counts.size) * bin_s, means


def _role_steps(timeline: Sequence[ReplicaSample], role: str, end_s: float) -> dict[str, list[float]]:
    """The role's target/billed/ready as step-line points (minutes), one per actual change."""
    points: dict[float, tuple[int, int, int]] = {}
    for s in timeline:
        if s.role == role:
            points[s.at_s] = (s.target, s.billed, s.ready)  # the last sample at an instant wins
    steps: dict[str, list[float]] = {"t_min": [], "target": [], "billed": [], "ready": []}
    previous = None
    for at_s, state in points.items():
        if state == previous:
            continue
        previous = state
        steps["t_min"].append(at_s / 60.0)
        for key, value in zip(("target", "billed", "ready"), state, strict=True):
            steps[key].append(value)
    if previous is not None:  # carry the last state to the end of the run
        steps["t_min"].append(end_s / 60.0)
        for key, value in zip(("target", "billed", "ready"), previous, strict=True):
            steps[key].append(value)
    return steps


def _oracle_steps(oracle: Sequence[OracleStep], role: str, end_s: float) -> tuple[list[float], list[int]]:
    t_min = [step.at_s / 60.0 for step in oracle]
    billed = [step.billed.get(role, 0) for step in oracle]
    if billed:
        t_min.append(end_s / 60.0)
        billed.append(billed[-1])
    return t_min, billed


def decision_kinds(decisions: Sequence[DecisionEvent], initial: dict[str, int]) -> list[str]:
    """Each decision's kind against the target in force before it (`initial` at the start)."""
    current = dict(initial)
    kinds = []
    for decision in decisions:
        if decision.target is None:
            kinds.append(HOLD)
            continue
        up = any(count > current.get(role, 0) for role, count in decision.target.items())
        down = any(count < current.get(role, 0) for role, count in decision.target.items())
        kinds.append(MIXED if up and down else SCALE_UP if up else SCALE_DOWN if down else HOLD)
        current.update(decision.target)
    return kinds


def _decision_hover(decision: DecisionEvent) -> str:
    lines = [f"t = {decision.at_s / 60.0:.2f} min"]
    if decision.target is not None:
        lines.append(", ".join(f"{role} → {n}" for role, n in decision.target.items()))
    return hover_text(lines, decision.reason)


def _build_figure(result: ReplayResult, table: RequestTable) -> go.Figure:
    end_s = max(
        [result.end_s, float(np.nanmax(table.arrival_s)) if len(table) else 0.0]
        + [s.at_s for s in result.timeline[-1:]]
        + [d.at_s for d in result.decisions[-1:]]
    )
    fig = make_subplots(
        rows=6,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.035,
        subplot_titles=_PANEL_TITLES,
        specs=[[{"secondary_y": True}]] + [[{}] for _ in range(5)],
    )

    # (1) load
    t_s, rate = _rate_per_bin(table.arrival_s, LOAD_BIN_S)
    fig.add_trace(
        go.Scatter(x=t_s / 60.0, y=rate, name="requests/s", line={"width": 1}, legend=legend_name(1)),
        row=1,
        col=1,
    )
    for name, tokens, dash in (("mean ISL", table.isl, "solid"), ("mean OSL", table.osl, "dot")):
        t_s, mean = _mean_per_bin(table.arrival_s, tokens, MIX_BIN_S)
        fig.add_trace(
            go.Scatter(
                x=t_s / 60.0, y=mean, name=name, line={"dash": dash, "width": 1}, legend=legend_name(1)
            ),
            row=1,
            col=1,
            secondary_y=True,
        )

    # (2), (3) replicas against the oracle
    for row, role in ((2, "prefill"), (3, "decode")):
        steps = _role_steps(result.timeline, role, end_s)
        oracle_t, oracle_billed = _oracle_steps(result.oracle_timeline, role, end_s)
        lines = (
            ("billed", steps["t_min"], steps["billed"], "solid"),
            ("ready", steps["t_min"], steps["ready"], "solid"),
            ("target", steps["t_min"], steps["target"], "dash"),
            ("oracle billed", oracle_t, oracle_billed, "dot"),
        )
        for name, x, y, dash in lines:
            colour = _ROLE_COLOURS[name.split()[0]]
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    name=f"{role} {name}",
                    mode="lines",
                    line={"shape": "hv", "dash": dash, "color": colour, "width": 1.5},
                    legend=legend_name(row),
                ),
                row=row,
                col=1,
            )

    # (4), (5) latency percentiles per bin of arrival, with the target
    for row, name, values, target_ms in (
        (4, "TTFT", table.ttft_ms, result.ttft_target_ms),
        (5, "ITL", table.itl_ms, result.itl_target_ms),
    ):
        t_s, pct = binned_percentiles(table.arrival_s, values, LATENCY_BIN_S, (50.0, 99.0))
        for i, q in enumerate(("p50", "p99")):
            fig.add_trace(
                go.Scatter(
                    x=t_s / 60.0,
                    y=pct[i],
                    name=f"{name} {q}",
                    mode="lines",
                    line={"width": 1},
                    legend=legend_name(row),
                ),
                row=row,
                col=1,
            )
        # A trace rather than add_hline: shapes on a log axis are easy to get wrong.
        fig.add_trace(
            go.Scatter(
                x=[0.0, end_s / 60.0],
                y=[target_ms, target_ms],
                name=f"{name} target",
                mode="lines",
                line={"dash": "dash", "color": "black", "width": 1},
                legend=legend_name(row),
            ),
            row=row,
            col=1,
        )
        fig.update_yaxes(type="log", title_text="ms", row=row, col=1, **LOG_AXIS)

    # (6) decisions
    initial = {}
    for s in result.timeline:
        initial.setdefault(s.role, s.target)
    kinds = decision_kinds(result.decisions, initial)
    for kind in (SCALE_UP, SCALE_DOWN, MIXED, HOLD):
        chosen = [d for d, k in zip(result.decisions, kinds, strict=True) if k == kind]
        if not chosen:
            continue
        fig.add_trace(
            go.Scatter(
                x=[d.at_s / 60.0 for d in chosen],
                y=[kind] * len(chosen),
                name=kind,
                mode="markers",
                marker={"color": _KIND_COLOURS[kind], "size": 10, "symbol": "line-ns-open"},
                hovertext=[_decision_hover(d) for d in chosen],
                hoverinfo="text",
                legend=legend_name(6),
            ),
            row=6,
            col=1,
        )
    fig.update_yaxes(
        type="category",
        categoryorder="array",
        categoryarray=[SCALE_DOWN, HOLD, MIXED, SCALE_UP],
        row=6,
        col=1,
    )

    fig.update_yaxes(title_text="req/s", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="tokens", row=1, col=1, secondary_y=True)
    fig.update_yaxes(title_text="engines", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="engines", rangemode="tozero", row=3, col=1)
    fig.update_xaxes(title_text="minutes since the trace's start", row=6, col=1)
    fig.update_xaxes(showticklabels=True)

    lay_out_panels(fig, 6, height=1900, legend_x=1.06)
    return fig


def _fmt(value: Any, spec: str = ".1f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


def _pct(value: float | None) -> str:
    return _fmt(None if value is None else 100.0 * value, ".2f", " %")


def _header_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    ttft, itl, targets = summary["ttft_ms"], summary["itl_ms"], summary["targets"]
    by_role = summary.get("scaling_actions_by_role", {})
    return [
        ("SLO attainment", _pct(summary["slo_attainment"])),
        ("TTFT / ITL attainment", f"{_pct(summary['ttft_attainment'])} / {_pct(summary['itl_attainment'])}"),
        (
            "Targets (TTFT / ITL)",
            f"{_fmt(targets['ttft_ms'], '.0f')} ms / {_fmt(targets['itl_ms'], '.1f')} ms",
        ),
        ("TTFT p50 / p99", f"{_fmt(ttft['p50'], '.1f')} / {_fmt(ttft['p99'], '.1f')} ms"),
        ("ITL p50 / p99", f"{_fmt(itl['p50'], '.2f')} / {_fmt(itl['p99'], '.2f')} ms"),
        ("GPU-hours", _fmt(summary["gpu_hours"], ".2f")),
        ("Oracle GPU-hours", _fmt(summary["oracle_gpu_hours"], ".2f")),
        ("GPU-hours ÷ oracle", _fmt(summary["gpu_hours_over_oracle"], ".3f")),
        (f"Cost (at {summary['cost_per_gpu_hour']:g} per GPU-hour)", _fmt(summary["cost"], ".2f")),
        (
            "Scaling actions",
            f"{summary['scaling_actions']} ("
            + ", ".join(f"{role} {n}" for role, n in by_role.items())
            + f"), churn {summary['replica_churn']}",
        ),
        ("Requests (completed)", f"{summary['requests']} ({summary['completed']})"),
        # Requests no allocation could serve in this world (their prompt or decode alone is too
        # slow for the target): misses no policy could avoid. "–" when the run's world is unknown.
        ("Unservable requests", _fmt(summary.get("unservable_requests"), "d")),
        (
            "Startup delay / truth scale (world)",
            f"{_fmt(summary['startup_delay_s'], 'g')} s / ×{summary['truth_scale']:g}"
            + (f" ({summary['truth']})" if summary.get("truth") else ""),
        ),
        (
            "Simulated / wall time",
            f"{_fmt(summary['simulated_s'] / 60.0, '.1f')} min / {_fmt(summary['wall_s'], '.1f')} s"
            f" (×{_fmt(summary['simulated_s_per_wall_s'], '.0f')})",
        ),
    ]


def render_report(result: ReplayResult, summary: dict[str, Any], *, table: RequestTable | None = None) -> str:
    """The report page as one HTML string (no external resources). `table` saves recomputing the
    per-request columns when the caller already has them."""
    if table is None:
        table = request_table(result.requests, result.ttft_target_ms, result.itl_target_ms)
    title = f"Replay: {result.policy} on {result.trace}"
    return html_page(title, _header_rows(summary), figure_html(_build_figure(result, table)))
