"""The diagnostics report's page: the figure of all panels (`_build_figure`), the summary above it,
and the HTML (`render_diagnostics_report`, what the API serves).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.plotting import LOG_AXIS, figure_html, html_page, lay_out_panels
from app.reports.diagnostics.decisions import (
    _LOAD_PANEL,
    _SLA_PANEL,
    _THROUGHPUT_PANEL,
    MAX_DETAILED_RUNS,
    _decisions,
)
from app.reports.diagnostics.panels import (
    _LOAD_KEYS,
    _SCALARS,
    _SLA_KEYS,
    _THROUGHPUT_KEYS,
    DECODE_LOAD,
    ESTIMATED_ITL,
    ESTIMATED_TTFT,
    OBSERVED_ITL,
    OBSERVED_TTFT,
    PANEL_TITLES,
    PREFILL_QUEUES,
    RATE,
    REGRESSION,
    REPLICAS,
    SEQUENCE,
    SLA_HEADROOM,
    SLA_LEAD,
    SLA_PANEL_TITLES,
    SLA_SCALE,
    SLA_WISHES,
    _empty_reasons,
    _engine_panels,
    _line,
    _regression_panel,
    _replica_panel,
    _say_where_empty,
    _sla_panels,
    _target_line,
)
from app.reports.diagnostics.read import _gapped, _median_spacing, _read, _Tick, _utc


def _build_figure(ticks: list[_Tick], sla: tuple[float, float]) -> tuple[go.Figure, list[str]]:
    """The figure, and notes for the page about what it leaves out."""
    x0, x1 = ticks[0].t_ms, ticks[-1].t_ms
    ran_sla = any(t.sla_reason is not None for t in ticks)
    titles = PANEL_TITLES + (SLA_PANEL_TITLES if ran_sla else ())
    fig = make_subplots(
        rows=len(titles),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.022 * len(PANEL_TITLES) / len(titles),
        subplot_titles=titles,
    )
    _replica_panel(fig, ticks, _median_spacing([t for t in ticks if t.ready]))

    for section_keys in (_THROUGHPUT_KEYS, _LOAD_KEYS) + ((_SLA_KEYS,) if ran_sla else ()):
        present = [t for t in ticks if section_keys[0] in t.values]
        spacing = _median_spacing(present)
        for key in section_keys:
            panel, name, dash = _SCALARS[key]
            if all(t.values[key] is None for t in present):
                continue
            x, y = _gapped([t.t_ms for t in present], [t.values[key] for t in present], spacing_ms=spacing)
            _line(fig, panel, name, x, y, dash=dash)

    ttft_ms, itl_ms = sla
    for panel, name, value in (
        (OBSERVED_TTFT, "TTFT target", ttft_ms),
        (ESTIMATED_TTFT, "TTFT target", ttft_ms),
        (OBSERVED_ITL, "ITL target", itl_ms),
        (ESTIMATED_ITL, "ITL target", itl_ms),
    ):
        _target_line(fig, panel, f"{name} {value:g} ms", value, x0, x1)
        fig.update_yaxes(type="log", row=panel, col=1, **LOG_AXIS)

    _engine_panels(fig, ticks, x0, x1)
    _regression_panel(fig, ticks, _median_spacing([t for t in ticks if t.samples]))
    if ran_sla:
        _sla_panels(fig, ticks, _median_spacing([t for t in ticks if t.sla_reason is not None]))
    specs = (_LOAD_PANEL, _THROUGHPUT_PANEL) + ((_SLA_PANEL,) if ran_sla else ())
    notes = [
        f"The {spec.kind} reason changed more than {MAX_DETAILED_RUNS} times: only the latest "
        f"{MAX_DETAILED_RUNS} scaling actions keep their detail on hover (GET /diagnostics has every record)."
        for spec in specs
        if _decisions(fig, ticks, spec)
    ]
    _say_where_empty(fig, len(titles), _empty_reasons(ticks), x0, x1)

    fig.update_yaxes(title_text="engines", rangemode="tozero", row=REPLICAS, col=1)
    zero_based = (RATE, PREFILL_QUEUES, DECODE_LOAD, REGRESSION, SEQUENCE)
    for panel in zero_based + ((SLA_WISHES, SLA_HEADROOM, SLA_SCALE, SLA_LEAD) if ran_sla else ()):
        fig.update_yaxes(rangemode="tozero", row=panel, col=1)
    fig.update_xaxes(type="date", showticklabels=True)
    fig.update_xaxes(title_text="time (UTC)", row=len(titles), col=1)

    lay_out_panels(fig, len(titles), height=230 * len(titles), legend_x=1.02)
    return fig, notes


# --- the page -----------------------------------------------------------------------------------------

# The page's style besides what both reports share (app/plotting.py).
_STYLE_RULES = ("p.note { color: #8a4b00; }",)


def _header_rows(
    deployment: str,
    ticks: list[_Tick],
    sla: tuple[float, float],
    since: datetime | None,
    until: datetime | None,
    ticks_in_range: int,
) -> list[tuple[str, str]]:
    rows = [
        ("Deployment", deployment),
        (
            "Requested range",
            f"{_utc(since) if since else 'the first tick'} to {_utc(until) if until else 'the latest tick'}",
        ),
    ]
    if ticks:
        rows.append(("Ticks shown", f"{_utc(ticks[0].t_ms)} to {_utc(ticks[-1].t_ms)}"))
    count = f"{len(ticks)}"
    if ticks_in_range > len(ticks):
        count += f" (the latest of {ticks_in_range} in the range)"
    rows.append(("Ticks", count))
    if ticks:
        decisions = sum(1 for t in ticks if t.decision_id is not None)
        load = [t.load_reason for t in ticks if t.load_reason is not None]
        ups = sum(1 for r in load if r == "scale_up")
        downs = sum(1 for r in load if r in ("scale_down", "scale_down_capped_by_throughput"))
        rows += [
            ("Decisions", str(decisions)),
            ("Load steps", f"{len(load)} ({ups} up, {downs} down)"),
            ("Throughput steps", str(sum(1 for t in ticks if t.throughput_reason is not None))),
        ]
        sla_steps = [t.sla_reason for t in ticks if t.sla_reason is not None]
        if sla_steps:
            ups = sum(1 for r in sla_steps if r == "scale_up")
            downs = sum(1 for r in sla_steps if r == "scale_down")
            rows.append(("SLA steps", f"{len(sla_steps)} ({ups} up, {downs} down)"))
    rows.append(("SLA targets (TTFT / ITL)", f"{sla[0]:g} ms / {sla[1]:g} ms"))
    return rows


def render_diagnostics_report(
    deployment: str,
    ticks: Iterable[tuple[datetime, Mapping[str, Any]]],
    *,
    sla: tuple[float, float],
    since: datetime | None = None,
    until: datetime | None = None,
    ticks_in_range: int | None = None,
) -> str:
    """The report page as one HTML string (no external resources).

    `ticks` are (at, record) pairs of one deployment, read once (a streaming query will do) and
    sorted by time here; `sla` is (TTFT ms, ITL ms); `since`/`until` the requested range;
    `ticks_in_range`, when larger than the number of ticks given, says the page shows only the
    latest of them."""
    rows = sorted((_read(at, record) for at, record in ticks), key=lambda t: t.t_ms)
    header = _header_rows(deployment, rows, sla, since, until, max(ticks_in_range or 0, len(rows)))
    notes = []
    if ticks_in_range is not None and ticks_in_range > len(rows):
        notes.append(
            f"The range holds {ticks_in_range} ticks; this page shows the latest {len(rows)}. "
            "Narrow since/until to see the earlier ones."
        )
    if not rows:
        body = '<p class="empty">No ticks in this range.</p>'
    else:
        figure, figure_notes = _build_figure(rows, sla)
        notes += figure_notes
        body = figure_html(figure)
    note_html = "".join(f'<p class="note">{html.escape(n)}</p>\n' for n in notes)
    return html_page(f"Planner diagnostics: {deployment}", header, note_html + body, style_rules=_STYLE_RULES)
