"""What SLA scaling measures of the world: the engines' iteration costs (`learn_latency`, into
app/core/sla/latency.py's models), whether prefill is as busy as those say (`check_busy`, or where
the records are not all there, `check_saturated`), the
engines' speed over the profile's (`scale`, reported only; decode's, weighted by batch, scales
the profile's floor beyond the batches seen: `decode_floor_scale`) and how long ordered engines
take to serve (`lead_s`, from its own scale-ups)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

import numpy as np

from app.core.perf.fpm import ForwardPassMetrics
from app.core.perf.interpolation import PerfModel
from app.core.sla.capacity import LengthMix, prefill_engines
from app.core.sla.latency import prefill_rows
from app.core.sla.settings import SlaSettings
from app.core.sla.shortfall import record_shortfall, wait_bound_s
from app.core.sla.state import DecodeFloorSums, Order, PrefillPasses, SlaState
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
    now_s: float,
) -> int:
    """Fold this tick's fresh forward passes into the role's scale (and decode's into the sums
    of `decode_floor_scale`); returns how many were used."""
    if model is None:
        return 0
    ratios = []
    weighted_s = [0.0, 0.0]  # decode: Σ batch × measured, Σ batch × the profile's
    for key, record in records.items():
        if state.seen.get((role, key)) is record or record.wall_time_s <= 0:
            continue
        state.seen[(role, key)] = record
        expected = _expected_s(model, role, record)
        if expected:
            ratios.append(record.wall_time_s / expected)
            if role == "decode":
                batch = record.scheduled.num_decode_requests
                weighted_s[0] += batch * record.wall_time_s
                weighted_s[1] += batch * expected
    if weighted_s[1] > 0:
        sums = state.decode_floor_sums
        fade = 1.0
        if sums.updated_s is not None and now_s > sums.updated_s:
            fade = 0.5 ** ((now_s - sums.updated_s) / settings.latency_half_life_s)
        state.decode_floor_sums = DecodeFloorSums(
            fade * sums.measured_s + weighted_s[0], fade * sums.profiled_s + weighted_s[1], now_s
        )
    if ratios:
        low, high = settings.scale_bounds
        ratio = min(high, max(low, statistics.median(ratios)))
        before = state.scale.get(role)
        a = settings.scale_smoothing
        state.scale[role] = ratio if before is None else before + a * (ratio - before)
    return len(ratios)


def open_order(state: SlaState, role: Role, now_s: float, count: int, ready: int) -> None:
    """Start timing a scale-up to `count` engines, unless an order is open (its engines come
    first, so it keeps its start) or the ready engines already meet it (it measures nothing)."""
    if count > ready and role not in state.orders:
        state.orders[role] = Order(now_s, count)


def update_lead(state: SlaState, inp: SlaInput, settings: SlaSettings) -> float:
    """Close the scale-up orders the ready counts have reached; their age is the scaling latency
    (EWMA), which is how far ahead the forecast looks. An order still open is a censored
    measurement: the lead is at least its age. Without that, a world slower than the estimate
    goes on being read at the estimate until its first order completes (a 300 s start-up read as
    120 s for five minutes, every order in them sized for the wrong horizon). An order open
    longer than the wait bound is a shortfall of capacity, not a lead (shortfall.py): it is
    closed as one, and no order's age counts beyond the bound."""
    measured_s = state.lead_s if state.lead_s is not None else settings.startup_estimate_s
    bound_s = wait_bound_s(measured_s)
    shortfalls = dict(state.shortfalls or {})
    for role, (ordered_s, count) in list(state.orders.items()):
        ready = inp.ready.get(role, 0)
        asked = inp.expected.get(role, count)
        if asked < count and ready >= asked:
            del state.orders[role]  # cancelled by a later scale-down: nothing measured
            continue
        if asked < count:
            # Fewer were ordered than the step wished (a bound, the fleet's grant, a later
            # scale-down to above what runs): those are still to come, from the same order.
            count = asked
            state.orders[role] = Order(ordered_s, count)
        if ready >= count:
            latency = inp.now_s - ordered_s
            state.lead_s = latency if state.lead_s is None else 0.7 * state.lead_s + 0.3 * latency
            del state.orders[role]
            shortfalls.pop(role, None)  # the cluster delivered what was asked
        elif inp.now_s - ordered_s > bound_s:
            shortfalls[role] = record_shortfall(shortfalls.get(role), inp.now_s, ready, count, bound_s)
            del state.orders[role]
    state.shortfalls = shortfalls or None
    lead_s = state.lead_s if state.lead_s is not None else settings.startup_estimate_s
    return max([lead_s, *(min(inp.now_s - order.ordered_s, bound_s) for order in state.orders.values())])


# Records one tick learns from, at most: a second's worth of a busy engine's iterations is enough
# to refit three coefficients, and the fit's cost stays bounded.
_LEARN_LIMIT = 400


def learn_latency(state: SlaState, inp: SlaInput) -> dict[Role, int]:
    """Fold this tick's forward passes into the learned iteration costs: every record since the
    previous tick when the shell gives them, else each engine's latest record when it is new."""
    if state.latency is None:
        return {}
    used: dict[Role, int] = {}
    for role in ("prefill", "decode"):
        records = list(inp.fpm_new.get(role, ()))
        if not records:
            latest = inp.fpm.get(role, {})
            records = [r for key, r in latest.items() if state.seen.get((role, key)) is not r]
        state.latency = state.latency.observed(role, records, inp.now_s, fit_limit=_LEARN_LIMIT)
        used[role] = min(len(records), _LEARN_LIMIT)
    return used


