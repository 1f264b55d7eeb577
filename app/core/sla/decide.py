"""Sizing by expected attainment (`scaling.sizing: attainment`): per role, the cheapest count whose
expected share of requests within target, over the forecast's scenarios, meets the role's share
of `attainment_target` (app/core/sla/attainment.py, app/core/sla/forecast.py).

Two horizons, one rule:
- **up**: engines ordered now serve from `now + lead` until the next chance to change the count
  (`horizon_s` later): the count for the scenarios of `[lead, lead + horizon]`;
- **keep**: an engine released now is back no sooner than a lead later: a count is kept while one
  fewer would miss the target over `[0, lead + horizon]` (the level now included).

The target is the larger of the up count and the current count lowered no further than the keep
count. Quiet periods need nothing of their own: what came after quiet moments is in the pairs.
What the queue asks now (the drainable backlog, the gain before engines ordered now serve, the
prompts prefill drains to decode, the requests the decode engines hold) adds to every scenario,
as in the headroom sizing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.core.perf.interpolation import PerfModel
from app.core.sla.attainment import (
    CountChoice,
    PrefillQueue,
    cheapest,
    decode_met,
    expected,
    role_target,
)
from app.core.sla.backlog import backlog_growth, drainable_tokens
from app.core.sla.capacity import LengthMix, decode_concurrency
from app.core.sla.decode_wish import decode_terms
from app.core.sla.demand import busiest_rate, dispersion_index, merged_buckets, window_rates
from app.core.sla.forecast import Forecast, LevelPoint, forecast
from app.core.sla.settings import SlaSettings
from app.core.sla.state import SlaState
from app.core.sla.types import Demand, SlaInput
from app.core.types import Role


def observe(
    state: SlaState, now: float, settings: SlaSettings, fallback_lengths: tuple[float, float] | None
) -> Demand | None:
    """What the traffic is now, with no forecast: the busiest `burst_window_s` of the level window,
    the trend window's mean lengths and ISL mix, and the burstiness (None: no traffic known)."""
    smooth = [s for s in state.samples if s.end_s > now - settings.trend_window_s]
    duration, num, isl, osl = window_rates(smooth)
    if duration > 0 and num == 0:
        # Silence: no demand now, and the lengths last seen size what may come back.
        isl, osl = state.lengths or (0.0, 0.0)
    elif num > 0 and (isl is None or osl is None) and fallback_lengths is not None:
        isl, osl = fallback_lengths
    if duration <= 0 or isl is None or osl is None:
        return None
    level = busiest_rate(
        [s for s in state.samples if s.end_s > now - settings.level_window_s], settings.burst_window_s
    )
    flight = decode_concurrency(request_rate_s=level, osl_tokens=osl, itl_target_ms=settings.itl_target_ms)
    dispersion = dispersion_index(list(state.samples), settings.dispersion_prior_s)
    mix = LengthMix.from_histogram(merged_buckets(list(state.samples)), isl, settings.quantile)
    return Demand(
        request_rate_s=level,
        token_rate_s=level * isl,
        in_flight_mean=flight,
        in_flight=flight,
        isl=isl,
        osl=osl,
        mix=mix,
        dispersion=dispersion,
        growth=None,
        growth_learned=True,
        ramp=(0.0, 0.0),
        ramp_growth=None,
        level_in_flight=flight,
    )


@dataclass(frozen=True)
class Horizons:
    up: Forecast
    keep: Forecast


def forecasts(
    state: SlaState, seen: Demand, now: float, lead_s: float, horizon_s: float, settings: SlaSettings
) -> Horizons:
    """Record the level now and read both horizons' scenarios off the history."""
    point = LevelPoint(now, seen.token_rate_s, seen.in_flight_mean)
    history = list(state.levels)
    common = dict(
        neighbour_share=settings.growth_neighbour_share,
        min_pairs=settings.growth_min_points,
        prior_growth=settings.cold_start_growth,
        cap=settings.forecast_cap,
    )
    up = forecast(history, point, start_s=lead_s, end_s=lead_s + horizon_s, floor_now=False, **common)
    keep = forecast(history, point, start_s=0.0, end_s=lead_s + horizon_s, floor_now=True, **common)
    state.levels.append(point)
    while state.levels and state.levels[0].t_s <= now - settings.history_s:
        state.levels.popleft()
    return Horizons(up, keep)


