"""The diagnostics report: one deployment's stored tick records as one self-contained HTML page
(plotly.js inline), the reference's DiagnosticsRecorder report (§7.2) served by the API.

The reference's panels in its order, one above the other on one shared UTC time axis (it lays
them out 6 x 2; one column lines every panel up at the same instant and leaves room for a legend
beside each): replicas (ready, target, decisions, throughput lower bound); request rate observed
and predicted; observed TTFT and ITL against the SLA; estimated TTFT and ITL against the SLA;
per-engine prefill queues; per-engine decode KV load; the FPM regressions' sample counts (where
the reference plots engine capacity, which the records do not hold); sequence lengths observed
and predicted; the load and the throughput decisions coloured by reason.

SLA scaling (the default algorithm) fills the same panels from its own fields: the traffic the
tick observed (request rate, TTFT, ITL, lengths), the demand it sized for, the prefill wait and
service it modelled, the prompts queued, its latency models' records; and five panels of its own
below them: the wishes per role, the forecast headroom, the measured scale and capacity
correction, the lead, and its decisions by reason. A panel with no data in the range says so,
and why, instead of drawing empty axes.

Each record is reduced to a few numbers as it is read, so a long range costs the page's size,
not the records'. Every series has a gap (NaN) where its section ran without the value, where an
engine did not report, and where ticks stop for much longer than usual (a restart, a mode that
was off); a tick without the section at all (a load-only tick has no throughput step) is skipped.
All text from records and configuration is escaped: worker ids come from the engines.
"""

from __future__ import annotations

import html
import math
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.core.diagnostics import Forecast, ObservedTraffic, TickDiagnostics, finite_number
from app.core.seed.load_types import LoadReason
from app.core.sla.types import SlaReason
from app.plotting import LOG_AXIS

# A series breaks where consecutive points are this many times further apart than its usual
# spacing: a planner that was down must not draw a straight line across the outage.
GAP_FACTOR = 3.0
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


# --- reading records ---------------------------------------------------------------------------------


def _ratio(num: Any, den: Any) -> float | None:
    n, d = finite_number(num), finite_number(den)
    return n / d if n is not None and d else None


