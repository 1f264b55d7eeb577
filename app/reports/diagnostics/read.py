"""Reading the stored tick records into what the diagnostics report's panels draw.

Each record is reduced to a few numbers as it is read (`_Tick`), so a long range costs the page's
size, not the records'. Every series has a gap (NaN) where its section ran without the value, where
an engine did not report, and where ticks stop for much longer than usual (a restart, a mode that
was off); a tick without the section at all (a load-only tick has no throughput step) is skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from app.core.diagnostics import Forecast, ObservedTraffic, TickDiagnostics, finite_number

# A series breaks where consecutive points are this many times further apart than its usual
# spacing: a planner that was down must not draw a straight line across the outage.
GAP_FACTOR = 3.0


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


def _utc(value: datetime | float | None) -> str:
    """A time (a datetime, or epoch ms as `_Tick.t_ms`) as the page shows it."""
    if value is None:
        return "–"
    if isinstance(value, float):
        value = datetime.fromtimestamp(value / 1000.0, UTC)
    elif value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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
