"""Hardware variants: one deployment served by engines of several kinds (GPU type, GPUs per
engine, profile, price), grown cheapest per unit of SLA-meeting capacity first.

A deployment's own planner wishes engines of its *primary* variant (the first listed: the
hardware its profile describes). The fleet step reads that wish as capacity, per role
(`wish × capacity of a primary engine`), and splits it over the variants here, before its usual
rules (app/core/fleet/step.py) grant each variant's engines under its GPU type's budget:

- **Capacity per engine** (`engine_capacity`), from a variant's profile at the deployment's SLA
  targets, by the SLA core's own formulas (app/core/sla/capacity.py on the profile's prior
  latency models, app/core/sla/latency.py): prefill, the most prompt tokens per second one
  engine serves while its TTFT quantile meets the target; decode, the most requests one engine
  holds while its iteration meets the ITL target.
- **Cost per unit** = price per GPU-hour × GPUs per engine ÷ capacity per engine.
- **Shrinking** (`split_wish`): the previous engines of each variant are kept, and while the
  capacity they give exceeds the need by at least one engine, the dearest variant's engine goes
  first.
- **Growing**: the capacity still needed is added cheapest per unit first, each variant within
  the room its GPU type has (the budget less what others are expected to hold, see `_room`);
  what no variant has room for goes to the cheapest variant, whose grant the fleet step then
  cuts, naming its GPU type and who holds it.

Engines already running on a dear variant are not replaced by cheap ones when cheap room frees
up: that would restart engines to save money; the dear ones go first at the next shrink.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from app.core.fleet.types import FleetMember, FleetSettings, FleetState, Variant
from app.core.perf.interpolation import PerfModel
from app.core.sla.capacity import LengthMix, decode_batch_limit, prefill_engines
from app.core.sla.latency import prior_models
from app.core.sla.settings import SlaModel
from app.core.types import Role

# Capacities are floats: a split covering the need to within this share of an engine is met
# (so that 3 engines of 1/3 each cover 1, whatever the rounding).
_EPS = 1e-9
# The prefill bisection stops when the rate is known to this share.
_RATE_TOLERANCE = 1e-3


def engine_capacity(
    model: PerfModel,
    *,
    ttft_target_ms: float,
    itl_target_ms: float,
    isl_tokens: float,
    osl_tokens: float,
    chunk_tokens: int,
    max_kv_tokens: int | None = None,
    max_num_seqs: int | None = None,
    attainment_target: float = 0.99,
    params: SlaModel | None = None,
) -> dict[Role, float]:
    """SLA-meeting capacity of one engine per role, read from a profile as SLA scaling reads it
    before any forward pass is seen (its prior latency models), at one request shape.

    prefill: the largest token rate at which `prefill_engines` sizes one engine that meets the
    TTFT target for the attainment target's share of prompts, at the utilisation bound
    (bisection: the count grows with the rate). decode: `decode_batch_limit` at the ITL target
    (× `decode_itl_margin`)."""
    params = params or SlaModel()
    latency = prior_models(
        model,
        chunk_tokens=chunk_tokens,
        prior_records=params.latency_prior_records,
        half_life_s=params.latency_half_life_s,
    )
    mix = LengthMix.uniform(isl_tokens)

    def one_engine_meets(rate_tokens_s: float) -> bool:
        sizing = prefill_engines(
            latency.prefill,
            token_rate_s=rate_tokens_s,
            mix=mix,
            ttft_target_ms=ttft_target_ms,
            quantile=attainment_target,
            max_utilisation=params.prefill_max_utilisation,
            max_engines=1,
        )
        return sizing.engines <= 1 and sizing.meets_target

    # An engine never serves more than its saturated rate; the bisection searches below it.
    saturated = prefill_engines(
        latency.prefill, token_rate_s=1.0, mix=mix, ttft_target_ms=ttft_target_ms, max_engines=1
    ).capacity_tokens_s
    lo, hi = 0.0, saturated
    if not one_engine_meets(_EPS):
        prefill = 0.0  # the prompt alone misses the target: no rate is served on time
    else:
        while hi - lo > _RATE_TOLERANCE * max(hi, 1.0):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if one_engine_meets(mid) else (lo, mid)
        prefill = lo
    decode = decode_batch_limit(
        latency.decode,
        isl_tokens=isl_tokens,
        osl_tokens=osl_tokens,
        itl_target_ms=itl_target_ms * params.decode_itl_margin,
        max_kv_tokens=max_kv_tokens or model.decode.data.max_kv_tokens,
        max_num_seqs=max_num_seqs,
    )
    return {"prefill": prefill, "decode": float(decode)}


# --- the split ---------------------------------------------------------------------------------


def variant_key(deployment: str, variant: str) -> str:
    """The fleet step's name for one variant of a deployment (grants, state, cuts)."""
    return f"{deployment}@{variant}"


def by_cost(variants: Sequence[Variant], role: Role) -> list[Variant]:
    """Cheapest per unit first; a tie keeps the listed order (the primary first)."""
    order = {v.name: i for i, v in enumerate(variants)}
    return sorted(variants, key=lambda v: (v.cost_per_unit(role), order[v.name]))


