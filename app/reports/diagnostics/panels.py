"""The diagnostics report's panels: their titles and numbers, the scalar series each draws, the
line panels (replicas, engines, regressions, SLA scaling's own), and what a panel with no data says.
The decision panels are in `decisions`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import plotly.graph_objects as go

from app.plotting import legend_name
from app.reports.diagnostics.read import _changes, _gapped, _Tick, _utc

REFERENCE = "reference"  # the meta of a target line: a panel with only these has no data
ROLE_COLOURS = {"prefill": "#1f77b4", "decode": "#ff7f0e", "workers": "#2ca02c"}

PANEL_TITLES = (
    "Replicas",
    "Request rate (req/s)",
    "Observed TTFT (ms)",
    "Observed ITL (ms)",
    "Estimated TTFT, worst engine (ms)",
    "Estimated ITL, worst engine (ms)",
    "Prefill engines: queued prefill tokens",
    "Decode engines: queued + in-flight KV tokens",
    "FPM regressions: samples",
    "Sequence lengths (tokens)",
    "Load scaling decisions",
    "Throughput scaling decisions",
)
# Only when the range has SLA ticks.
SLA_PANEL_TITLES = (
    "SLA scaling: wish (solid) and need (dotted) per role (engines)",
    "SLA scaling: forecast headroom (peak within one lead ÷ level)",
    "SLA scaling: measured scale and prefill capacity correction",
    "SLA scaling: lead (s), measured or the start-up estimate",
    "SLA scaling decisions",
)
(
    REPLICAS,
    RATE,
    OBSERVED_TTFT,
    OBSERVED_ITL,
    ESTIMATED_TTFT,
    ESTIMATED_ITL,
    PREFILL_QUEUES,
    DECODE_LOAD,
    REGRESSION,
    SEQUENCE,
    LOAD_DECISIONS,
    THROUGHPUT_DECISIONS,
) = range(1, len(PANEL_TITLES) + 1)
SLA_WISHES, SLA_HEADROOM, SLA_SCALE, SLA_LEAD, SLA_DECISIONS = range(
    len(PANEL_TITLES) + 1, len(PANEL_TITLES) + len(SLA_PANEL_TITLES) + 1
)

# Scalar series: (panel, trace name, dash) per key of `_Tick.values`.
_SCALARS = {
    "observed_rps": (RATE, "observed", "solid"),
    "predicted_rps": (RATE, "predicted", "dash"),
    "observed_ttft_ms": (OBSERVED_TTFT, "observed TTFT", "solid"),
    "observed_itl_ms": (OBSERVED_ITL, "observed ITL", "solid"),
    "estimated_ttft_ms": (ESTIMATED_TTFT, "estimated TTFT", "solid"),
    "estimated_itl_ms": (ESTIMATED_ITL, "estimated ITL", "solid"),
    "observed_isl": (SEQUENCE, "observed ISL", "solid"),
    "predicted_isl": (SEQUENCE, "predicted ISL", "dash"),
    "observed_osl": (SEQUENCE, "observed OSL", "solid"),
    "predicted_osl": (SEQUENCE, "predicted OSL", "dash"),
}
_SLA_SCALARS = {
    "sla_observed_rps": (RATE, "observed", "solid"),
    "sla_demand_rps": (RATE, "SLA demand (sized for)", "dash"),
    "sla_observed_ttft_ms": (OBSERVED_TTFT, "observed TTFT", "solid"),
    "sla_observed_itl_ms": (OBSERVED_ITL, "observed ITL", "solid"),
    "sla_prefill_ttft_ms": (ESTIMATED_TTFT, "SLA model: prefill wait + service at the wish", "solid"),
    "sla_queued_prefill_tokens": (PREFILL_QUEUES, "all prefill engines (SLA tick)", "solid"),
    "sla_prefill_records": (REGRESSION, "prefill latency model: forward passes", "solid"),
    "sla_decode_records": (REGRESSION, "decode latency model: forward passes", "solid"),
    "sla_observed_isl": (SEQUENCE, "observed ISL", "solid"),
    "sla_observed_osl": (SEQUENCE, "observed OSL", "solid"),
    "sla_isl_mean": (SEQUENCE, "SLA ISL (trend window)", "dash"),
    "sla_osl_mean": (SEQUENCE, "SLA OSL (trend window)", "dash"),
    "sla_headroom_tokens": (SLA_HEADROOM, "prompt tokens", "solid"),
    "sla_headroom_flight": (SLA_HEADROOM, "decode requests in flight", "solid"),
    "sla_scale_prefill": (SLA_SCALE, "prefill scale", "solid"),
    "sla_scale_decode": (SLA_SCALE, "decode scale", "solid"),
    "sla_correction": (SLA_SCALE, "prefill capacity correction", "dash"),
    "sla_lead_s": (SLA_LEAD, "lead", "solid"),
}
_SCALARS.update(_SLA_SCALARS)
_THROUGHPUT_KEYS = ("observed_rps", "predicted_rps", "observed_ttft_ms", "observed_itl_ms") + tuple(
    k for k in _SCALARS if k.endswith(("_isl", "_osl")) and not k.startswith("sla_")
)
_LOAD_KEYS = ("estimated_ttft_ms", "estimated_itl_ms")
_SLA_KEYS = tuple(_SLA_SCALARS)


def _line(
    fig: go.Figure,
    panel: int,
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    *,
    colour: str | None = None,
    dash: str = "solid",
    shape: str = "linear",
    mode: str = "lines",
    meta: str | None = None,
) -> None:
    line: dict[str, Any] = {"dash": dash, "width": 1.5, "shape": shape}
    if colour is not None:
        line["color"] = colour
    fig.add_trace(
        go.Scatter(
            x=x, y=y, name=html.escape(name), mode=mode, line=line, legend=legend_name(panel), meta=meta
        ),
        row=panel,
        col=1,
    )


def _target_line(fig: go.Figure, panel: int, name: str, value: float, x0: float, x1: float) -> None:
    # A trace rather than add_hline: shapes on a log axis are easy to get wrong.
    _line(
        fig,
        panel,
        name,
        np.array([x0, x1]),
        np.array([value, value]),
        colour="black",
        dash="dash",
        meta=REFERENCE,  # not data: a panel with only these says it has none
    )


def _replica_panel(fig: go.Figure, ticks: list[_Tick], spacing_ms: float | None) -> None:
    roles = sorted({r for t in ticks for r in (*t.target, *t.ready, *t.floor)}, key=_role_order)
    for role in roles:
        colour = ROLE_COLOURS.get(role, "#7f7f7f")
        ready = [t for t in ticks if role in t.ready]
        if ready:
            x, y = _changes(
                *_gapped([t.t_ms for t in ready], [t.ready[role] for t in ready], spacing_ms=spacing_ms)
            )
            _line(fig, REPLICAS, f"{role} ready", x, y, colour=colour, shape="hv")
        # A tick without a target had no opinion: the last target stays in force, so no gap.
        targets = [t for t in ticks if role in t.target]
        if targets:
            x, y = _changes(
                np.array([t.t_ms for t in targets]),
                np.array([t.target[role] for t in targets], dtype=np.float32),
            )
            _line(fig, REPLICAS, f"{role} target", x, y, colour=colour, dash="dot", shape="hv")
        decided = [t for t in targets if t.decision_id is not None]
        if decided:
            fig.add_trace(
                go.Scatter(
                    x=np.array([t.t_ms for t in decided]),
                    y=np.array([t.target[role] for t in decided]),
                    name=html.escape(f"{role} decision"),
                    mode="markers",
                    marker={"color": colour, "symbol": "diamond", "size": 8},
                    text=[
                        html.escape(f"{_utc(t.t_ms)}: decision #{t.decision_id}, {role} → {t.target[role]:g}")
                        for t in decided
                    ],
                    hovertemplate="%{text}<extra></extra>",
                    legend=legend_name(REPLICAS),
                ),
                row=REPLICAS,
                col=1,
            )
        floors = [t for t in ticks if role in t.floor]
        if floors:
            x, y = _changes(
                *_gapped([t.t_ms for t in floors], [t.floor[role] for t in floors], spacing_ms=spacing_ms)
            )
            _line(
                fig, REPLICAS, f"{role} throughput lower bound", x, y, colour="red", dash="dash", shape="hv"
            )


def _role_order(role: str) -> tuple[int, str]:
    return (list(ROLE_COLOURS).index(role) if role in ROLE_COLOURS else len(ROLE_COLOURS), role)


def _engine_panels(fig: go.Figure, ticks: list[_Tick], x0: float, x1: float) -> None:
    """One line per engine: prefill queues, and decode (or aggregated) KV load."""
    for panel, value_of in (
        (PREFILL_QUEUES, lambda e: e.queued_prefill_tokens),
        (DECODE_LOAD, lambda e: e.decode_kv_tokens),
    ):
        # Per role, the ticks whose load step listed that role's engines: an engine missing from
        # one of them left (or did not report) and gets a gap there.
        position: dict[str, int] = {}
        role_times: dict[str, list[float]] = {}
        series: dict[tuple[str, str], tuple[list[float], list[float | None], list[int]]] = {}
        for tick in ticks:
            for role in tick.engine_roles:
                position[role] = position.get(role, -1) + 1
                role_times.setdefault(role, []).append(tick.t_ms)
            for engine in tick.engines:
                value = value_of(engine)
                if value is None:
                    continue
                x, y, k = series.setdefault((engine.role, engine.engine), ([], [], []))
                x.append(tick.t_ms)
                y.append(value)
                k.append(position[engine.role])
        for role, name in sorted(series, key=lambda key: (_role_order(key[0]), key[1])):
            x, y, k = series[role, name]
            times = role_times[role]
            spacing = float(np.median(np.diff(times))) if len(times) > 1 else None
            xs, ys = _gapped(x, y, k, spacing)
            _line(fig, panel, f"{role} {name}", xs, ys)
    capacities = sorted({(r, v) for t in ticks for r, v in t.max_kv_tokens.items()})
    for role, value in capacities:
        _target_line(fig, DECODE_LOAD, f"{role} KV capacity {value:g}", value, x0, x1)


def _regression_panel(fig: go.Figure, ticks: list[_Tick], spacing_ms: float | None) -> None:
    models = sorted({m for t in ticks for m in t.samples}, key=_role_order)
    for model in models:
        chosen = [t for t in ticks if model in t.samples]
        x, y = _changes(
            *_gapped([t.t_ms for t in chosen], [t.samples[model] for t in chosen], spacing_ms=spacing_ms)
        )
        _line(fig, REGRESSION, f"{model} samples", x, y, colour=ROLE_COLOURS.get(model), shape="hv")
    minimums = sorted({v for t in ticks for v in t.min_samples.values()})
    if minimums and ticks:
        for value in minimums:
            _target_line(fig, REGRESSION, f"min observations {value:g}", value, ticks[0].t_ms, ticks[-1].t_ms)


def _sla_panels(fig: go.Figure, ticks: list[_Tick], spacing_ms: float | None) -> None:
    """SLA scaling's own panels besides its scalars: wishes per role, the lead's measured ticks."""
    roles = sorted({r for t in ticks for r in (*t.wish, *t.need)}, key=_role_order)
    for role in roles:
        colour = ROLE_COLOURS.get(role, "#7f7f7f")
        for name, of, dash in (("wish", lambda t: t.wish, "solid"), ("need", lambda t: t.need, "dot")):
            chosen = [t for t in ticks if role in of(t)]
            if chosen:
                x, y = _changes(
                    *_gapped([t.t_ms for t in chosen], [of(t)[role] for t in chosen], spacing_ms=spacing_ms)
                )
                _line(fig, SLA_WISHES, f"{role} {name}", x, y, colour=colour, dash=dash, shape="hv")
    measured = [t for t in ticks if t.lead_measured and t.values.get("sla_lead_s") is not None]
    if measured:
        _line(
            fig,
            SLA_LEAD,
            "measured",
            np.array([t.t_ms for t in measured]),
            np.array([t.values["sla_lead_s"] for t in measured], dtype=np.float32),
            colour="green",
            mode="markers",
        )


def _empty_reasons(ticks: list[_Tick]) -> dict[int, str]:
    """Why a panel may have nothing to draw, given which steps ran in the range."""
    ran_load = any(t.load_reason is not None for t in ticks)
    ran_sla = any(t.sla_reason is not None for t in ticks)
    no_load = "load scaling did not run in these ticks" + (
        " (SLA scaling decides; see its panels below)" if ran_sla else ""
    )
    no_throughput = "throughput scaling did not run in these ticks" + (
        " (SLA scaling decides; see its panels below)" if ran_sla else ""
    )
    sla_only = "no value in these SLA ticks yet"
    return {
        REPLICAS: "no replica counts in these ticks",
        RATE: "no traffic was observed in these ticks",
        OBSERVED_TTFT: "no request had its first token in a tick's window",
        OBSERVED_ITL: "no request finished decoding in a tick's window",
        ESTIMATED_TTFT: no_load if not ran_load else "the load step estimated no TTFT",
        ESTIMATED_ITL: (
            "SLA scaling estimates no ITL: it sizes decode by the largest batch that meets the target"
            if ran_sla and not ran_load
            else no_load
            if not ran_load
            else "the load step estimated no ITL"
        ),
        PREFILL_QUEUES: no_load if not (ran_load or ran_sla) else "no prompts were queued in these ticks",
        DECODE_LOAD: (
            "SLA ticks record the requests decode holds, not each engine's KV load (load scaling did not run)"
            if ran_sla and not ran_load
            else no_load
            if not ran_load
            else "no engine reported its KV load"
        ),
        REGRESSION: "no FPM regression or latency model in these ticks",
        SEQUENCE: "no lengths were observed in these ticks",
        LOAD_DECISIONS: no_load,
        THROUGHPUT_DECISIONS: no_throughput,
        SLA_WISHES: sla_only + " (no traffic in the level window)",
        SLA_HEADROOM: sla_only + " (no forecast: no traffic in the level window, or trend off)",
        SLA_SCALE: sla_only,
        SLA_LEAD: sla_only,
        SLA_DECISIONS: sla_only,
    }


def _say_where_empty(
    fig: go.Figure, panels: int, reasons: Mapping[int, str], x0: float, x1: float
) -> list[int]:
    """An annotation in every panel with no data (a target line alone is not data), and an empty
    trace there: plotly.js draws no axes for a subplot without one. The panels."""
    with_data: set[int] = set()
    for trace in fig.data:
        if trace.meta == REFERENCE or trace.y is None:
            continue
        axis = trace.yaxis or "y"
        panel = int(axis[1:] or 1)
        values = np.asarray(trace.y, dtype=object)
        if any(v is not None and not (isinstance(v, float) and math.isnan(v)) for v in values):
            with_data.add(panel)
    empty = [p for p in range(1, panels + 1) if p not in with_data]
    for panel in empty:
        fig.add_trace(
            go.Scatter(
                x=np.array([x0, x1]),
                y=[None, None],
                mode="lines",
                showlegend=False,
                hoverinfo="skip",
                meta=REFERENCE,
            ),
            row=panel,
            col=1,
        )
        low, high = fig.get_subplot(panel, 1).yaxis.domain
        fig.add_annotation(
            text=html.escape("no data: " + reasons.get(panel, "nothing in these ticks"), quote=False),
            xref="paper",
            yref="paper",
            x=0.5,
            y=(low + high) / 2,
            showarrow=False,
            font={"size": 13, "color": "#777"},
        )
    return empty
