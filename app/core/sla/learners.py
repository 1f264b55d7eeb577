"""What SLA scaling measures of the world: the engines' speed over the profile's (`scale`, per
forward pass) and how long ordered engines take to serve (`lead_s`, from its own scale-ups)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from app.core.perf.fpm import ForwardPassMetrics
from app.core.perf.interpolation import PerfModel
from app.core.sla.settings import SlaSettings
from app.core.sla.state import SlaState
from app.core.sla.types import EngineKey, SlaInput
from app.core.types import Role


def _expected_s(model: PerfModel, role: Role, record: ForwardPassMetrics) -> float | None:
    """The profile's time for the work one forward pass did."""
    s = record.scheduled
    if role == "prefill" and s.sum_prefill_tokens > 0:
        return model.prefill_ttft_ms(s.sum_prefill_tokens) / 1000.0
    if role == "decode" and s.num_decode_requests > 0:
        context = s.sum_decode_kv_tokens / s.num_decode_requests
        return model.decode_itl_ms(s.num_decode_requests, context) / 1000.0
    return None


def update_scale(
    model: PerfModel | None,
    state: SlaState,
    role: Role,
    records: Mapping[EngineKey, ForwardPassMetrics],
    settings: SlaSettings,
) -> int:
    """Fold this tick's fresh forward passes into the role's scale; returns how many were used."""
    if model is None:
        return 0
    ratios = []
    for key, record in records.items():
        if state.seen.get((role, key)) is record or record.wall_time_s <= 0:
            continue
        state.seen[(role, key)] = record
        expected = _expected_s(model, role, record)
        if expected:
            ratios.append(record.wall_time_s / expected)
    if ratios:
        low, high = settings.scale_bounds
        ratio = min(high, max(low, statistics.median(ratios)))
        before = state.scale.get(role)
        a = settings.scale_smoothing
        state.scale[role] = ratio if before is None else before + a * (ratio - before)
    return len(ratios)


def update_lead(state: SlaState, inp: SlaInput, settings: SlaSettings) -> float:
    """Close the scale-up orders the ready counts have reached; their age is the scaling latency
    (EWMA), which is how far ahead the forecast looks."""
    for role, (ordered_s, count) in list(state.orders.items()):
        if inp.expected.get(role, count) < count:
            del state.orders[role]  # cancelled by a later scale-down: nothing measured
        elif inp.ready.get(role, 0) >= count:
            latency = inp.now_s - ordered_s
            state.lead_s = latency if state.lead_s is None else 0.7 * state.lead_s + 0.3 * latency
            del state.orders[role]
    return state.lead_s if state.lead_s is not None else settings.startup_estimate_s