def _choice_diag(choice: CountChoice, cost_per_engine: float) -> dict[str, Any]:
    return {
        "engines": choice.engines,
        "attainment": round(choice.attainment, 5),
        "attainment_one_fewer": round(choice.attainment_fewer, 5)
        if choice.attainment_fewer is not None
        else None,
        "meets_target": choice.meets_target,
        "gpus_one_more": cost_per_engine,
    }


def attainment_wishes(
    seen: Demand,
    horizons: Horizons,
    inp: SlaInput,
    state: SlaState,
    settings: SlaSettings,
    lead_s: float,
    model: PerfModel | None,
    gpus: Mapping[Role, int],
) -> tuple[dict[Role, int], dict[Role, dict[str, Any]]]:
    """Per role, the count: the larger of the up choice and the current count lowered no further
    than the keep choice; with what explains it (`sla.roles`)."""
    assert state.latency is not None
    goal = role_target(settings.attainment_target)
    wish: dict[Role, int] = {}
    diag: dict[Role, dict[str, Any]] = {}
    draining_tokens_s = 0.0
    if "prefill" in settings.bounds:
        bounds = settings.bounds["prefill"]
        queue = PrefillQueue.build(
            state.latency.prefill,
            seen.mix,
            ttft_target_ms=settings.ttft_target_ms,
            dispersion=seen.dispersion,
            correction=state.correction,
            max_utilisation=settings.prefill_max_utilisation,
        )
        queues = [r.queued.sum_prefill_tokens for r in inp.fpm.get("prefill", {}).values()]
        queued = sum(queues)
        drain_s = max(lead_s, settings.level_window_s)
        opened = inp.expected.get("prefill", 0) > inp.ready.get("prefill", 0)
        drainable = queued if opened else drainable_tokens(queues, queue.capacity_tokens_s, drain_s)
        growing = backlog_growth(seen, inp, state, settings, lead_s, queued, queue.capacity_tokens_s)
        draining_tokens_s = (drainable + growing) / drain_s

        def chooser(scenarios: np.ndarray) -> CountChoice:
            load = scenarios + draining_tokens_s
            return cheapest(
                lambda n: expected(queue.met(n, load), load), goal, bounds.min_replicas, bounds.max_replicas
            )

        up, keep = chooser(horizons.up.tokens_s), chooser(horizons.keep.tokens_s)
        now_only = chooser(np.array([seen.token_rate_s]))
        current = inp.expected.get("prefill", inp.ready.get("prefill", 0))
        wish["prefill"] = bounds.clamp(max(up.engines, min(current, keep.engines)))
        diag["prefill"] = {
            "needed": max(up.engines, min(current, keep.engines)),
            "needed_now": now_only.engines,
            "wish": wish["prefill"],
            "up": _choice_diag(up, gpus.get("prefill", 1)),
            "keep": _choice_diag(keep, gpus.get("prefill", 1)),
            "capacity_tokens_s": round(queue.capacity_tokens_s, 1),
            "queued_tokens": queued,
            "stuck_tokens": round(queued - drainable, 1),
            "backlog_growth_tokens": round(growing, 1),
            "backlog_tokens_s": round(draining_tokens_s, 1),
            "unservable_share": round(queue.unservable_share, 4),
            "longest_servable_tokens": queue.longest_servable_tokens,
        }
    if "decode" in settings.bounds:
        bounds = settings.bounds["decode"]
        terms = decode_terms(
            seen, inp, state, settings, model, draining_tokens_s=draining_tokens_s, with_held=True
        )

        def chooser_d(scenarios: np.ndarray) -> CountChoice:
            load = scenarios * terms.pace + terms.drained * terms.pace
            low = max(bounds.min_replicas, terms.floor())
            return cheapest(
                lambda n: expected(decode_met(n, terms.batch, load, seen.dispersion), load),
                goal,
                min(low, bounds.max_replicas),
                bounds.max_replicas,
            )

        up, keep = chooser_d(horizons.up.flight), chooser_d(horizons.keep.flight)
        now_only = chooser_d(np.array([seen.in_flight_mean]))
        current = inp.expected.get("decode", inp.ready.get("decode", 0))
        wish["decode"] = bounds.clamp(max(up.engines, min(current, keep.engines)))
        diag["decode"] = {
            "needed": max(up.engines, min(current, keep.engines)),
            "needed_now": now_only.engines,
            "wish": wish["decode"],
            "up": _choice_diag(up, gpus.get("decode", 1)),
            "keep": _choice_diag(keep, gpus.get("decode", 1)),
            **terms.diagnostics,
        }
    return wish, diag
