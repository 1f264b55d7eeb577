"""The counts one demand needs (SLA scaling's sizing at one demand, app/core/sla/step.py and
app/core/sla/decide.py): prefill for the TTFT target including queueing (bursts and the
prompt-length mix, each prompt costing what its uncached part does: computed.py) and the prompts
queued now, plus, while the engines are behind, what that queue gains before engines ordered now
serve (`backlog_growth`); decode for the ITL target by Little's law at the `decode_peak_quantile`
of the requests in flight (app/core/sla/decode_wish.py), with the prompts the queue's drain sends
it, and at least the requests the engines hold now."""

from __future__ import annotations

import math
from typing import Any

from app.core.perf.interpolation import PerfModel
from app.core.sla.backlog import backlog_growth, drainable_tokens
from app.core.sla.capacity import PrefillSizing, prefill_engines
from app.core.sla.decode_wish import DecodeTerms, decode_terms, decode_wish
from app.core.sla.settings import SlaSettings
from app.core.sla.state import SlaState
from app.core.sla.types import Demand, SlaInput
from app.core.types import Role


def wishes_at(
    demand: Demand,
    inp: SlaInput,
    state: SlaState,
    settings: SlaSettings,
    lead_s: float,
    model: PerfModel | None,
    with_held: bool = True,
    memo: dict[float, DecodeTerms] | None = None,
) -> tuple[dict[Role, int], dict[Role, dict[str, Any]]]:
    """The counts `demand` needs, with their diagnostics. `memo` keeps decode's terms (batch limit,
    pace, held floor) per drain rate between calls that differ only in the level: they do not
    depend on it, and the batch limit's bisection is the costliest part of a tick."""
    assert state.latency is not None
    wish: dict[Role, int] = {}
    diag: dict[Role, dict[str, Any]] = {}
    draining_tokens_s = 0.0
    if "prefill" in settings.bounds:
        # The prompts queued now must be cleared too, by the time more engines could serve.
        records = inp.fpm.get("prefill", {}).values() if with_held else ()
        queues = [r.queued.sum_prefill_tokens for r in records]
        drain_s = max(lead_s, settings.level_window_s)

        def size(backlog_tokens: float) -> PrefillSizing:
            return prefill_engines(
                state.latency.prefill,
                token_rate_s=demand.token_rate_s + backlog_tokens / drain_s,
                mix=demand.mix.computed(state.computed_share),
                ttft_target_ms=settings.ttft_target_ms,
                quantile=settings.quantile,
                max_utilisation=settings.prefill_max_utilisation,
                max_engines=settings.bounds["prefill"].max_replicas,
                dispersion=demand.dispersion,
                correction=state.correction,
            )

        queued = sum(queues)
        sizing = size(queued)  # the capacity per engine does not depend on the backlog
        # While engines are on their way the queue is also the first sign of a rise the level
        # lags behind, and counts whole; once the engines ordered serve, what is left is stuck.
        # Read from the counts, not from the order the lead is measured by: that one keeps its
        # first count (2 engines, met long before the crowd's 20 have arrived).
        opened = inp.expected.get("prefill", 0) > inp.ready.get("prefill", 0)
        drainable = queued if opened else drainable_tokens(queues, sizing.capacity_tokens_s, drain_s)
        if drainable < queued:
            sizing = size(drainable)
        growing = backlog_growth(demand, inp, state, settings, lead_s, queued, sizing.capacity_tokens_s)
        if growing > 0:
            sizing = size(drainable + growing)
        backlog_rate = (drainable + growing) / drain_s
        draining_tokens_s = backlog_rate
        wish["prefill"] = settings.bounds["prefill"].clamp(sizing.engines)
        rate = (demand.token_rate_s + backlog_rate) / demand.mix.mean if demand.mix.mean > 0 else 0.0
        diag["prefill"] = {
            "computed_share": round(state.computed_share, 4),
            "needed": sizing.engines,
            "wish": wish["prefill"],
            "utilisation": round(sizing.utilisation, 3),
            "wait_s": round(sizing.wait_s, 3) if math.isfinite(sizing.wait_s) else None,
            "service_s": round(sizing.service_s, 3),
            "capacity_tokens_s": round(sizing.capacity_tokens_s, 1),
            "queued_tokens": queued,
            "stuck_tokens": round(queued - drainable, 1),
            "backlog_growth_tokens": round(growing, 1),
            "backlog_tokens_s": round(backlog_rate, 1),
            "meets_target": sizing.meets_target,
            "miss_share": round(sizing.miss_share, 4),
            "unservable_share": round(sizing.unservable_share, 4),
            "unservable_rate_s": round(sizing.unservable_share * rate, 3),
            "longest_servable_tokens": sizing.longest_servable_tokens,
        }
    if "decode" in settings.bounds:
        terms = memo.get(draining_tokens_s) if memo is not None else None
        if terms is None:
            terms = decode_terms(
                demand, inp, state, settings, model, draining_tokens_s=draining_tokens_s, with_held=with_held
            )
            if memo is not None:
                memo[draining_tokens_s] = terms
        wish["decode"], diag["decode"] = decode_wish(demand, settings, terms)
    return wish, diag
