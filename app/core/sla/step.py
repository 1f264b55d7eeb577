"""SLA scaling: the planner's own algorithm (docs/scaling.md; the seed's two modes are `seed`).

Each tick (`scaling.interval_s`) reads the frontend's traffic since the previous tick, each
engine's latest forward passes (FPM) and the ready counts, and per role decides a count:

1. **Engines** (learners.py, latency.py): the forward passes refit each role's iteration cost,
   whose prior is the profile; beyond the batches seen decode is never cheaper than it. The lead is
   how long the planner's own scale-ups took to become ready (`startup_estimate_s` until then).
2. **Demand seen**: the busiest 2-tick burst of the last 4 ticks, the 12-tick trend level, the
   prompt-length mix, the arrivals' burstiness (demand.py) and the share of the prompt tokens
   prefill computes, the rest read from a prefix cache (computed.py).
3. **Forecast and count**, by `scaling.sizing`:
   - `attainment` (decide.py, forecast.py, attainment.py): demand scenarios for two horizons,
     `up` ([lead, lead + tick]: what engines ordered now serve) and `keep` ([0, lead + tick]: an
     engine released now is back no sooner), from the traffic's own history of (level, peak
     within the horizon) pairs nearest the level now, in absolute units and at most
     `forecast_cap` times the history's peak; keep's raised by how far its own past forecasts
     fell short (never above the history's peak). Per role, the count that
     serves the scenarios' request-weighted `sla.attainment_target` quantile, lowered while one
     fewer still has an expected attainment (queue model, each scenario weighted by the
     requests it brings) at or above the target. The count is the larger of the up count and
     the current count lowered no further than the keep count, nor below the highest up count
     of the last lead (`keep_window_leads`).
   - `headroom` (demand.py, wish.py, quiet.py): the level raised by a learned headroom (the
     quantile of how far the level rose within a lead), a ramp under way and a surge; kept in
     quiet periods while a return is likely; lowered only to the highest wish of the
     scale-down window.
4. **Counts for a demand** (wish.py, decode_wish.py, capacity.py): prefill for the TTFT target
   as an M/G/c queue of the length mix at most 0.9 busy, plus the backlog queued now and what
   it gains before ordered engines serve; decode by Little's law at the attainment target's
   quantile of the requests in flight, against the largest batch meeting the ITL target, and
   never below what the engines hold now. Prompts no count serves are set aside and reported.
5. **Target** (this module): up at once; down as the sizing says; scale to zero when enabled.

The tick's diagnostics say every step's figures (app/core/diagnostics.py). Nothing here reads the
clock: `now_s` comes with the input. `sla_step` changes the `SlaState` it is given; the core
planner (app/core/planner.py) gives it a copy, adopted once the tick is stored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from app.core.perf.interpolation import PerfModel
from app.core.sla import quiet, shortfall
from app.core.sla.capacity import (
    LengthMix,
    peak_concurrency,
)
from app.core.sla.computed import update_computed_share
from app.core.sla.decide import attainment_wishes, forecasts, observe
from app.core.sla.decode_wish import record_held
from app.core.sla.demand import demand_at
from app.core.sla.latency import prior_models
from app.core.sla.learners import (
    check_busy,
    check_saturated,
    learn_latency,
    open_order,
    update_lead,
    update_scale,
)
from app.core.sla.settings import SlaSettings
from app.core.sla.state import Lengths, SlaState, Wish
from app.core.sla.types import Demand, SlaInput, SlaReason, SlaResult
from app.core.sla.wish import wishes_at
from app.core.types import Role


def sla_step(model: PerfModel | None, state: SlaState, inp: SlaInput, settings: SlaSettings) -> SlaResult:
    now = inp.now_s
    if state.first_s is None:
        state.first_s = now
    if state.latency is None and model is not None:
        state.latency = prior_models(
            model,
            chunk_tokens=settings.chunk_tokens,
            prior_records=settings.latency_prior_records,
            half_life_s=settings.latency_half_life_s,
        )
    learned = learn_latency(state, inp)
    scales = {
        role: update_scale(model, state, role, records, settings, now) for role, records in inp.fpm.items()
    }
    lead_s = update_lead(state, inp, settings)
    computed = update_computed_share(state, inp, settings)
    if inp.traffic is not None and inp.traffic.duration_s > 0:
        state.samples.append(inp.traffic)
    while state.samples and state.samples[0].end_s <= now - settings.lookback_s:
        state.samples.popleft()
    record_held(state, inp, now, settings.trend_window_s)
    interval_s = now - state.last_tick_s if state.last_tick_s is not None else None
    state.last_tick_s = now
    seen = _request_seen(inp)
    # The quiet period runs from the last request seen. Unknown traffic is not quiet while awake
    # (a source outage must not release every engine), and no demand while asleep.
    if state.active_s is None or seen or (seen is None and not state.asleep):
        state.active_s = now
    diagnostics: dict[str, Any] = {
        "scale": {r: round(s, 4) for r, s in state.scale.items()},
        "scale_samples": scales,
        "lead_s": round(lead_s, 1),
        "lead_measured": state.lead_s is not None,
        # What the tick saw running (the connector's or FPM's count), beside what it ordered.
        "ready": dict(inp.ready),
        "expected": dict(inp.expected),
    }
    if state.latency is not None:
        diagnostics["latency"] = {
            "prefill": {
                **state.latency.prefill.model.summary(),
                "packs_prompts": state.latency.prefill.packs,
                "learned_now": learned.get("prefill", 0),
            },
            "decode": {**state.latency.decode.model.summary(), "learned_now": learned.get("decode", 0)},
        }
    if model is None or state.latency is None:
        woken = _bare_wake(state, inp, settings, seen, diagnostics)
        return woken or SlaResult(None, SlaReason.MODEL_NOT_READY, "no performance model", diagnostics)
    # With scale to zero, the lengths last seen size a wake: the requests queued at zero have not
    # completed, and waiting for their lengths would leave the second wave of engines a start-up
    # behind the first. Off, unchanged: no request length known is no demand known.
    fallback = state.lengths if settings.scale_to_zero.enabled else None
    by_attainment = settings.sizing == "attainment"
    if by_attainment:
        demand = observe(state, now, settings, fallback)
    else:
        demand = demand_at(state, now, lead_s, settings, fallback_lengths=fallback)
    if demand is None:
        # At zero this is the usual case of a wake: the requests that arrived are still queued,
        # none has completed, so the frontend has no mean length to size with yet.
        woken = _bare_wake(state, inp, settings, seen, diagnostics)
        return woken or SlaResult(
            None, SlaReason.NO_TRAFFIC_DATA, "no traffic in the level window", diagnostics
        )
    if demand.isl > 0:
        state.lengths = Lengths(demand.isl, demand.osl)
    diagnostics["demand"] = {
        "request_rate_s": round(demand.request_rate_s, 3),
        "token_rate_s": round(demand.token_rate_s, 1),
        "in_flight_mean": round(demand.in_flight_mean, 1),
        "in_flight": round(demand.in_flight, 1),
        "dispersion": round(demand.dispersion, 2),
        "growth": [round(demand.growth.tokens, 3), round(demand.growth.flight, 3)] if demand.growth else None,
        "growth_learned": demand.growth_learned,
        "growth_neighbours": _rounded(demand.growth.neighbours) if demand.growth else None,
        "growth_regression": _rounded(demand.growth.regression) if demand.growth else None,
        "growth_regression_ceiling": _rounded(demand.growth.ceiling) if demand.growth else None,
        "ramp_per_s": [round(r, 4) for r in demand.ramp],
        "ramp_growth_per_s": _rounded(demand.ramp_growth, 6),
        "surge": _rounded(demand.surge, 1),
        "isl_mean": round(demand.isl, 1),
        "isl_quantile": round(demand.mix.quantile, 1),
        "osl_mean": round(demand.osl, 1),
        **computed,
    }
    check = check_busy(state, inp, interval_s, settings)
    if check is None:
        check = check_saturated(state, inp, interval_s, demand.mix, settings)
    if check is not None:
        diagnostics["capacity_check"] = check
    kept: dict[str, Any] | None = None
    if by_attainment:
        horizon_s = interval_s if interval_s else settings.burst_window_s
        horizons = forecasts(state, demand, now, lead_s, horizon_s, settings)
        wish, role_diag = attainment_wishes(
            demand, horizons, inp, state, settings, lead_s, model, settings.gpus_per_engine
        )
        diagnostics["forecast"] = {
            "horizon_s": round(horizon_s, 1),
            "attainment_target": settings.attainment_target,
            "up": horizons.up.summary(),
            "keep": horizons.keep.summary(),
        }
    else:
        wish, role_diag = wishes_at(demand, inp, state, settings, lead_s, model)
        kept = _quiet_floor(demand, inp, state, settings, lead_s, wish, role_diag, model)
        if kept is not None:
            diagnostics["quiet"] = kept
    diagnostics["roles"] = role_diag
    if not inp.inventory_known:
        detail = "how many engines run is not known yet (no connector report, decision or FPM)"
        return SlaResult(None, SlaReason.NO_INVENTORY, detail, diagnostics)
    zero = settings.scale_to_zero
    event: SlaReason | None = None
    if zero.enabled:
        # While awake at least one engine of each role (min_replicas is 0 for scale to zero):
        # only the quiet period, never a thin tick, takes the deployment to zero.
        for role in wish:
            wish[role] = max(wish[role], min(1, settings.bounds[role].max_replicas))
        was_asleep = state.asleep
        # The quiet-period outlook (quiet.py) expects a return within a lead: an engine let go
        # now would be ordered back too late for it. The outlook starts once the trend level has
        # fallen quiet; until then the trend window still holds the last burst, and says nothing.
        if by_attainment:
            # The keep horizon's scenarios hold what a return within a lead needs.
            return_likely = any(role_diag[r]["keep"] > 0 for r in role_diag)
        elif kept is not None:
            return_likely = bool(kept["keep"])
        else:
            return_likely = any(
                x.num_req > 0 for x in state.samples if x.end_s > now - settings.trend_window_s
            )
        if state.asleep and seen:
            event, state.asleep = SlaReason.WAKE_UP, False
        elif state.asleep or (
            now - state.active_s >= zero.quiet_s and not (zero.respect_return_forecast and return_likely)
        ):
            event, state.asleep = SlaReason.SCALED_TO_ZERO, True
        diagnostics["zero"] = {
            "quiet_s": zero.quiet_s,
            "quiet_for_s": round(now - state.active_s, 1),
            "asleep": state.asleep,
            "event": str(event) if event and state.asleep != was_asleep else None,
            "return_likely": return_likely,
            "queued_requests": inp.traffic.queued_requests if inp.traffic else None,
            "inflight_requests": inp.traffic.inflight_requests if inp.traffic else None,
        }
    # Attainment sizing: an engine released now is back a lead later at the earliest, so a count
    # the up horizon asked for within the last lead may be asked for again before a new one
    # serves. The window holds those up counts, not the wishes: a wish also holds the keep count,
    # which covers [0, lead + tick] on its own, and a lead of them would cover two leads' peaks.
    asked = {r: settings.bounds[r].clamp(int(role_diag[r]["up"])) for r in wish} if by_attainment else wish
    state.wishes.append(Wish(now, asked))
    window_s = settings.keep_window_leads * lead_s if by_attainment else scale_down_window_s(settings, lead_s)
    diagnostics["scale_down_window_s"] = round(window_s, 1)
    # Strictly older than the window: with a window of 0 the current wish stays in it.
    while state.wishes and state.wishes[0].t_s < now - window_s:
        state.wishes.popleft()
    watched_s = now - state.first_s
    target: dict[Role, int] = {}
    reasons: dict[Role, SlaReason] = {}
    notes = []
    for role in settings.bounds:
        current = inp.expected.get(role, inp.ready.get(role, 0))
        want = wish[role]
        if event == SlaReason.SCALED_TO_ZERO:
            # The quiet period is the stabilisation: no window, no hold.
            target[role], reasons[role] = 0, SlaReason.SCALED_TO_ZERO
        elif event == SlaReason.WAKE_UP:
            # Requests are waiting for an engine now: up at once, whatever the window holds.
            target[role], reasons[role] = max(want, current), SlaReason.WAKE_UP
        elif want > current:
            target[role], reasons[role] = want, SlaReason.SCALE_UP
        elif want == current:
            target[role], reasons[role] = current, SlaReason.NO_CHANGE
        elif watched_s < window_s and not by_attainment:
            target[role], reasons[role] = current, SlaReason.HOLD
            role_diag[role]["hold"] = f"watched {watched_s:.0f} s of the {window_s:.0f} s window"
        elif settings.trend and not demand.growth_learned and not by_attainment:
            # The window is short because the learned headroom covers the lead; until it is
            # learned, nothing says which engines the next lead needs.
            target[role], reasons[role] = current, SlaReason.HOLD
            role_diag[role]["hold"] = "the forecast's headroom is not learned yet"
        else:
            stable = max(max(w.counts[role] for w in state.wishes), want)
            if stable < current:
                target[role], reasons[role] = stable, SlaReason.SCALE_DOWN
            else:
                target[role], reasons[role] = current, SlaReason.HOLD
                asked_for = "up count of the last lead" if by_attainment else "wish of the window"
                role_diag[role]["hold"] = f"highest {asked_for} is {stable}"
        ready = inp.ready.get(role, 0)
        if state.shortfalls and role in state.shortfalls and want <= ready:
            del state.shortfalls[role]  # what runs is enough: nothing is missing any more
        cap = shortfall.capped(target[role], ready, (state.shortfalls or {}).get(role), now)
        if cap is not None:
            target[role], reasons[role] = cap, SlaReason.CAPACITY_UNAVAILABLE
        role_diag[role]["reason"] = str(reasons[role])
        notes.append(f"{role} {current}->{target[role]} ({reasons[role]}, wish {want})")
        if target[role] > current:
            open_order(state, role, now, target[role], inp.ready.get(role, 0))
    state.shortfalls = state.shortfalls or None
    if state.shortfalls:
        diagnostics["capacity_unavailable"] = shortfall.summary(state.shortfalls, now)
    order = (
        SlaReason.WAKE_UP,
        SlaReason.SCALED_TO_ZERO,
        SlaReason.CAPACITY_UNAVAILABLE,
        SlaReason.SCALE_UP,
        SlaReason.SCALE_DOWN,
        SlaReason.HOLD,
        SlaReason.NO_CHANGE,
    )
    reason = next(r for r in order if r in reasons.values())
    return SlaResult(target, reason, "; ".join(notes), diagnostics)


def _bare_wake(
    state: SlaState, inp: SlaInput, settings: SlaSettings, seen: bool | None, diagnostics: dict[str, Any]
) -> SlaResult | None:
    """One engine of each role, when a request finds the deployment at zero and nothing yet
    says how many it needs (no model, or no request length known): waiting for a length would
    leave the request queued for as long. At zero is asleep, or started with no engine (a
    deployment whose minimums are 0 may start so). None: no wake due."""
    at_zero = state.asleep or all(inp.expected.get(role, 0) == 0 for role in settings.bounds)
    if not (settings.scale_to_zero.enabled and at_zero and seen and inp.inventory_known):
        return None
    state.asleep = False
    target = {role: max(1, inp.expected.get(role, 0)) for role in settings.bounds}
    target = {role: min(count, settings.bounds[role].max_replicas) for role, count in target.items()}
    for role, count in target.items():
        open_order(state, role, inp.now_s, count, inp.ready.get(role, 0))
    diagnostics["zero"] = {
        "quiet_s": settings.scale_to_zero.quiet_s,
        "quiet_for_s": 0.0,
        "asleep": False,
        "event": str(SlaReason.WAKE_UP),
        "queued_requests": inp.traffic.queued_requests if inp.traffic else None,
        "inflight_requests": inp.traffic.inflight_requests if inp.traffic else None,
    }
    detail = "; ".join(
        f"{role} {inp.expected.get(role, 0)}->{n} (wake_up, no demand known yet)"
        for role, n in target.items()
    )
    return SlaResult(target, SlaReason.WAKE_UP, detail, diagnostics)


def _request_seen(inp: SlaInput) -> bool | None:
    """Did this tick see a request: one arriving in its window, or one the frontend still holds
    (queued for an engine, or in flight)? None: the traffic is unknown."""
    t = inp.traffic
    if t is None:
        return None
    return t.num_req > 0 or (t.queued_requests or 0) > 0 or (t.inflight_requests or 0) > 0


def scale_down_window_s(settings: SlaSettings, lead_s: float) -> float:
    """How long a wish keeps its engines: `scale_down_window_s`, or `scale_down_window_leads`
    scaling latencies when that is longer (0 leads by default). The headroom already covers the
    peak within one lead, so the window only filters the wish's tick-to-tick noise; a window in
    leads trades GPU-hours for fewer restarts (docs/scaling.md)."""
    return max(settings.scale_down_window_s, settings.scale_down_window_leads * lead_s)


def _quiet_floor(
    demand: Demand,
    inp: SlaInput,
    state: SlaState,
    settings: SlaSettings,
    lead_s: float,
    wish: dict[Role, int],
    diag: dict[Role, dict[str, Any]],
    model: PerfModel | None,
) -> dict[str, Any] | None:
    """Raise `wish` to what a return from a quiet period needs while one is likely within the
    horizon (a lead plus the level window, the soonest released engines could serve again); the
    outlook and both choices' expected costs, for the diagnostics (None outside quiet periods)."""
    if not state.history:
        return None
    tokens_s = state.history[-1].tokens_s
    usual = float(np.quantile([h.tokens_s for h in state.history], 0.75))
    state.quiet = quiet.observe(
        state.quiet,
        inp.now_s,
        tokens_s,
        demand,
        usual_tokens_s=usual,
        quiet_fraction=settings.quiet_fraction,
        lead_s=lead_s,
    )
    horizon_s = lead_s + settings.level_window_s
    view = quiet.outlook(state.quiet, inp.now_s, horizon_s, settings.quiet_keep_probability)
    if not view.quiet:
        return None
    isl, osl = state.lengths or (demand.isl, demand.osl)
    back = dataclasses.replace(
        demand,
        token_rate_s=view.return_tokens_s,
        in_flight_mean=view.return_flight,
        in_flight=peak_concurrency(
            view.return_flight, dispersion=demand.dispersion, quantile=settings.decode_peak_quantile
        ),
        isl=isl,
        osl=osl,
        mix=demand.mix if demand.mix.mean > 0 else LengthMix.uniform(isl),
    )
    needs, _ = wishes_at(back, inp, state, settings, lead_s, model, with_held=False)
    extra = {role: max(0, needs[role] - wish[role]) for role in wish}
    rate = view.return_tokens_s / isl if isl > 0 else 0.0
    if view.keep:
        for role in wish:
            wish[role] = max(wish[role], needs[role])
            diag[role]["wish"] = wish[role]
    return {
        "age_s": round(view.age_s, 1),
        "periods_seen": view.periods_seen,
        "return_probability": round(view.return_probability, 3),
        "keep": view.keep,
        "return_wish": needs,
        "keep_engine_s": round(sum(extra.values()) * horizon_s, 1),
        "release_risk_requests": round(view.return_probability * rate * horizon_s, 1),
    }


def _rounded(pair: tuple[float, float] | None, digits: int = 3) -> list[float] | None:
    return [round(v, digits) for v in pair] if pair else None
