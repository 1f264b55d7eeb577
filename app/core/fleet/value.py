"""What part of an SLA wish serves the load measured now, and what part is forecast headroom.

SLA scaling sizes for the demand a lead ahead (app/core/sla/demand.py `demand_at`): the busiest
burst of the level window, or the trend level raised by its learned growth or its ramp over the
lead, whichever is more. Its wish therefore holds engines for a rise that may not come. The fleet
step (app/core/fleet/step.py) must tell the two apart: taking a lower priority's running engine costs
that deployment now and for sure, while the headroom engine it pays for starts a start-up delay
later, and serves something only if the forecast rise comes. Measured in `docs/fleet.md`: chat's
flash crowd had levelled off at about 100 requests/s when its learned growth (x2.9 prompt tokens,
x4.4 requests in flight) doubled its wish to 20 GPUs; the fleet step took code's and batch's
engines for it, and chat met no more requests than without them.

`present_need` reads the SLA step's own diagnostics (the tick's `sla` record), so that nothing in
the SLA step changes: the load now is the level (`request_rate_s`, the busiest burst window) at
the measured lengths, with the backlog queued now (and what it gains before ordered engines
serve, and the requests its drain sends decode); prefill's need is its `needed` scaled by that
load over the load it was sized for, decode's the requests in flight at that level (Little's law,
at the same quantile of the count as the SLA step's) over one engine's batch. Scaling prefill
engines in proportion to load ignores the queueing curve (a prefill count's wait falls faster
than linearly), a small error at the counts of a flash crowd (4-10 engines) and one on the side
of taking fewer engines from others.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from app.core.sla.capacity import decode_concurrency
from app.core.types import Role

# Rounding noise of the diagnostics (rounded to 0.1) must not add an engine.
_EPS = 1e-6


def present_need(sla: Mapping[str, Any] | None, *, itl_target_ms: float) -> dict[Role, int] | None:
    """Engines per role for the load measured now (no growth, no ramp), at most the SLA step's
    own `needed`; None when the record has no sizing (model not ready, no traffic)."""
    if not sla or not sla.get("demand") or not sla.get("roles"):
        return None
    demand, roles = sla["demand"], sla["roles"]
    out: dict[Role, int] = {}
    level_rps = float(demand["request_rate_s"])
    if all("needed_now" in r for r in roles.values()):
        # Attainment sizing (decide.py) states the count for the level now itself.
        return {role: min(int(r["needed"]), int(r["needed_now"])) for role, r in roles.items()}
    if "prefill" in roles:
        p = roles["prefill"]
        needed = int(p["needed"])
        backlog_tokens_s = float(p.get("backlog_tokens_s") or 0.0)
        sized_tokens_s = float(demand["token_rate_s"]) + backlog_tokens_s
        # The backlog is kept: it is queued now, not forecast, and the prompts behind it wait.
        now_tokens_s = (
            min(level_rps * float(demand["isl_mean"]), float(demand["token_rate_s"])) + backlog_tokens_s
        )
        share = now_tokens_s / sized_tokens_s if sized_tokens_s > 0 else 0.0
        out["prefill"] = min(needed, math.ceil(needed * share - _EPS))
    if "decode" in roles:
        d = roles["decode"]
        needed = int(d["needed"])
        batch = int(d.get("batch_limit") or 0)
        # Both at the pace the step sized decode at (a full engine's ITL over the target).
        pace = float(d.get("pace") or 1.0)
        sized_mean = float(demand["in_flight_mean"]) * pace
        now_mean = pace * decode_concurrency(
            request_rate_s=level_rps, osl_tokens=float(demand["osl_mean"]), itl_target_ms=itl_target_ms
        )
        now_mean = min(now_mean, sized_mean)
        # The SLA step sizes for a quantile of the count in flight, mean + z·sqrt(mean × dispersion)
        # (capacity.py `peak_concurrency`); its z·sqrt(dispersion) is read back from the sized
        # mean and quantile, so that the load now gets the same quantile. (Scaling the quantile in
        # proportion to the mean would shrink its spread too, and under-count small deployments.)
        # The prompts prefill's backlog drain sends decode are load now too (the backlog is).
        drained = float(d.get("backlog_in_flight") or 0.0)
        sized_peak = float(d["in_flight_at_target"])
        arrivals_peak = sized_peak - drained
        spread = (arrivals_peak - sized_mean) / math.sqrt(sized_mean) if sized_mean > 0 else 0.0
        now_peak = now_mean + max(spread, 0.0) * math.sqrt(now_mean) if now_mean > 0 else 0.0
        now_peak += drained
        if batch > 0:
            # The requests held now (decoding or queued) are load now too, as in the SLA step.
            now_engines = max(
                math.ceil(min(now_peak, sized_peak) / batch - _EPS),
                math.ceil(int(d.get("held_now") or 0) / batch - _EPS),
            )
        else:
            now_engines = needed
        out["decode"] = min(needed, now_engines)
    return out
