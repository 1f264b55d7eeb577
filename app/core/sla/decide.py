"""Sizing by expected attainment (`scaling.sizing: attainment`): per role, the fewest engines whose
expected share of requests within the latency targets, over demand scenarios learned from the
traffic's own past, meets `attainment_target` (app/core/sla/forecast.py learns the scenarios,
app/core/sla/wish.py sizes one demand, app/core/sla/attainment.py gives a count's expected
attainment over the scenarios).

Two horizons, one rule:
- **up**: engines ordered now serve from `now + lead` until the next chance to change the count
  (`horizon_s` later): the count for the scenarios of `[lead, lead + horizon]`;
- **keep**: an engine released now is back no sooner than a lead later: the count for the
  scenarios of `[0, lead + horizon]` (the level now included).
Per horizon the count starts from the sizing at the scenarios' request-weighted quantile (the
least demand at or below which `attainment_target` of the requests lie): it meets the targets in
every scenario it covers. From there it goes down one engine at a time while the expected
attainment of one fewer, each scenario weighted by the requests it brings, still meets the target.
The target is the larger of the up count and the current count lowered no further than the keep
count; while the keep horizon still leans on the forecast's prior, nothing is lowered, and the
step (step.py) lowers a count only to the highest of the last lead. Quiet
periods need nothing of their own: what came after quiet moments is in the pairs. What the queue
asks now (the drainable backlog and what it gains before ordered engines serve, the prompts its
drain sends decode, the requests the decode engines hold) is sized on top and loads every
scenario. The tick record reports the expected attainment of the count and of one fewer over the
up scenarios.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.perf.interpolation import PerfModel
from app.core.sla.attainment import PrefillQueue, decode_met, expected
from app.core.sla.capacity import LengthMix, decode_concurrency, peak_concurrency
from app.core.sla.decode_wish import DecodeTerms
from app.core.sla.demand import busiest_rate, dispersion_index, merged_buckets, window_rates
from app.core.sla.forecast import Forecast, LevelPoint, forecast, request_quantile
from app.core.sla.settings import SlaSettings
from app.core.sla.state import SlaState
from app.core.sla.types import Demand, SlaInput
from app.core.sla.wish import wishes_at
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


# The requests in decode of a forecast scenario vary around its level as Poisson's count does: the
# level is the busiest burst the traffic reached, so its bursts are already in it (`_at`).
SCENARIO_FLIGHT_DISPERSION = 1.0


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
        neighbour_share=settings.forecast_neighbour_share,
        min_pairs=settings.growth_min_points,
        prior_growth=settings.cold_start_growth,
        cap=settings.forecast_cap,
        share=settings.attainment_target,
    )
    up = forecast(history, point, start_s=lead_s, end_s=lead_s + horizon_s, floor_now=False, **common)
    # Only the keep horizon is calibrated: releasing an engine is the choice whose miss no order
    # can mend within a lead; the up horizon is ordered again every tick.
    keep = forecast(
        history,
        point,
        start_s=0.0,
        end_s=lead_s + horizon_s,
        floor_now=True,
        quotes=[p.keep for p in history],
        **common,
    )
    state.levels.append(dataclasses.replace(point, keep=keep.quote))
    while state.levels and state.levels[0].t_s <= now - settings.history_s:
        state.levels.popleft()
    return Horizons(up, keep)


def _at(seen: Demand, f: Forecast, share: float, settings: SlaSettings) -> Demand:
    """The demand of the scenarios' request-weighted `share` quantile (each level on its own). Each
    scenario's requests in decode are a level the traffic reached at its busiest burst, so its
    bursts are in the scenarios: the count varies around one as Poisson's does
    (`SCENARIO_FLIGHT_DISPERSION`), not by the dispersion again."""
    tokens_s, flight = request_quantile(f.tokens_s, share), request_quantile(f.flight, share)
    return dataclasses.replace(
        seen,
        flight_dispersion=SCENARIO_FLIGHT_DISPERSION,
        token_rate_s=tokens_s,
        in_flight_mean=flight,
        in_flight=peak_concurrency(
            flight, dispersion=SCENARIO_FLIGHT_DISPERSION, quantile=settings.decode_peak_quantile
        ),
    )


def _expected(
    role: Role, engines: int, f: Forecast, role_diag: dict[str, Any], seen: Demand, queue: PrefillQueue | None
) -> float | None:
    """The expected attainment of `engines` over the scenarios, as attainment.py models it."""
    if engines < 1:
        return None
    if role == "prefill" and queue is not None:
        load = f.tokens_s + float(role_diag.get("backlog_tokens_s") or 0.0)
        return expected(queue.met(engines, load), load)
    if role == "decode":
        pace = float(role_diag.get("pace") or 1.0)
        load = f.flight * pace + float(role_diag.get("backlog_in_flight") or 0.0)
        batch = int(role_diag["batch_limit"])
        return expected(decode_met(engines, batch, load, SCENARIO_FLIGHT_DISPERSION), load)
    return None


def _fewest(
    role: Role,
    sized: int,
    f: Forecast,
    *,
    floor: int,
    share: float,
    role_diag: dict[str, Any],
    seen: Demand,
    queue: PrefillQueue | None,
) -> int:
    """From the count sized at the scenarios' quantile, the fewest engines whose expected attainment
    over the scenarios still meets `share`: the quantile's count meets the targets in the scenarios
    it covers, and fewer engines may still meet them in enough of the requests."""
    engines = sized
    while (
        engines > max(floor, 1) and (_expected(role, engines - 1, f, role_diag, seen, queue) or 0.0) >= share
    ):
        engines -= 1
    return engines


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
    """Per role, the count: the larger of the up count and the current count lowered no further
    than the keep count; with what explains it (`sla.roles`)."""
    assert state.latency is not None
    share = settings.attainment_target
    memo: dict[float, DecodeTerms] = {}
    up, diag = wishes_at(
        _at(seen, horizons.up, share, settings), inp, state, settings, lead_s, model, memo=memo
    )
    keep, _ = wishes_at(
        _at(seen, horizons.keep, share, settings), inp, state, settings, lead_s, model, memo=memo
    )
    now_demand = dataclasses.replace(
        seen,
        in_flight=peak_concurrency(
            seen.in_flight_mean, dispersion=seen.dispersion, quantile=settings.decode_peak_quantile
        ),
    )
    now, _ = wishes_at(now_demand, inp, state, settings, lead_s, model, memo=memo)
    queue = (
        PrefillQueue.build(
            state.latency.prefill,
            seen.mix.computed(state.computed_share),
            ttft_target_ms=settings.ttft_target_ms,
            dispersion=seen.dispersion,
            correction=state.correction,
            max_utilisation=settings.prefill_max_utilisation,
        )
        if "prefill" in up
        else None
    )
    wish: dict[Role, int] = {}
    for role, bounds in settings.bounds.items():
        current = inp.expected.get(role, inp.ready.get(role, 0))

        fewest = functools.partial(
            _fewest,
            role,
            floor=bounds.min_replicas,
            share=share,
            role_diag=diag[role],
            seen=seen,
            queue=queue,
        )
        up[role] = fewest(up[role], horizons.up)
        # Until the keep horizon rests on the traffic's own pairs alone, nothing says what a lead
        # brings back: nothing is released.
        kept = current if horizons.keep.prior else fewest(keep[role], horizons.keep)
        wish[role] = bounds.clamp(max(up[role], min(current, kept)))
        chosen = wish[role]
        diag[role].update(
            wish=chosen,
            needed=max(up[role], min(current, kept)),
            needed_now=now[role],
            up=up[role],
            keep=kept,
            keep_held=bool(horizons.keep.prior),
            attainment=_reported(role, chosen, horizons.up, diag[role], seen, queue),
            attainment_one_fewer=_reported(role, chosen - 1, horizons.up, diag[role], seen, queue),
            gpus_one_more=gpus.get(role, 1),
        )
    return wish, diag


def _reported(
    role: Role, engines: int, f: Forecast, role_diag: dict[str, Any], seen: Demand, queue: PrefillQueue | None
) -> float | None:
    """The expected attainment of `engines` over every request: a prompt no count serves is a miss
    whatever the count. The count is chosen over the servable ones (`_fewest`), or such prompts
    would order the maximum."""
    met = _expected(role, engines, f, role_diag, seen, queue)
    if met is None:
        return None
    unservable = queue.unservable_share if role == "prefill" and queue is not None else 0.0
    return _round(met * (1.0 - unservable))


def _round(value: float | None) -> float | None:
    return round(value, 5) if value is not None else None
