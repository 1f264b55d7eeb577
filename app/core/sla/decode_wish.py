"""Decode's wish in SLA scaling (app/core/sla/step.py): Little's law on the requests in flight,
at a full engine's pace, over the largest batch meeting the ITL target (app/core/sla/capacity.py),
and at least what the engines hold now."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from app.core.perf.interpolation import PerfModel
from app.core.sla.capacity import (
    decode_batch_cap,
    decode_batch_limit,
    decode_concurrency,
    decode_context,
    decode_iteration_ms,
    peak_concurrency,
    profile_decode_floor,
)
from app.core.sla.learners import decode_floor_scale
from app.core.sla.settings import SlaSettings
from app.core.sla.state import HeldContext, SlaState
from app.core.sla.types import Demand, SlaInput


@dataclass(frozen=True)
class DecodeTerms:
    """What decode's count is sized from, besides the demand: one engine's batch limit, the pace a
    full engine iterates at (1: the target), the requests prefill's drain sends on top of the
    arrivals, and what the engines hold now (with the batch limit at their context)."""

    batch: int
    pace: float
    drained: float
    held: int
    held_batch: int
    diagnostics: dict[str, Any]

    def floor(self) -> int:
        """Engines for the requests held now: never fewer."""
        return math.ceil(self.held / self.held_batch) if self.held else 0


def decode_wish(demand: Demand, settings: SlaSettings, terms: DecodeTerms) -> tuple[int, dict[str, Any]]:
    """The decode count wished for at `demand` and its diagnostics (`sla.roles.decode`), from
    decode's `terms` (`decode_terms`)."""
    arrivals = peak_concurrency(
        demand.in_flight_mean * terms.pace,
        dispersion=demand.dispersion if demand.flight_dispersion is None else demand.flight_dispersion,
        quantile=settings.decode_peak_quantile,
    )
    in_flight = arrivals + terms.drained * terms.pace
    needed = max(math.ceil(in_flight / terms.batch), terms.floor())
    wish = settings.bounds["decode"].clamp(needed)
    return wish, {
        "needed": needed,
        "wish": wish,
        "in_flight_at_target": round(in_flight, 1),
        **terms.diagnostics,
    }


def decode_terms(
    demand: Demand,
    inp: SlaInput,
    state: SlaState,
    settings: SlaSettings,
    model: PerfModel | None,
    *,
    draining_tokens_s: float,
    with_held: bool,
) -> DecodeTerms:
    """Decode's batch limit, pace, drained load and held floor (see `DecodeTerms`). `draining_tokens_s`:
    the prompt tokens per second prefill is sized to drain from its queue; `with_held`: read the
    engines' FPM (the requests they hold, their context and pace), else size for demand alone."""
    assert state.latency is not None
    held_context = _held_context(inp) if with_held else None
    # The requests to come are sized at the context the engines held over the trend window; the
    # requests held now at their own. A tick's few requests are a noisy sample of the mix: on the
    # Mooncake arXiv trace their mean context read 2k-26k tokens from tick to tick around a
    # 17k mean, the batch limit 26-107, and each long reading ordered engines (decode 3 -> 11
    # in Dynamo's replay) that the next tick's would not have.
    window_context = _window_context(state) if with_held else None
    floor_scale = decode_floor_scale(state, settings)
    floor = profile_decode_floor(model, floor_scale) if model is not None else None
    cost, sized_ms = state.latency.decode, settings.itl_target_ms * settings.decode_itl_margin

    def batch_at(context_tokens: float | None) -> int:
        return decode_batch_limit(
            cost,
            isl_tokens=demand.isl,
            osl_tokens=demand.osl,
            itl_target_ms=sized_ms,
            max_kv_tokens=settings.max_kv_tokens,
            max_num_seqs=settings.max_num_seqs,
            held_context_tokens=context_tokens,
            profile_itl_ms=floor,
        )

    batch = batch_at(window_context)
    # Requests decode at the pace of a full engine, not at the target: where the KV cache (or
    # `max_num_seqs`) bounds the batch before the target does, a full engine iterates below the
    # target and its requests leave sooner. Where the target bounds it, the pace is 1 (a batch
    # of whole requests iterates a little under the target; read as a pace, that cut decode by
    # 1.5-3.3%). Never faster than the engines iterate now: engines overrun by a crowd run
    # slower than any full engine the model pictures.
    context, need = decode_context(demand.isl, demand.osl, window_context)
    pace = 1.0
    if batch >= decode_batch_cap(
        need, max_kv_tokens=settings.max_kv_tokens, max_num_seqs=settings.max_num_seqs
    ):
        full_ms = decode_iteration_ms(cost, batch, context, floor)
        seen_ms = _slowest_decode_ms(inp) if with_held else 0.0
        pace = min(1.0, max(full_ms, seen_ms) / sized_ms)
    # The prompts prefill drains from its queue reach decode on top of the arrivals, at the
    # rate prefill is sized to drain them: a queue stuck on its engines still sends decode
    # what those engines clear (a crowd's two first engines, some 750 requests in flight).
    drained = (
        decode_concurrency(
            request_rate_s=draining_tokens_s / demand.isl,
            osl_tokens=demand.osl,
            itl_target_ms=settings.itl_target_ms,
        )
        if draining_tokens_s > 0 and demand.isl > 0
        else 0.0
    )
    held = (
        sum(
            r.scheduled.num_decode_requests + r.queued.num_decode_requests
            for r in inp.fpm.get("decode", {}).values()
        )
        if with_held
        else 0
    )
    held_batch = batch_at(held_context) if held else batch
    return DecodeTerms(
        batch=batch,
        pace=pace,
        drained=drained,
        held=held,
        held_batch=held_batch,
        diagnostics={
            "batch_limit": batch,
            "backlog_in_flight": round(drained * pace, 1),
            "held_now": held,
            "held_context_tokens": round(held_context, 1) if held_context is not None else None,
            "window_context_tokens": round(window_context, 1) if window_context is not None else None,
            "held_batch_limit": held_batch,
            "floor_scale": round(floor_scale, 3),
            "pace": round(pace, 4),
        },
    )


def _slowest_decode_ms(inp: SlaInput) -> float:
    """The longest latest iteration of the decode engines that hold requests (0: none does)."""
    records = inp.fpm.get("decode", {}).values()
    return max((1000.0 * r.wall_time_s for r in records if r.scheduled.num_decode_requests), default=0.0)


def record_held(state: SlaState, inp: SlaInput, now_s: float, window_s: float) -> None:
    """Keep the decode engines' KV tokens and requests of this tick, for `window_s`."""
    records = inp.fpm.get("decode", {}).values()
    requests = sum(r.scheduled.num_decode_requests for r in records)
    if requests:
        kv_tokens = sum(r.scheduled.sum_decode_kv_tokens for r in records)
        state.held.append(HeldContext(now_s, kv_tokens, requests))
    while state.held and state.held[0].t_s <= now_s - window_s:
        state.held.popleft()


def _window_context(state: SlaState) -> float | None:
    """The mean context of the requests the decode engines held over the window (None: none)."""
    requests = sum(h.requests for h in state.held)
    return sum(h.kv_tokens for h in state.held) / requests if requests else None


def _held_context(inp: SlaInput) -> float | None:
    """The mean context of the requests the decode engines hold now (None: they hold none)."""
    records = inp.fpm.get("decode", {}).values()
    requests = sum(r.scheduled.num_decode_requests for r in records)
    return sum(r.scheduled.sum_decode_kv_tokens for r in records) / requests if requests else None
