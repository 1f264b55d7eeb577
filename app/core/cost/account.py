"""The billing rule: what a deployment's engines cost between two ticks.

At every tick the shell (the service's worker, the embedding) records a `CostSample`: the engines
billed per role from that tick on, those ready with no work, GPUs per engine and the price of a
GPU-hour. An engine is billed from its order to its removal, starting engines included: per role
the most of what the decision in force ordered, what the inventory reports ready and what reports
forward passes (an engine still draining after an order lowered the count reports them until it
stops). `advance` bills the interval from the previous sample to this one at the previous
sample's counts (what was ordered at a tick runs until a later tick sees otherwise), the way the
simulator bills its engines between their changes (app/sim/world/cluster.py `gpu_seconds`).

An interval is not billed, and counts as unobserved, when the previous sample's counts were
unknown (no order in force, no inventory, no forward passes) or when it is longer than
`MAX_BILLED_GAP_S` (the planner was stopped: what ran meanwhile is not known to it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.perf.fpm import ForwardPassMetrics
from app.core.types import DecisionStatus, DecisionView, EngineKey

# A restart or a failover resumes ticking within minutes (the worker lease's TTL is 30 s, a pod
# restart a minute or two): the engines ran as ordered meanwhile, and the gap is billed. A longer
# silence is a planner that was stopped, and what ran then is not the planner's to know.
MAX_BILLED_GAP_S = 900.0

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class CostSample:
    """One tick's counts, billed from `at_s` until the next sample."""

    at_s: float
    billed: dict[str, int] | None  # engines per role; None: unknown, nothing is billed
    idle: dict[str, int | None]  # per role, billed engines ready with no work; None: unknown
    gpus_per_engine: dict[str, int]
    cost_per_gpu_hour: float

    def as_json(self) -> dict[str, Any]:
        return {
            "billed": self.billed,
            "idle": self.idle,
            "gpus_per_engine": self.gpus_per_engine,
            "cost_per_gpu_hour": self.cost_per_gpu_hour,
        }


@dataclass(frozen=True)
class Interval:
    """What one interval between two samples billed."""

    start_s: float
    end_s: float
    sample: CostSample  # the counts it was billed at
    gpu_s: dict[str, float]  # per role
    cost: float
    idle_gpu_s: float  # of the roles whose idleness was known
    idle_known_gpu_s: float  # billed GPU-seconds of those roles


@dataclass(frozen=True)
class CostTotals:
    """The running account, stored with every tick: a restarted or a new leader resumes it from
    the last stored tick."""

    gpu_s: dict[str, float] = field(default_factory=dict)  # per role
    cost: float = 0.0
    idle_gpu_s: float = 0.0
    idle_known_gpu_s: float = 0.0
    unobserved_s: float = 0.0  # time between samples that was not billed (see the module)

    @property
    def gpu_hours(self) -> dict[str, float]:
        return {role: s / SECONDS_PER_HOUR for role, s in self.gpu_s.items()}

    def as_json(self) -> dict[str, Any]:
        return {
            "gpu_s": dict(self.gpu_s),
            "cost": self.cost,
            "idle_gpu_s": self.idle_gpu_s,
            "idle_known_gpu_s": self.idle_known_gpu_s,
            "unobserved_s": self.unobserved_s,
        }

    @classmethod
    def from_json(cls, value: Any) -> CostTotals | None:
        """A stored account; None when it does not read as one (it is then started afresh)."""
        if not isinstance(value, Mapping):
            return None
        gpu_s = value.get("gpu_s")
        numbers = [value.get(k) for k in ("cost", "idle_gpu_s", "idle_known_gpu_s", "unobserved_s")]
        if not isinstance(gpu_s, Mapping) or not all(_number(v) for v in [*numbers, *gpu_s.values()]):
            return None
        cost, idle, known, unobserved = (float(v) for v in numbers)  # type: ignore[arg-type]
        return cls({str(r): float(s) for r, s in gpu_s.items()}, cost, idle, known, unobserved)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def interval(
    previous: CostSample, sample_at_s: float, *, max_gap_s: float = MAX_BILLED_GAP_S
) -> Interval | None:
    """What `previous`'s counts bill until `sample_at_s`; None when nothing is billed. A
    simulator that samples its engines at every change (not every tick) bills any gap."""
    dt = sample_at_s - previous.at_s
    if dt <= 0 or previous.billed is None or dt > max_gap_s:
        return None
    gpu_s = {r: n * previous.gpus_per_engine.get(r, 1) * dt for r, n in previous.billed.items()}
    idle_s = known_s = 0.0
    for role, idle in previous.idle.items():
        if idle is not None and role in gpu_s:
            idle_s += idle * previous.gpus_per_engine.get(role, 1) * dt
            known_s += gpu_s[role]
    cost = sum(gpu_s.values()) / SECONDS_PER_HOUR * previous.cost_per_gpu_hour
    return Interval(previous.at_s, sample_at_s, previous, gpu_s, cost, idle_s, known_s)


