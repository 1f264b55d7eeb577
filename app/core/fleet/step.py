"""The fleet step: many deployments' wishes under one GPU budget per GPU type.

Each deployment's own planner says how many engines of each role it wants (its *wish*: the SLA
step's target before any cap). `fleet_step(members, settings, state, now_s)` answers how many each
may run (its *grant*), every grant with a reason, and for a deployment that was cut: why and
which deployments hold the GPUs it wanted. Pure: `now_s` comes with the call; no clock, no I/O.

Rules, in the order they bind:

1. **Guarantees.** A deployment always gets what it wishes up to its `guaranteed_gpus` (never
   more than it wishes: a guarantee is a right, not an idle reservation). Nobody, whatever its
   priority, takes those GPUs. The configuration refuses guarantees that do not fit the budget.
2. **Max share.** A deployment never holds more than `max_gpus`.
3. **Priority first.** Spare GPUs go to the highest priority first; a higher-priority wish takes
   GPUs from a lower-priority deployment's unguaranteed engines at once (no margin, no hold:
   priority is a promise). A lower priority never takes from a higher one.
3b. **Load now before headroom.** A wish may say which part of it serves the load measured now
   (`FleetMember.present`, from app/core/fleet/value.py); the rest is the SLA step's forecast
   headroom, engines for a rise that may not come. Running engines are taken from others
   (rules 3 and 4) only for the load now; headroom grows into free GPUs only, after every
   deployment's load now is served. Taking an engine costs its holder at once and for sure;
   the headroom engine it would pay for starts a start-up delay later and serves only if the
   forecast comes true (measured in docs/fleet.md: chat's learned growth doubled its wish after
   its flash crowd had levelled off; the engines taken for it cost code and batch a third of
   their requests and gained chat nothing). Without `present`, all of the wish is load now.
4. **Then marginal SLA value**, among equal priorities: the expected attainment gained per GPU.
   The SLA core does not give attainment at fewer engines yet, so the step uses a proxy: a
   deployment's attainment is the share of its wish met, averaged over its roles
   (mean_r min(1, granted_r / wish_r)); one more engine of role r is worth
   1 / (roles × wish_r × gpus_per_engine_r) per GPU. Requests beyond the engines' capacity
   queue and miss, so the share of the wish met is roughly the share of requests served on
   time. The mean (not the minimum, which is closer to how two roles combine) keeps the gain of
   every step positive; within a deployment engines are added to the role with the lowest share
   first, so the roles grow in balance anyway.
5. **Hysteresis.** Growing into free GPUs costs nobody and happens at once; shrinking to a lower
   wish too (each deployment's planner already stabilises its own scale-downs, so its wish
   falls only after its scale-down window). But moving GPUs between equal-priority deployments
   changes two grants and restarts an engine, so it happens only when the taker gains more than
   `1 + margin` times what the donor loses per GPU, *and* both grants have been unchanged for
   `hold_s` (about a start-up delay: moving an engine more often than it takes to start one is
   churn). A tie never moves anything: the holder keeps. Two deployments whose wishes jitter
   around the last GPU therefore swap it at most once per `hold_s`, and never for noise below
   the margin. The margin is relative, so it means the same for wishes of 2 engines or of 50.

The grants are caps on each deployment's target: the shell gives each planner its grant as a
per-role maximum, so that its decision is what the cluster runs.

**Hardware variants.** A deployment that lists variants (GPU type, GPUs per engine, profile,
price) has its wish split over them first (app/core/fleet/variants.py: cheapest per unit of
SLA-meeting capacity grown first, dearest shrunk first, each within the room its GPU type is
expected to have); each variant then takes part in the rules above as a member of its own, named
`deployment@variant`, with the deployment's priority. The guarantee belongs to the primary
variant (the first listed); the max share bounds the split over all variants.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from app.core.fleet.types import (
    Cut,
    DeploymentGrant,
    FleetDecision,
    FleetMember,
    FleetSettings,
    FleetState,
    GrantReason,
    Move,
    MoveReason,
    RoleGrant,
    Variant,
)
from app.core.fleet.variants import expand_variants
from app.core.types import Role

__all__ = [
    "Cut",
    "DeploymentGrant",
    "FleetDecision",
    "FleetMember",
    "FleetSettings",
    "FleetState",
    "GrantReason",
    "Move",
    "MoveReason",
    "RoleGrant",
    "Variant",
    "attainment_proxy",
    "expand_variants",
    "fleet_step",
    "present_wish",
]

# A grant nobody has changed yet counts as unchanged since forever: it may move at once.
NEVER_S = -math.inf
# Far more moves than any fleet needs in one tick; a guard, not a limit the rules reach.
_MAX_STEPS = 100_000


# --- the value proxy (rule 4) ------------------------------------------------------------------


def attainment_proxy(wish: Mapping[Role, int], engines: Mapping[Role, int]) -> float:
    """Share of the wish met, averaged over roles; a role that wishes nothing is met."""
    if not wish:
        return 1.0
    shares = [min(1.0, engines.get(role, 0) / want) if want > 0 else 1.0 for role, want in wish.items()]
    return sum(shares) / len(shares)


def _per_gpu(member: FleetMember, role: Role) -> float:
    """Attainment (proxy) one engine of `role` is worth per GPU, below the wish."""
    want = member.wish.get(role, 0)
    if want <= 0:
        return 0.0
    return 1.0 / (len(member.wish) * want * member.gpus_per_engine.get(role, 1))


def _gpus(member: FleetMember, engines: Mapping[Role, int]) -> int:
    return sum(count * member.gpus_per_engine.get(role, 1) for role, count in engines.items())


def _share(member: FleetMember, engines: Mapping[Role, int], role: Role) -> float:
    want = member.wish.get(role, 0)
    return engines.get(role, 0) / want if want > 0 else math.inf


def _next_role(
    member: FleetMember,
    engines: Mapping[Role, int],
    limit_gpus: float,
    upto: Mapping[Role, int] | None = None,
) -> Role | None:
    """The role one more engine should go to (the lowest share of its wish first, so that the
    roles grow in balance), among those below their wish (or below `upto`, at most the wish)
    whose engine fits within `limit_gpus`."""
    used = _gpus(member, engines)
    fits = [
        role
        for role, want in member.wish.items()
        if engines.get(role, 0) < (want if upto is None else min(want, upto.get(role, 0)))
        and used + member.gpus_per_engine.get(role, 1) <= limit_gpus
    ]
    if not fits:
        return None
    return min(fits, key=lambda r: (_share(member, engines, r), list(member.wish).index(r)))


def present_wish(member: FleetMember) -> dict[Role, int]:
    """The part of the wish for the load measured now (rule 3b); all of it when not given."""
    if member.present is None:
        return dict(member.wish)
    return {role: min(want, member.present.get(role, 0)) for role, want in member.wish.items()}


def _fill(member: FleetMember, limit_gpus: float) -> dict[Role, int]:
    """Engines toward the wish within `limit_gpus`, balanced across roles."""
    engines: dict[Role, int] = {role: 0 for role in member.wish}
    while (role := _next_role(member, engines, limit_gpus)) is not None:
        engines[role] += 1
    return engines


def _shed_role(member: FleetMember, engines: Mapping[Role, int], floor: Mapping[Role, int]) -> Role | None:
    """The role an engine is taken from first: the one above its floor with the highest share of
    its wish (the reverse of `_next_role`)."""
    above = [role for role in member.wish if engines.get(role, 0) > floor.get(role, 0)]
    if not above:
        return None
    return max(above, key=lambda r: (_share(member, engines, r), -list(member.wish).index(r)))


# --- the step -----------------------------------------------------------------------------------


def fleet_step(
    members: Sequence[FleetMember], settings: FleetSettings, state: FleetState, now_s: float
) -> FleetDecision:
    members = expand_variants(members, settings, state)
    grants: dict[str, DeploymentGrant] = {}
    moves: list[Move] = []
    free: dict[str, int] = {}
    next_grants: dict[str, dict[Role, int]] = {}
    next_changed: dict[str, dict[Role, float]] = {}
    for gpu_type in sorted({m.gpu_type for m in members} | set(settings.budget_gpus)):
        group = [m for m in members if m.gpu_type == gpu_type]
        budget = settings.budget_gpus.get(gpu_type, 0)
        result = _GroupStep(group, budget, settings, state, now_s).run()
        moves.extend(result.moves)
        free[gpu_type] = result.free
        for member in group:
            engines = result.alloc[member.name]
            previous = state.grants.get(member.name, {})
            changed_at = dict(state.changed_s.get(member.name, {}))
            for role in member.wish:
                if engines[role] != previous.get(role, 0) or member.name not in state.grants:
                    changed_at[role] = now_s
            next_grants[member.name] = dict(engines)
            next_changed[member.name] = changed_at
            grant = result.grant(member, previous)
            if member.variant is not None:
                grant = replace(grant, variant=member.variant, deployment=member.deployment)
            grants[member.name] = grant
    return FleetDecision(
        grants=grants,
        moves=tuple(moves),
        free_gpus=free,
        state=FleetState(grants=next_grants, changed_s=next_changed),
    )


class _GroupStep:
    """One GPU type's deployments sharing its budget (a scratch object for one call)."""

    def __init__(
        self,
        group: Sequence[FleetMember],
        budget: int,
        settings: FleetSettings,
        state: FleetState,
        now_s: float,
    ) -> None:
        self.group = list(group)
        self.order = {m.name: i for i, m in enumerate(self.group)}
        self.budget = budget
        self.settings = settings
        self.state = state
        self.now_s = now_s
        self.moves: list[Move] = []
        self.held: set[str] = set()  # deployments whose growth hysteresis refused
        self.headroom: set[str] = set()  # deployments refused a move for forecast headroom (3b)
        self.present = {m.name: present_wish(m) for m in self.group}
        self.limit = {m.name: float(m.max_gpus if m.max_gpus is not None else budget) for m in self.group}
        # Rule 1: the guarantee, up to the wish; no step below takes these engines.
        self.floor = {m.name: _fill(m, min(m.guaranteed_gpus, self.limit[m.name])) for m in self.group}
        self.alloc: dict[str, dict[Role, int]] = {}
        self.free = 0

    def run(self) -> _GroupStep:
        self._keep_previous()
        self._shed_to_budget()
        self._grow()
        return self

    # -- what the previous grants become --

    def _keep_previous(self) -> None:
        """Each previous grant, down to the current wish and max share, up to the guarantee."""
        for m in self.group:
            previous = self.state.grants.get(m.name, {})
            floor = self.floor[m.name]
            engines = {
                role: max(floor[role], min(previous.get(role, 0), want)) for role, want in m.wish.items()
            }
            while _gpus(m, engines) > self.limit[m.name]:  # the max share was lowered
                role = _shed_role(m, engines, floor)
                if role is None:
                    break
                engines[role] -= 1
            self.alloc[m.name] = engines
        self.free = self.budget - sum(_gpus(m, self.alloc[m.name]) for m in self.group)

    def _shed_to_budget(self) -> None:
        """A budget lowered below the grants in force: the lowest-ranked unguaranteed engines go."""
        while self.free < 0:
            donors = self._donor_engines()
            if not donors:
                break  # only guarantees left; the configuration keeps them within the budget
            _, m, role, _ = donors[0]
            self.alloc[m.name][role] -= 1
            self.free += m.gpus_per_engine.get(role, 1)

    # -- growth: free GPUs, then moves --

    def _candidate(self, m: FleetMember) -> tuple[Role, float, bool] | None:
        """The next engine the deployment wants, its value per GPU, and whether it is for the load
        now (rule 3b): roles below their present need grow first."""
        present = self.present[m.name]
        role = _next_role(m, self.alloc[m.name], self.limit[m.name], upto=present)
        if role is not None:
            return role, _per_gpu(m, role), True
        role = _next_role(m, self.alloc[m.name], self.limit[m.name])
        return None if role is None else (role, _per_gpu(m, role), False)

    def _donor_engines(self) -> list[tuple[tuple[int, float, int], FleetMember, Role, float]]:
        """Every deployment's next unguaranteed engine, lowest rank first (priority, then the
        value lost per GPU; the later-listed deployment gives first on a tie)."""
        out = []
        for m in self.group:
            role = _shed_role(m, self.alloc[m.name], self.floor[m.name])
            if role is None:
                continue
            loss = self._loss(m, role)
            out.append(((m.priority, loss, -self.order[m.name]), m, role, loss))
        out.sort(key=lambda d: d[0])
        return out

    def _loss(self, m: FleetMember, role: Role) -> float:
        """Attainment per GPU the deployment loses with one engine of `role` less."""
        return _per_gpu(m, role) if self.alloc[m.name][role] <= m.wish.get(role, 0) else 0.0

    def _held_since(self, name: str, role: Role) -> float:
        return self.state.changed_s.get(name, {}).get(role, NEVER_S)

    def _may_take(
        self,
        taker: FleetMember,
        taker_role: Role,
        gain: float,
        donor: FleetMember,
        donor_role: Role,
        loss: float,
    ) -> MoveReason | None:
        if donor.priority < taker.priority:
            return MoveReason.PRIORITY
        if donor.priority > taker.priority:
            return None
        hold_s = self.settings.hold_s
        settled = (
            self.now_s - self._held_since(donor.name, donor_role) >= hold_s
            and self.now_s - self._held_since(taker.name, taker_role) >= hold_s
        )
        return MoveReason.VALUE if gain > loss * (1.0 + self.settings.margin) and settled else None

    def _grow(self) -> None:
        blocked: set[str] = set()
        for _ in range(_MAX_STEPS):
            candidates = []
            for m in self.group:
                if m.name in blocked:
                    continue
                found = self._candidate(m)
                if found is not None:
                    role, gain, now_load = found
                    # Rule 3b: every deployment's load now is served before anyone's headroom.
                    rank = (now_load, m.priority, gain, -self.order[m.name])
                    candidates.append((rank, m, role, gain, now_load))
            if not candidates:
                return
            _, m, role, gain, now_load = max(candidates, key=lambda c: c[0])
            need = m.gpus_per_engine.get(role, 1)
            if need > self.free:
                # Headroom grows into free GPUs only: no running engine is taken for it.
                if not now_load:
                    self.headroom.add(m.name)
                if not now_load or not self._take(m, role, gain, need - self.free):
                    blocked.add(m.name)
                    continue
            self.alloc[m.name][role] += 1
            self.free -= need

    def _take(self, taker: FleetMember, role: Role, gain: float, need: int) -> bool:
        """Free `need` GPUs from deployments ranked below `taker`, or change nothing."""
        plan: list[tuple[FleetMember, Role, float, MoveReason]] = []
        trial = {name: dict(engines) for name, engines in self.alloc.items()}
        freed = 0
        refused_by_hysteresis = False
        saved, self.alloc = self.alloc, trial
        try:
            while freed < need:
                for _, donor, donor_role, loss in self._donor_engines():
                    if donor.name == taker.name:
                        continue
                    reason = self._may_take(taker, role, gain, donor, donor_role, loss)
                    if reason is None:
                        if donor.priority == taker.priority and gain > loss:
                            refused_by_hysteresis = True
                        continue
                    plan.append((donor, donor_role, loss, reason))
                    trial[donor.name][donor_role] -= 1
                    freed += donor.gpus_per_engine.get(donor_role, 1)
                    break
                else:
                    break
        finally:
            self.alloc = saved
        if freed < need:
            if refused_by_hysteresis:
                self.held.add(taker.name)
            return False
        for donor, donor_role, loss, reason in plan:
            gpus = donor.gpus_per_engine.get(donor_role, 1)
            self.alloc[donor.name][donor_role] -= 1
            self.free += gpus
            self.moves.append(
                Move(taker.gpu_type, taker.name, role, donor.name, donor_role, gpus, reason, gain, loss)
            )
        return True

    # -- the answer --

    def grant(self, m: FleetMember, previous: Mapping[Role, int]) -> DeploymentGrant:
        engines = self.alloc[m.name]
        gpus = _gpus(m, engines)
        limit = self.limit[m.name]
        roles: dict[Role, RoleGrant] = {}
        cut_budget = False
        for role, want in m.wish.items():
            got = engines[role]
            if got >= want:
                roles[role] = RoleGrant(got, want, GrantReason.WISH_MET, f"granted its wish of {want}")
                continue
            if gpus + m.gpus_per_engine.get(role, 1) > limit and limit < self.budget:
                reason, detail = GrantReason.CUT_MAX_SHARE, f"{got} of {want}: max share of {limit:g} GPUs"
            elif gpus + m.gpus_per_engine.get(role, 1) > limit:
                # No max share below the budget: the wish is larger than the whole GPU type.
                reason = GrantReason.CUT_BUDGET
                detail = f"{got} of {want}: more than the whole {m.gpu_type} budget of {self.budget} GPUs"
                cut_budget = True
            elif m.name in self.headroom and got >= self.present[m.name][role]:
                reason = GrantReason.CUT_BUDGET
                detail = (
                    f"{got} of {want}: the load now needs {self.present[m.name][role]}; the rest is "
                    "forecast headroom, grown into free GPUs only"
                )
                cut_budget = True
            elif m.name in self.held:
                reason = GrantReason.HELD
                detail = (
                    f"{got} of {want}: taking GPUs from an equal priority gains less than "
                    f"{1 + self.settings.margin:g}x what it costs, or a grant changed within "
                    f"the last {self.settings.hold_s:g} s"
                )
                cut_budget = True
            else:
                reason, detail = GrantReason.CUT_BUDGET, f"{got} of {want}: the {m.gpu_type} budget is held"
                cut_budget = True
            roles[role] = RoleGrant(got, want, reason, detail)
        floor_gpus = _gpus(m, self.floor[m.name])
        return DeploymentGrant(
            name=m.name,
            gpu_type=m.gpu_type,
            priority=m.priority,
            gpus=gpus,
            guaranteed_gpus=floor_gpus,
            wish_gpus=_gpus(m, m.wish),
            roles=roles,
            attainment_proxy=attainment_proxy(m.wish, engines),
            changed=any(engines[r] != previous.get(r, 0) for r in m.wish) or m.name not in self.state.grants,
            cut_by=self._cut_by(m) if cut_budget else (),
        )

    def _cut_by(self, cut: FleetMember) -> tuple[Cut, ...]:
        """Who holds the GPUs `cut` wanted, and why each keeps them."""
        found = self._candidate(cut)
        role = found[0] if found else next(iter(cut.wish))
        gain = _per_gpu(cut, role)
        out = []
        for m in self.group:
            if m.name == cut.name:
                continue
            gpus = _gpus(m, self.alloc[m.name])
            if not gpus:
                continue
            floor_gpus = _gpus(m, self.floor[m.name])
            shed = _shed_role(m, self.alloc[m.name], self.floor[m.name])
            if m.priority > cut.priority:
                why = f"higher priority ({m.priority} > {cut.priority})"
            elif shed is None:
                why = f"guarantee of {m.guaranteed_gpus} GPUs ({floor_gpus} in use)"
            elif m.priority < cut.priority:
                # Engines of other sizes: what it holds above its guarantee is not a whole engine.
                why = f"lower priority, {gpus - floor_gpus} GPUs above its guarantee: not a whole engine"
            else:
                loss = self._loss(m, shed)
                if loss >= gain:
                    # A tie keeps the holder: a move would restart an engine for nothing.
                    higher = "higher" if loss > gain else "equal"
                    why = f"{higher} marginal value ({loss:.4f} vs {gain:.4f} attainment per GPU)"
                else:
                    why = (
                        f"hysteresis (a move gains {gain:.4f} for {loss:.4f} attainment per GPU; "
                        f"needs {1 + self.settings.margin:g}x and {self.settings.hold_s:g} s unchanged)"
                    )
            out.append(Cut(m.name, why, gpus))
        return tuple(out)
