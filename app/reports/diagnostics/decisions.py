"""The diagnostics report's decision panels (load, throughput, SLA scaling): each run of one reason
as a bar coloured by the reason, with the detail of its first and last tick on hover.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from app.core.seed.load_types import LoadReason
from app.core.sla.types import SlaReason
from app.plotting import hover_text, legend_name
from app.reports.diagnostics.panels import LOAD_DECISIONS, SLA_DECISIONS, THROUGHPUT_DECISIONS
from app.reports.diagnostics.read import _Tick, _utc

# Hover text per decision marker is capped: a day at 5 s is 17 280 of them.
MAX_DETAIL_CHARS = 300
# Past this many runs of one reason in a panel (reasons flapping tick by tick), only the latest
# this many scaling actions keep their detail on hover: otherwise a day's page would be mostly
# hover text.
MAX_DETAILED_RUNS = 1000
LOAD_ACTIONS = frozenset({"scale_up", "scale_down", "scale_down_capped_by_throughput"})
THROUGHPUT_ACTIONS = frozenset({"scale", "set_lower_bound"})

THROUGHPUT_COLOURS = {
    "scale": "green",
    "set_lower_bound": "blue",
    "disabled": "lightgray",
    "no_traffic_data": "yellow",
    "predict_failed": "red",
    "model_not_ready": "orange",
    "unset": "lightgray",
}
THROUGHPUT_ORDER = (
    "unset",
    "disabled",
    "model_not_ready",
    "predict_failed",
    "no_traffic_data",
    "set_lower_bound",
    "scale",
)
LOAD_COLOURS = {
    "unset": "lightgray",
    "disabled": "lightgray",
    "no_fpm_data": "yellow",
    "scaling_in_progress": "purple",
    "worker_count_mismatch": "red",
    "insufficient_data": "orange",
    "no_change": "gray",
    "scale_up": "green",
    "scale_down": "blue",
    "scale_down_capped_by_throughput": "teal",
    "scale_down_refused_consolidation": "brown",
}
LOAD_ORDER = tuple(r.value for r in LoadReason)
SLA_COLOURS = {
    "model_not_ready": "orange",
    "no_traffic_data": "yellow",
    "no_inventory": "red",
    "no_change": "gray",
    "hold": "purple",
    "scale_up": "green",
    "scale_down": "blue",
}
SLA_ORDER = tuple(r.value for r in SlaReason)
SLA_ACTIONS = frozenset({"scale_up", "scale_down"})
UNKNOWN_COLOUR = "black"


def _hover(t_ms: float, lines: Iterable[str], detail: str) -> str:
    # The time is in the text because a hovertemplate's date format does not apply to epoch-ms x
    # values.
    if len(detail) > MAX_DETAIL_CHARS:
        detail = detail[: MAX_DETAIL_CHARS - 1] + "…"
    return hover_text((_utc(t_ms), *lines), detail)


@dataclass(slots=True)
class _Run:
    """Consecutive ticks with one reason."""

    reason: str
    first: _Tick
    last: _Tick
    ticks: int = 1


def _load_hover(tick: _Tick, detailed: bool) -> str:
    if not detailed:
        return _hover(tick.t_ms, tick.load_lines[:1], "")
    return _hover(tick.t_ms, tick.load_lines, tick.load_detail)


def _throughput_hover(tick: _Tick, detailed: bool) -> str:
    return _hover(
        tick.t_ms, [f"throughput: {tick.throughput_reason}"], tick.throughput_detail if detailed else ""
    )


def _sla_hover(tick: _Tick, detailed: bool) -> str:
    return _hover(tick.t_ms, [f"SLA scaling: {tick.sla_reason}"], tick.sla_detail if detailed else "")


def _runs(ticks: list[_Tick], reason_of: Callable[[_Tick], str | None]) -> list[_Run]:
    runs: list[_Run] = []
    for tick in ticks:
        reason = reason_of(tick)
        if reason is None:
            continue  # not a step of this kind: the run goes on
        if runs and runs[-1].reason == reason:
            runs[-1].last = tick
            runs[-1].ticks += 1
        else:
            runs.append(_Run(reason, tick, tick))
    return runs


@dataclass(frozen=True)
class _DecisionPanel:
    kind: str
    panel: int
    reason_of: Callable[[_Tick], str | None]
    hover_of: Callable[[_Tick, bool], str]
    colours: Mapping[str, str]
    order: tuple[str, ...]
    actions: frozenset[str]


_LOAD_PANEL = _DecisionPanel(
    "load", LOAD_DECISIONS, lambda t: t.load_reason, _load_hover, LOAD_COLOURS, LOAD_ORDER, LOAD_ACTIONS
)
_THROUGHPUT_PANEL = _DecisionPanel(
    "throughput",
    THROUGHPUT_DECISIONS,
    lambda t: t.throughput_reason,
    _throughput_hover,
    THROUGHPUT_COLOURS,
    THROUGHPUT_ORDER,
    THROUGHPUT_ACTIONS,
)
_SLA_PANEL = _DecisionPanel(
    "SLA", SLA_DECISIONS, lambda t: t.sla_reason, _sla_hover, SLA_COLOURS, SLA_ORDER, SLA_ACTIONS
)


def _decisions(fig: go.Figure, ticks: list[_Tick], spec: _DecisionPanel) -> bool:
    """Each run of one reason as a bar from its first to its last tick, with the first and last
    tick's detail on hover: a day at 5 s is 17 280 steps, mostly repeating the one before.
    True when there were so many runs that only the latest actions kept their detail."""
    by_reason: dict[str, list[_Run]] = {}
    runs = _runs(ticks, spec.reason_of)
    trimmed = len(runs) > MAX_DETAILED_RUNS
    if trimmed:
        actions = [run for run in runs if run.reason in spec.actions]
        detailed = {id(run) for run in actions[-MAX_DETAILED_RUNS:]}
    else:
        detailed = {id(run) for run in runs}
    for run in runs:
        by_reason.setdefault(run.reason, []).append(run)
    known = [r for r in spec.order if r in by_reason]
    categories = known + sorted(set(by_reason) - set(spec.order))
    for reason in categories:
        x: list[float] = []
        text: list[str] = []
        for run in by_reason[reason]:
            x.append(run.first.t_ms)
            text.append(spec.hover_of(run.first, id(run) in detailed))
            if run.ticks > 1:
                x.append(run.last.t_ms)
                last = spec.hover_of(run.last, id(run) in detailed)
                text.append(f"{last}<br>(the last of {run.ticks} steps in a row)")
            x.append(math.nan)
            text.append("")
        colour = spec.colours.get(reason, UNKNOWN_COLOUR)
        label = html.escape(reason)
        fig.add_trace(
            go.Scatter(
                x=np.array(x),
                y=[label if not math.isnan(v) else None for v in x],
                name=label,
                mode="lines+markers",
                line={"color": colour, "width": 6},
                marker={
                    "color": colour,
                    "size": 9,
                    "symbol": "line-ns-open",
                    "line": {"width": 2, "color": colour},
                },
                text=text,
                hovertemplate="%{text}<extra></extra>",
                legend=legend_name(spec.panel),
            ),
            row=spec.panel,
            col=1,
        )
    fig.update_yaxes(
        type="category",
        categoryorder="array",
        categoryarray=[html.escape(c) for c in categories],
        row=spec.panel,
        col=1,
    )
    return trimmed
