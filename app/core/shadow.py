"""Shadow mode's tick section: per role what the incumbent autoscaler ran beside what the planner
would have ordered, and the predicted SLO attainment of each.

The prediction is the planner's own: the learned latency model and the queueing model attainment
sizing uses (app/core/sla/attainment.py), asked for each count under the demand the tick observed
(the level now, no forecast; app/core/sla/decide.py `observe`). Prefill: the share of prompts whose
wait plus their own prefill meets the TTFT target on that many engines, a prompt no count serves
counted as a miss. Decode: the share of time the requests in decode fit that many engines' batch
limit at the ITL target (the limit the SLA step sized this tick). It is a prediction from the
planner's model, not a measurement: the model may be wrong, and the incumbent is judged by the
planner's picture of its engines. Without a latency model (no profile), without a demand signal
or without the SLA step's batch limit it says nothing (None), never 0 or 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from app.core.diagnostics import ShadowDiagnostics, ShadowRole, SlaDiagnostics
from app.core.sla.attainment import PrefillQueue, decode_met
from app.core.sla.decide import observe
from app.core.sla.latency import LatencyModels
from app.core.sla.settings import SlaSettings
from app.core.sla.state import SlaState
from app.core.sla.types import Demand
from app.core.types import Role

CAVEAT = (
    "predicted attainment is a prediction from the planner's own latency and queueing model under "
    "each tick's observed demand, not a measurement of what the engines served"
)


@dataclass(frozen=True)
class Conditions:
    """What a prediction needs: the planner's picture of its engines and the demand it saw."""

    latency: LatencyModels | None
    demand: Demand | None
    ttft_target_ms: float
    prefill_max_utilisation: float = 1.0
    prefill_correction: float = 1.0
    decode_batch_limit: int | None = None  # one engine's requests at the ITL target
    decode_pace: float = 1.0  # Little's law's ITL over the target (1, or a full engine's)


def conditions(
    state: SlaState, settings: SlaSettings, now_s: float, sla: SlaDiagnostics | None
) -> Conditions:
    """The conditions of a tick at `now_s`: the state after it, and what its SLA step recorded."""
    decode = (sla.roles or {}).get("decode") if sla is not None else None
    batch = decode.batch_limit if decode is not None else None
    pace = decode.pace if decode is not None and decode.pace is not None else 1.0
    return Conditions(
        latency=state.latency,
        demand=observe(state, now_s, settings, None),
        ttft_target_ms=settings.ttft_target_ms,
        prefill_max_utilisation=settings.prefill_max_utilisation,
        prefill_correction=state.correction,
        decode_batch_limit=int(batch) if batch is not None and batch >= 1 else None,
        decode_pace=float(pace),
    )


def predicted_attainment(role: Role, engines: int | None, c: Conditions) -> float | None:
    """The predicted share of `role`'s requests within target on `engines` engines under the
    observed demand; None when the model cannot say (see the module)."""
    if engines is None or c.latency is None or c.demand is None:
        return None
    demand = c.demand
    if role == "prefill":
        queue = PrefillQueue.build(
            c.latency.prefill,
            demand.mix,
            ttft_target_ms=c.ttft_target_ms,
            dispersion=demand.dispersion,
            correction=c.prefill_correction,
            max_utilisation=c.prefill_max_utilisation,
        )
        met = float(queue.met(engines, np.array([demand.token_rate_s]))[0])
        return round(met * (1.0 - queue.unservable_share), 5)
    if role == "decode":
        if c.decode_batch_limit is None:
            return None
        flight = np.array([demand.in_flight_mean * c.decode_pace])
        return round(float(decode_met(engines, c.decode_batch_limit, flight, demand.dispersion)[0]), 5)
    return None


def shadow_section(
    roles: tuple[Role, ...],
    *,
    incumbent: Mapping[Role, int] | None,
    incumbent_ready: Mapping[Role, int] | None,
    planner: Mapping[Role, int] | None,
    wish: Mapping[Role, int | float | None] | None,
    conditions: Conditions | None,
) -> ShadowDiagnostics:
    """The tick's shadow section. `conditions` None: the planner has no latency model to ask (it
    does not run SLA scaling), so nothing is predicted."""
    out: dict[str, ShadowRole] = {}
    for role in roles:
        ran = incumbent.get(role) if incumbent is not None else None
        ordered = planner.get(role) if planner is not None else None
        out[role] = ShadowRole(
            incumbent=ran,
            incumbent_ready=incumbent_ready.get(role) if incumbent_ready is not None else None,
            planner=ordered,
            wish=wish.get(role) if wish is not None else None,
            attainment_incumbent=predicted_attainment(role, ran, conditions) if conditions else None,
            attainment_planner=predicted_attainment(role, ordered, conditions) if conditions else None,
        )
    return ShadowDiagnostics(caveat=CAVEAT, roles=out)