def _replicas(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        return {}
    return {str(role): n for role, count in value.items() if (n := finite_number(count)) is not None}


@dataclass(slots=True)
class _Engine:
    role: str
    engine: str
    queued_prefill_tokens: float | None
    decode_kv_tokens: float | None  # queued + in-flight (scheduled)


@dataclass(slots=True)
class _Tick:
    """What the report keeps of one record."""

    t_ms: float
    values: dict[str, float | None] = field(default_factory=dict)  # a key per section that ran
    target: dict[str, float] = field(default_factory=dict)
    decision_id: int | None = None
    ready: dict[str, float] = field(default_factory=dict)
    floor: dict[str, float] = field(default_factory=dict)
    engine_roles: tuple[str, ...] = ()  # roles whose engines the load step listed
    engines: list[_Engine] = field(default_factory=list)
    max_kv_tokens: dict[str, float] = field(default_factory=dict)
    samples: dict[str, float] = field(default_factory=dict)
    min_samples: dict[str, float] = field(default_factory=dict)
    load_reason: str | None = None
    load_lines: tuple[str, ...] = ()  # hover text: built only for the ticks that show it
    load_detail: str = ""
    throughput_reason: str | None = None
    throughput_detail: str = ""
    sla_reason: str | None = None
    sla_detail: str = ""
    wish: dict[str, float] = field(default_factory=dict)
    need: dict[str, float] = field(default_factory=dict)
    lead_measured: bool = False


def _epoch_ms(at: datetime) -> float:
    if at.tzinfo is None:  # the store's times are UTC
        at = at.replace(tzinfo=UTC)
    return at.timestamp() * 1000.0


def _hover(t_ms: float, lines: Iterable[str], detail: str) -> str:
    # Plotly renders hover text as a small HTML subset, and does not wrap it. The time is in the
    # text because a hovertemplate's date format does not apply to epoch-ms x values.
    if len(detail) > MAX_DETAIL_CHARS:
        detail = detail[: MAX_DETAIL_CHARS - 1] + "…"
    out = [html.escape(line) for line in (_utc(t_ms), *lines)]
    out += [html.escape(line) for line in textwrap.wrap(detail, 90)]
    return "<br>".join(out)


def _read(at: datetime, stored: Any) -> _Tick:
    tick = _Tick(_epoch_ms(at))
    record = TickDiagnostics.read(stored)
    tick.target = _replicas(record.target)
    tick.decision_id = record.decision_id

    throughput = record.throughput
    if throughput is not None:
        observed, predicted = throughput.observed or ObservedTraffic(), throughput.predicted or Forecast()
        values = {
            "observed_rps": _ratio(observed.num_req, observed.duration_s),
            # The forecast is for an interval as long as the observed one (the throughput interval).
            "predicted_rps": _ratio(predicted.num_req, observed.duration_s),
            "observed_ttft_ms": finite_number(observed.ttft_ms),
            "observed_itl_ms": finite_number(observed.itl_ms),
            "observed_isl": finite_number(observed.isl),
            "observed_osl": finite_number(observed.osl),
            "predicted_isl": finite_number(predicted.isl),
            "predicted_osl": finite_number(predicted.osl),
        }
        tick.values.update(values)
        tick.throughput_reason = throughput.reason or "unknown"
        tick.throughput_detail = throughput.detail or ""
        if tick.throughput_reason == "set_lower_bound":
            tick.floor = _replicas(throughput.raw_replicas)

    load = record.load
    if load is not None:
        tick.values["estimated_ttft_ms"] = finite_number(load.estimated_ttft_ms)
        tick.values["estimated_itl_ms"] = finite_number(load.estimated_itl_ms)
        tick.ready = _replicas(load.current)
        tick.floor = _replicas(load.throughput_floor) or tick.floor
        tick.load_reason = load.reason or "unknown"
        per_role = []
        engine_roles = []
        for role, section in (load.roles or {}).items():
            per_role.append(f"{role}: {section.reason or ''}")
            if not section.engines:
                continue
            engine_roles.append(role)
            for row in section.engines:
                queued_kv = finite_number(row.queued_decode_kv_tokens)
                inflight_kv = finite_number(row.scheduled_decode_kv_tokens)
                kv = (
                    None
                    if queued_kv is None and inflight_kv is None
                    else (queued_kv or 0) + (inflight_kv or 0)
                )
                tick.engines.append(_Engine(role, row.engine, finite_number(row.queued_prefill_tokens), kv))
            max_kv = finite_number(section.checks.max_kv_tokens) if section.checks is not None else None
            if max_kv is not None:
                tick.max_kv_tokens[role] = max_kv
        tick.engine_roles = tuple(engine_roles)
        for model, diag in (load.models or {}).items():
            if (n := finite_number(diag.observations)) is not None:
                tick.samples[model] = n
            if (n := finite_number(diag.min_observations)) is not None:
                tick.min_samples[model] = n
        estimates = ", ".join(
            f"{name} {value:.1f} ms"
            for name, value in (
                ("est. TTFT", tick.values["estimated_ttft_ms"]),
                ("est. ITL", tick.values["estimated_itl_ms"]),
            )
            if value is not None
        )
        lines = [f"load: {tick.load_reason}"] + ([", ".join(per_role)] if len(per_role) > 1 else [])
        tick.load_lines = tuple(lines + ([estimates] if estimates else []))
        tick.load_detail = load.detail or ""

    if record.sla is not None:
        _read_sla(tick, record)
    return tick


def _read_sla(tick: _Tick, record: TickDiagnostics) -> None:
    """SLA scaling's section, and the traffic its shell recorded beside it."""
    sla = record.sla
    assert sla is not None
    traffic = record.traffic if isinstance(record.traffic, Mapping) else {}
    observed = ObservedTraffic.model_validate(traffic.get("observed") or {}) if traffic else ObservedTraffic()
    demand = sla.demand
    roles = sla.roles or {}
    prefill = roles.get("prefill")
    growth = demand.growth if demand is not None and demand.growth else []
    latency = sla.latency or {}
    wait_s = finite_number(prefill.wait_s) if prefill is not None else None
    service_s = finite_number(prefill.service_s) if prefill is not None else None
    tick.values.update(
        {
            "sla_observed_rps": _ratio(observed.num_req, observed.duration_s),
            "sla_demand_rps": finite_number(demand.request_rate_s) if demand is not None else None,
            "sla_observed_ttft_ms": finite_number(observed.ttft_ms),
            "sla_observed_itl_ms": finite_number(observed.itl_ms),
            "sla_prefill_ttft_ms": (wait_s + service_s) * 1000.0
            if wait_s is not None and service_s is not None
            else None,
            "sla_queued_prefill_tokens": finite_number(prefill.queued_tokens)
            if prefill is not None
            else None,
            "sla_prefill_records": finite_number(latency["prefill"].records)
            if "prefill" in latency
            else None,
            "sla_decode_records": finite_number(latency["decode"].records) if "decode" in latency else None,
            "sla_observed_isl": finite_number(observed.isl),
            "sla_observed_osl": finite_number(observed.osl),
            "sla_isl_mean": finite_number(demand.isl_mean) if demand is not None else None,
            "sla_osl_mean": finite_number(demand.osl_mean) if demand is not None else None,
            "sla_headroom_tokens": finite_number(growth[0]) if len(growth) > 0 else None,
            "sla_headroom_flight": finite_number(growth[1]) if len(growth) > 1 else None,
            "sla_scale_prefill": finite_number((sla.scale or {}).get("prefill")),
            "sla_scale_decode": finite_number((sla.scale or {}).get("decode")),
            "sla_correction": finite_number(sla.capacity_check.correction) if sla.capacity_check else None,
            "sla_lead_s": finite_number(sla.lead_s),
        }
    )
    tick.ready = _replicas(sla.ready) or tick.ready
    for role, section in roles.items():
        if (n := finite_number(section.wish)) is not None:
            tick.wish[role] = n
        if (n := finite_number(section.needed)) is not None:
            tick.need[role] = n
    tick.lead_measured = sla.lead_measured is True
    tick.sla_reason = sla.reason or "unknown"
    tick.sla_detail = sla.detail or ""


# --- series -------------------------------------------------------------------------------------------


def _gapped(
    x: list[float], y: list[float | None], positions: list[int] | None = None, spacing_ms: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """x and y as float arrays with a NaN point (a break in the line) before every point that
    follows a long pause, or, given `positions`, that is not the next position after its previous
    one (an engine missing from the ticks between)."""
    xs = np.asarray(x, dtype=np.float64)  # epoch ms: float32 would be off by minutes
    # float32 values: 7 digits are plenty on a chart, and a quarter less page.
    ys = np.array([np.nan if v is None else v for v in y], dtype=np.float32)
    if xs.size < 2:
        return xs, ys
    dt = np.diff(xs)
    if spacing_ms is None:
        spacing_ms = float(np.median(dt))
    breaks = dt > GAP_FACTOR * spacing_ms if spacing_ms > 0 else np.zeros(dt.size, dtype=bool)
    if positions is not None:
        breaks |= np.diff(np.asarray(positions)) > 1
    where = np.nonzero(breaks)[0] + 1
    if where.size:
        xs = np.insert(xs, where, xs[where])
        ys = np.insert(ys, where, np.nan)
    return xs, ys


def _changes(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Only the points a step line (shape "hv") needs: where the value changes, both ends, and the
    points beside a gap. Replica counts change a few times a day; their ticks do not."""
    if y.size < 3:
        return x, y
    gap = np.isnan(y)
    keep = np.ones(y.size, dtype=bool)
    keep[1:-1] = (y[1:-1] != y[:-2]) | gap[1:-1] | gap[2:]
    return x[keep], y[keep]


def _median_spacing(ticks: list[_Tick]) -> float | None:
    if len(ticks) < 2:
        return None
    return float(np.median(np.diff([t.t_ms for t in ticks])))


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
        go.Scatter(x=x, y=y, name=html.escape(name), mode=mode, line=line, legend=_legend(panel), meta=meta),
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


def _legend(panel: int) -> str:
    return "legend" if panel == 1 else f"legend{panel}"


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
                legend=_legend(spec.panel),
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
                    legend=_legend(REPLICAS),
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

    # One legend per panel, beside it: a single legend of many engines cannot say which panel is which.
    legends: dict[str, Any] = {}
    for panel in range(1, len(titles) + 1):
        top = fig.get_subplot(panel, 1).yaxis.domain[1]
        legends[_legend(panel)] = {
            "x": 1.02,
            "y": top,
            "yanchor": "top",
            "xanchor": "left",
            "font": {"size": 11},
        }
    fig.update_layout(
        height=230 * len(titles),
        margin={"l": 70, "r": 40, "t": 40, "b": 50},
        template="plotly_white",
        hovermode="closest",
        **legends,
    )
    return fig, notes


# --- the page -----------------------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin-bottom: 0.6em; }
p.note { color: #8a4b00; }
table.summary { border-collapse: collapse; margin-bottom: 1em; }
table.summary th, table.summary td { padding: 0.25em 0.9em; border-bottom: 1px solid #ddd; text-align: left; }
table.summary th { font-weight: 600; color: #555; }
"""


def _utc(value: datetime | float | None) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        value = datetime.fromtimestamp(value / 1000.0, UTC)
    elif value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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
    title = f"Planner diagnostics: {deployment}"
    header = "\n".join(
        f"<tr><th>{html.escape(name)}</th><td>{html.escape(value)}</td></tr>"
        for name, value in _header_rows(
            deployment, rows, sla, since, until, max(ticks_in_range or 0, len(rows))
        )
    )
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
        body = figure.to_html(
            full_html=False, include_plotlyjs=True, config={"responsive": True, "displaylogo": False}
        )
    note_html = "".join(f'<p class="note">{html.escape(n)}</p>\n' for n in notes)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n"
        f'<table class="summary">\n{header}\n</table>\n'
        f"{note_html}{body}\n</body>\n</html>\n"
    )