def split_wish(
    variants: Sequence[Variant],
    wish: Mapping[Role, int],
    previous: Mapping[str, Mapping[Role, int]],
    room_gpus: Mapping[str, float],
    max_gpus: float = math.inf,
) -> dict[str, dict[Role, int]]:
    """Engines per variant (by name) and role that cover `wish` (in engines of `variants[0]`).

    `previous`: each variant's engines granted last time; `room_gpus`: per GPU type, the GPUs
    this deployment may expect to add to what it keeps (the caller's estimate); `max_gpus`: the
    deployment's max share over all its variants."""
    primary = variants[0]
    out: dict[str, dict[Role, int]] = {v.name: {role: 0 for role in wish} for v in variants}
    room = dict(room_gpus)
    share_left = max_gpus
    for role, want in wish.items():
        need = want * primary.capacity.get(role, 0.0)
        kept = {v.name: previous.get(v.name, {}).get(role, 0) for v in variants}
        have = sum(kept[v.name] * v.capacity.get(role, 0.0) for v in variants)
        # Shrink: the dearest variant's engines go first, while the rest still cover the need.
        for v in reversed(by_cost(variants, role)):
            cap = v.capacity.get(role, 0.0)
            while kept[v.name] > 0 and have - cap >= need - _EPS * max(cap, 1.0):
                kept[v.name] -= 1
                have -= cap
        for v in variants:
            gpus = kept[v.name] * v.gpus_per_engine.get(role, 1)
            room[v.gpu_type] = room.get(v.gpu_type, 0.0) - gpus
            share_left -= gpus
            out[v.name][role] = kept[v.name]
        # Grow: cheapest per unit first, within each type's room and the max share.
        missing = need - have
        ranked = [v for v in by_cost(variants, role) if v.capacity.get(role, 0.0) > 0]
        for v in ranked:
            if missing <= _EPS:
                break
            cap, per = v.capacity[role], v.gpus_per_engine.get(role, 1)
            fits = int(max(0.0, min(room.get(v.gpu_type, 0.0), share_left)) // per)
            add = min(math.ceil(missing / cap - _EPS), fits)
            if add <= 0:
                continue
            out[v.name][role] += add
            room[v.gpu_type] -= add * per
            share_left -= add * per
            missing -= add * cap
        if missing > _EPS and ranked:
            # No variant has room: the cheapest asks anyway, and the fleet step cuts it with
            # the reason and who holds its GPU type's budget.
            v = ranked[0]
            out[v.name][role] += math.ceil(missing / v.capacity[role] - _EPS)
    return out


# --- in the fleet step --------------------------------------------------------------------------


def expand_variants(
    members: Sequence[FleetMember], settings: FleetSettings, state: FleetState
) -> list[FleetMember]:
    """Each member with variants becomes one member per variant, its wish split over them
    (`split_wish`); members without variants pass unchanged (and so does the whole list when no
    member has variants). Higher priorities are split first, so that they see the room lower
    priorities must leave them."""
    if not any(m.variants for m in members):
        return list(members)
    index = {m.name: i for i, m in enumerate(members)}
    split: dict[str, list[FleetMember]] = {}
    for m in sorted((m for m in members if m.variants), key=lambda m: (-m.priority, index[m.name])):
        previous = {v.name: state.grants.get(variant_key(m.name, v.name), {}) for v in m.variants}
        room = {
            gpu_type: budget - _held_by_others(m, members, split, state, gpu_type)
            for gpu_type, budget in settings.budget_gpus.items()
        }
        limit = math.inf if m.max_gpus is None else float(m.max_gpus)
        wishes = split_wish(m.variants, m.wish, previous, room, limit)
        split[m.name] = [
            FleetMember(
                name=variant_key(m.name, v.name),
                gpu_type=v.gpu_type,
                priority=m.priority,
                guaranteed_gpus=m.guaranteed_gpus if i == 0 else 0,
                max_gpus=m.max_gpus,
                gpus_per_engine=v.gpus_per_engine,
                wish=wishes[v.name],
                variant=v.name,
                deployment=m.name,
            )
            for i, v in enumerate(m.variants)
        ]
    out: list[FleetMember] = []
    for m in members:
        out.extend(split.get(m.name, [m]))
    return out


def _held_by_others(
    m: FleetMember,
    members: Sequence[FleetMember],
    split: Mapping[str, Sequence[FleetMember]],
    state: FleetState,
    gpu_type: str,
) -> int:
    """GPUs of `gpu_type` that `m` should not expect to get: what higher priorities wish, what
    equal priorities hold (moves between them need the value rule and the hold), and lower
    priorities' guarantees (the rest of theirs, `m` may take at once). An estimate for the
    split: the rules then grant exactly."""
    total = 0
    for o in members:
        if o.name == m.name:
            continue
        if o.name in split:  # a variant member split before this one
            total += sum(_wish_gpus(p) for p in split[o.name] if p.gpu_type == gpu_type)
            continue
        parts = (
            [(variant_key(o.name, v.name), v.gpu_type, v.gpus_per_engine) for v in o.variants]
            if o.variants
            else [(o.name, o.gpu_type, o.gpus_per_engine)]
        )
        for i, (key, part_type, per) in enumerate(parts):
            if part_type != gpu_type:
                continue
            if o.priority > m.priority:  # (one with variants was split already, above)
                total += sum(n * per.get(r, 1) for r, n in o.wish.items())
            elif o.priority == m.priority:
                held = dict(state.grants.get(key, {}))
                if not o.variants:  # its wish is in these engines: it keeps no more than it wishes
                    held = {r: min(n, o.wish.get(r, 0)) for r, n in held.items()}
                total += sum(n * per.get(r, 1) for r, n in held.items())
            elif i == 0:
                wish_gpus = sum(n * per.get(r, 1) for r, n in o.wish.items())
                total += min(o.guaranteed_gpus, wish_gpus)
    return total


def _wish_gpus(m: FleetMember) -> int:
    return sum(n * m.gpus_per_engine.get(r, 1) for r, n in m.wish.items())
