"""Quiet periods: what scaling down would cost if the traffic came back.

During a quiet period (the trend level below `quiet_fraction` of the usual busy level) the wish
falls to the bounds' minimum. Engines released then are back no sooner than a lead after the next
burst starts, and the burst is routed on arrival to the engines that remain, where it queues. So
the planner keeps what a return would need while a return within one lead (plus the level
window) is likely:

- **How long quiet periods last** is learned from the traffic's own history: the completed quiet
  periods' durations (the last `_KEPT` of them). Given the current one has lasted `a`, the chance
  it ends within the horizon `h` is the share of the longer-than-`a` ones that ended by `a + h`,
  with a prior worth one period: `h / (a + h)`, what a heavy-tailed (Pareto, Lindy) duration says
  when nothing is known. With no history, or past the longest learned period, that prior alone
  decides: keep at first, let go after about four horizons of silence.
- **How large the returns are**: the demand sized for within a lead of each return, the
  largest of the recent ones. The traffic the planner started into counts as one, at its burst
  level (its sizing held the cold-start headroom): on bursty-gaps the first burst was the largest
  for minutes, and counting only returns after quiet periods kept too little for the next one of
  its size. With none measured yet (a quiet period within a lead of the start), the highest burst
  level of the busy period before it: what the traffic did, not what was forecast for it (a
  headroom learned from one flash crowd, x10, once kept both roles at their maximum for 18
  minutes after the traffic ended).

The choice and its expected costs are reported each tick: the engine-seconds kept over the
horizon, and the requests expected to arrive to too few engines if they are let go.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from app.core.sla.types import Demand

_KEPT = 50
_RECENT_RETURNS = 10


@dataclass(frozen=True)
class QuietState:
    busy_tokens_s: float = 0.0  # the peak burst level of the busy period before (prompt tokens/s)
    busy_flight: float = 0.0  # ... requests in decode
    since_s: float | None = None  # when the current quiet period began
    durations_s: tuple[float, ...] = ()
    returns: tuple[tuple[float, float], ...] = ()  # (tokens/s, flight) reached within a lead of a return
    # The last return, its level still being measured; the first tick counts as one (the traffic
    # the planner starts into is a burst's size as much as any that follows a quiet period).
    returned_s: float | None = None
    started: bool = False
    return_peak: tuple[float, float] = (0.0, 0.0)


@dataclass(frozen=True)
class QuietOutlook:
    quiet: bool
    age_s: float
    return_probability: float
    keep: bool
    return_tokens_s: float
    return_flight: float
    periods_seen: int


def observe(
    state: QuietState,
    now_s: float,
    tokens_s: float,
    demand: Demand,
    *,
    usual_tokens_s: float,
    quiet_fraction: float,
    lead_s: float,
) -> QuietState:
    """Fold the tick at `now_s` in: the trend level of prompt tokens (`tokens_s`) starts or ends a
    quiet period. The tick's `demand` measures the returns by what it sized for (prompt tokens/s
    and requests in decode, the forecast included) and the busy periods by its burst level alone
    (no forecast)."""
    quiet = usual_tokens_s > 0 and tokens_s <= quiet_fraction * usual_tokens_s
    need_tokens, flight = demand.token_rate_s, demand.in_flight_mean
    level_tokens, level_flight = demand.request_rate_s * demand.isl, demand.level_in_flight
    s = state
    if not s.started:
        s = replace(
            s, started=True, returned_s=None if quiet else now_s, return_peak=(level_tokens, level_flight)
        )
    if s.returned_s is not None:
        # The start's sample is the traffic's level: its sizing held the cold-start headroom.
        first = not s.returns and not s.durations_s
        got = (level_tokens, level_flight) if first else (need_tokens, flight)
        peak = (max(s.return_peak[0], got[0]), max(s.return_peak[1], got[1]))
        if now_s - s.returned_s >= lead_s or quiet:
            s = replace(s, returns=(*s.returns, peak)[-_KEPT:], returned_s=None, return_peak=(0.0, 0.0))
        else:
            s = replace(s, return_peak=peak)
    if quiet and s.since_s is None:
        return replace(s, since_s=now_s)
    if not quiet and s.since_s is not None:
        duration = now_s - s.since_s
        return replace(
            s,
            since_s=None,
            durations_s=(*s.durations_s, duration)[-_KEPT:],
            returned_s=now_s,
            return_peak=(need_tokens, flight),
            busy_tokens_s=level_tokens,
            busy_flight=level_flight,
        )
    if not quiet:
        # The busy period's peak: what a return is taken to need until returns are seen.
        return replace(
            s,
            busy_tokens_s=max(s.busy_tokens_s, level_tokens),
            busy_flight=max(s.busy_flight, level_flight),
        )
    return s


def outlook(state: QuietState, now_s: float, horizon_s: float, keep_probability: float) -> QuietOutlook:
    if state.since_s is None:
        return QuietOutlook(False, 0.0, 0.0, False, 0.0, 0.0, len(state.durations_s))
    age = now_s - state.since_s
    longer = [d for d in state.durations_s if d > age]
    ended = sum(1 for d in longer if d <= age + horizon_s)
    prior = horizon_s / (age + horizon_s) if age + horizon_s > 0 else 1.0
    # The prior counts as one more period. A silence longer than every learned one has only the
    # prior to go by: the learned periods say nothing about how much longer it lasts.
    p = (ended + prior) / (len(longer) + 1)
    recent = state.returns[-_RECENT_RETURNS:]
    if recent:
        tokens = max(r[0] for r in recent)
        flight = max(r[1] for r in recent)
    else:
        tokens, flight = state.busy_tokens_s, state.busy_flight
    return QuietOutlook(True, age, p, p >= keep_probability, tokens, flight, len(state.durations_s))