def advance(
    totals: CostTotals,
    previous: CostSample | None,
    sample: CostSample,
    *,
    max_gap_s: float = MAX_BILLED_GAP_S,
) -> tuple[CostTotals, Interval | None]:
    """The account after `sample`, and the interval it closed (None: nothing billed)."""
    if previous is None:
        return totals, None
    billed = interval(previous, sample.at_s, max_gap_s=max_gap_s)
    if billed is None:
        gap = max(0.0, sample.at_s - previous.at_s)
        return replace(totals, unobserved_s=totals.unobserved_s + gap), None
    gpu_s = dict(totals.gpu_s)
    for role, s in billed.gpu_s.items():
        gpu_s[role] = gpu_s.get(role, 0.0) + s
    return (
        replace(
            totals,
            gpu_s=gpu_s,
            cost=totals.cost + billed.cost,
            idle_gpu_s=totals.idle_gpu_s + billed.idle_gpu_s,
            idle_known_gpu_s=totals.idle_known_gpu_s + billed.idle_known_gpu_s,
        ),
        billed,
    )


def billed_engines(
    roles: Iterable[str],
    *,
    ordered: Mapping[str, int] | None,
    ready: Mapping[str, int] | None,
    fpm: Mapping[str, Mapping[EngineKey, ForwardPassMetrics]],
) -> dict[str, int] | None:
    """Engines billed per role: the most of what the decision in force ordered (starting engines
    included), what is ready and what reports forward passes (draining engines included).
    None when a role has none of the three: an unknown count is not billed as zero engines."""
    billed: dict[str, int] = {}
    for role in roles:
        known = [
            n
            for n in (
                ordered.get(role) if ordered is not None else None,
                ready.get(role) if ready is not None else None,
                len(_workers(fpm[role])) if fpm.get(role) else None,
            )
            if n is not None
        ]
        if not known:
            return None
        billed[role] = max(known)
    return billed


def idle_engines(
    billed: Mapping[str, int] | None, fpm: Mapping[str, Mapping[EngineKey, ForwardPassMetrics]]
) -> dict[str, int | None]:
    """Per role, the billed engines ready with no work: every rank's latest forward pass ran and
    queued nothing (an idle heartbeat, or an empty pass). None where the tick read no forward
    passes of the role, or none reported while engines were billed (unknown, not idle)."""
    out: dict[str, int | None] = {}
    for role, count in (billed or {}).items():
        records = fpm.get(role)
        if count == 0:
            out[role] = 0
        elif not records:
            out[role] = None
        else:
            idle = sum(1 for ranks in _workers(records).values() if all(_no_work(r) for r in ranks))
            out[role] = min(idle, count)
    return out


def _workers(records: Mapping[EngineKey, ForwardPassMetrics]) -> dict[str, list[ForwardPassMetrics]]:
    """An engine's data-parallel ranks report apart; the engine is the worker."""
    workers: dict[str, list[ForwardPassMetrics]] = {}
    for (worker, _rank), record in records.items():
        workers.setdefault(worker, []).append(record)
    return workers


def _no_work(record: ForwardPassMetrics) -> bool:
    s, q = record.scheduled, record.queued
    return record.is_heartbeat or not (
        s.num_prefill_requests or s.num_decode_requests or q.num_prefill_requests or q.num_decode_requests
    )


def ordered_by(decision: DecisionView | None) -> dict[str, int] | None:
    """What the decision in force after a tick ordered: one pending or carried out (a failed or
    expired one ordered nothing that runs)."""
    if decision is None or decision.status not in (DecisionStatus.PENDING, DecisionStatus.SUCCEEDED):
        return None
    return dict(decision.replicas)


def tick_sample(
    now_s: float,
    roles: Iterable[str],
    *,
    ordered: Mapping[str, int] | None,
    ready: Mapping[str, int] | None,
    fpm: Mapping[str, Mapping[EngineKey, ForwardPassMetrics]],
    gpus_per_engine: Mapping[str, int],
    cost_per_gpu_hour: float,
) -> CostSample:
    """A tick's sample, from what the tick saw and the decision in force after it."""
    roles = tuple(roles)
    billed = billed_engines(roles, ordered=ordered, ready=ready, fpm=fpm)
    return CostSample(
        at_s=now_s,
        billed=billed,
        idle=idle_engines(billed, fpm),
        gpus_per_engine={r: int(gpus_per_engine.get(r, 1)) for r in roles},
        cost_per_gpu_hour=cost_per_gpu_hour,
    )


def sample_from_json(at_s: float, value: Any) -> CostSample | None:
    """A stored sample (the tick record's `cost` section); None when it does not read as one."""
    if not isinstance(value, Mapping):
        return None
    billed, idle, gpus, price = (
        value.get("billed"),
        value.get("idle"),
        value.get("gpus_per_engine"),
        value.get("cost_per_gpu_hour"),
    )
    if not (isinstance(gpus, Mapping) and _number(price) and isinstance(idle, Mapping | None)):
        return None
    if billed is not None and not (isinstance(billed, Mapping) and all(_count(v) for v in billed.values())):
        return None
    return CostSample(
        at_s=at_s,
        billed={str(r): int(n) for r, n in billed.items()} if billed is not None else None,
        idle={str(r): (int(n) if _count(n) else None) for r, n in (idle or {}).items()},
        gpus_per_engine={str(r): int(g) for r, g in gpus.items() if _count(g)},
        cost_per_gpu_hour=float(price),
    )


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def resume(at_s: float | None, stored: Any) -> tuple[CostTotals, CostSample | None]:
    """The account and last sample a tick record stored (its `cost` section, `at_s` its time);
    a fresh account when there is none or it does not read."""
    if at_s is None or not isinstance(stored, Mapping):
        return CostTotals(), None
    totals = CostTotals.from_json(stored.get("totals"))
    sample = sample_from_json(at_s, stored)
    if totals is None or sample is None:
        return CostTotals(), None
    return totals, sample