def check_busy(
    state: SlaState, inp: SlaInput, interval_s: float | None, settings: SlaSettings
) -> dict[str, float | bool] | None:
    """The prefill model against what the engines did: with every record of the interval, their
    wall times are the engines' busy time, and the model's times for the same iterations are how
    busy it says that work kept them. Busier than the model says (a cost it does not see, a
    world that changed faster than the fit fades) lowers the capacity by the ratio (smoothed, in
    [0.5, 1.25]) within a few ticks; checked only when the engines were at least
    `busy_check_min` busy. None when the records are not all there."""
    records = [
        r for r in inp.fpm_new.get("prefill", ()) if r.wall_time_s > 0 and r.scheduled.sum_prefill_tokens > 0
    ]
    engines = inp.ready.get("prefill", 0)
    if not inp.fpm_complete.get("prefill") or not interval_s or interval_s <= 0 or engines <= 0:
        return None
    if state.latency is None:
        return None
    cost = state.latency.prefill
    busy_s = sum(r.wall_time_s for r in records)
    rows = prefill_rows(
        np.array([r.scheduled.sum_prefill_tokens for r in records], dtype=float),
        np.array([r.scheduled.sum_prefill_kv_tokens for r in records], dtype=float),
        np.array([r.scheduled.num_prefill_requests for r in records], dtype=float),
    )
    model_ms = float(cost.model.predict_many_ms(rows).sum()) if records else 0.0
    model_s = model_ms / 1000.0 / state.correction
    busy = busy_s / (interval_s * engines)
    model_busy = model_s / (interval_s * engines)
    checked = busy >= settings.busy_check_min and model_busy > 0
    if checked:
        _correct(state, state.correction * model_busy / busy, highest=1.25)
    return {
        "busy": round(busy, 3),
        "model_busy": round(model_busy, 3),
        "checked": checked,
        "correction": round(state.correction, 3),
    }


def _correct(state: SlaState, ratio: float, *, highest: float) -> None:
    """Move the prefill capacity correction halfway towards what a check measured, bounded to
    [0.5, `highest`]: a few ticks follow a real change, one odd interval moves it only so far."""
    state.correction += 0.5 * (min(highest, max(0.5, ratio)) - state.correction)


def check_saturated(
    state: SlaState, inp: SlaInput, interval_s: float | None, mix: LengthMix, settings: SlaSettings
) -> dict[str, float | bool] | None:
    """The prefill model against what saturated engines served, where `check_busy` cannot run
    (one record per engine per tick: Dynamo's replay, a publisher that drops records). When every
    prefill engine ran a forward pass in the interval and had at least a full chunk queued at both
    of its ends, none idled in it, and the prompt tokens they served (queued before + arrived −
    queued now) over the interval are their capacity. Below the model's capacity for the mix, the
    correction moves towards the ratio as `check_busy`'s does. Only down to it, at most to 1: the
    prompt tokens include prefixes a cache served without computing them, so more served than
    modelled is not more capacity. Records the engines' latest passes for the next tick; None
    when it could not check."""
    latest = dict(inp.fpm.get("prefill", {}))
    engines = inp.ready.get("prefill", 0)
    before, state.prefill_passes = state.prefill_passes, None
    if state.latency is None or engines <= 0 or len(latest) != engines:
        return None
    state.prefill_passes = PrefillPasses(inp.now_s, latest)
    chunk = state.latency.prefill.chunk_tokens
    t = inp.traffic
    if (
        before is None
        or not interval_s
        or abs(inp.now_s - before.t_s - interval_s) > 1e-6
        or before.by_engine.keys() != latest.keys()
        # An engine whose latest pass is the one seen before ran none: stalled or idle, not full.
        or any(before.by_engine[key] == record for key, record in latest.items())
        or min(r.queued.sum_prefill_tokens for r in (*before.by_engine.values(), *latest.values())) < chunk
        or t is None
        or t.isl is None
        or abs(t.duration_s - interval_s) > 0.5 * interval_s
    ):
        return None
    modelled = prefill_engines(
        state.latency.prefill, token_rate_s=0.0, mix=mix, ttft_target_ms=settings.ttft_target_ms
    ).capacity_tokens_s
    queued_before = sum(r.queued.sum_prefill_tokens for r in before.by_engine.values())
    served = queued_before + t.num_req * t.isl - sum(r.queued.sum_prefill_tokens for r in latest.values())
    if modelled <= 0 or served <= 0:
        return None
    achieved = served / (interval_s * engines)
    _correct(state, achieved / modelled, highest=1.0)
    return {
        "served_tokens_s": round(achieved, 1),
        "model_tokens_s": round(modelled, 1),
        "checked": True,
        "correction": round(state.correction, 3),
    }


def decode_floor_scale(state: SlaState, settings: SlaSettings) -> float:
    """The measured decode times over the profile's, each forward pass weighted by its batch and
    faded like the latency model's records (`latency_half_life_s`): the scale of the profile's
    shape beyond the batches seen. The tick's scale is a median of the latest passes, whatever
    their batch; where the world's shape is not the profile's, small batches read another ratio
    than large ones (Dynamo's mocker: 0.7-1.27 from tick to tick on one trace), and the floor
    stands where the batches are large. Before any decode pass: 1, the profile itself."""
    sums = state.decode_floor_sums
    if sums.profiled_s <= 0:
        return 1.0
    low, high = settings.scale_bounds
    return min(high, max(low, sums.measured_s / sums.profiled_s))
