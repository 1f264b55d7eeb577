"""The fleet step's plain data: what it reads (`FleetMember`, `FleetSettings`, `FleetState`) and
what it answers (`FleetDecision`: a `DeploymentGrant` per deployment, with a `RoleGrant` per role,
the `Cut`s that explain a cut, and the `Move`s of the tick). The rules are in app/core/fleet/step.py."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.core.types import Role


@dataclass(frozen=True)
class Variant:
    """One kind of engine a deployment may run."""

    name: str
    gpu_type: str
    gpus_per_engine: Mapping[Role, int]
    # Per engine, at the deployment's SLA targets: prefill tokens/s, decode requests held.
    capacity: Mapping[Role, float]
    price_per_gpu_hour: float

    def cost_per_unit(self, role: Role) -> float:
        """Price per hour of one unit of the role's SLA-meeting capacity (inf: no capacity)."""
        capacity = self.capacity.get(role, 0.0)
        if capacity <= 0:
            return math.inf
        return self.price_per_gpu_hour * self.gpus_per_engine.get(role, 1) / capacity


class GrantReason(StrEnum):
    WISH_MET = "wish_met"  # granted all it wished
    CUT_BUDGET = "cut_budget"  # the GPU type's budget is held by others (see `cut_by`)
    CUT_MAX_SHARE = "cut_max_share"  # the deployment's own `max_gpus`
    HELD = "held"  # a move would gain less than the margin, or too soon after the last change


class MoveReason(StrEnum):
    PRIORITY = "priority"  # a higher-priority wish took a lower priority's unguaranteed GPUs
    VALUE = "value"  # equal priorities: the taker gains more per GPU than the donor loses


@dataclass(frozen=True)
class FleetMember:
    """One deployment as the fleet sees it."""

    name: str
    gpu_type: str
    priority: int  # higher is served first
    guaranteed_gpus: int
    max_gpus: int | None  # None: up to the budget
    gpus_per_engine: Mapping[Role, int]
    wish: Mapping[Role, int]  # engines its own planner wants now, per role
    # Hardware variants (app/core/fleet/variants.py), the primary first: `wish` is in engines of
    # the primary, and the fleet step splits it over the variants. Empty: one kind of engine,
    # `gpu_type` and `gpus_per_engine` above.
    variants: tuple[Variant, ...] = ()
    # Engines per role for the load measured now (app/core/fleet/value.py `present_need`): the
    # part of `wish` another deployment's running engines may be taken for (rule 3b); the rest
    # is forecast headroom, grown into free GPUs only. None: all of the wish. Not split over
    # hardware variants (a member with variants is taken as all present).
    present: Mapping[Role, int] | None = None
    # Set by the fleet step on the per-variant members it makes of a member with variants.
    variant: str | None = None
    deployment: str | None = None


@dataclass(frozen=True)
class FleetSettings:
    budget_gpus: Mapping[str, int]  # per GPU type
    # A move between equal priorities must gain (1 + margin) times what it costs, per GPU ...
    margin: float = 0.2
    # ... and both grants must have been unchanged this long.
    hold_s: float = 120.0


@dataclass(frozen=True)
class FleetState:
    """The previous grants and when each last changed: the fleet step's memory."""

    grants: Mapping[str, Mapping[Role, int]] = field(default_factory=dict)
    changed_s: Mapping[str, Mapping[Role, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Cut:
    """A deployment holding GPUs a cut deployment wanted, and why it keeps them."""

    by: str
    why: str  # "higher priority (3 > 1)", "higher marginal value ...", "hysteresis ...", "guarantee ..."
    gpus: int  # GPUs it holds of the type

    def as_dict(self) -> dict[str, Any]:
        return {"by": self.by, "why": self.why, "gpus": self.gpus}


@dataclass(frozen=True)
class RoleGrant:
    engines: int
    wish: int
    reason: GrantReason
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"engines": self.engines, "wish": self.wish, "reason": str(self.reason), "detail": self.detail}


@dataclass(frozen=True)
class DeploymentGrant:
    name: str
    gpu_type: str
    priority: int
    gpus: int  # GPUs granted, all roles
    guaranteed_gpus: int  # the part of `gpus` nobody may take (the guarantee, up to the wish)
    wish_gpus: int
    roles: Mapping[Role, RoleGrant]
    attainment_proxy: float  # share of the wish met, averaged over roles (rule 4)
    changed: bool  # any role's grant differs from the previous one
    cut_by: tuple[Cut, ...] = ()  # empty unless cut by the budget
    # A grant of one hardware variant: `name` is `deployment@variant`.
    variant: str | None = None
    deployment: str | None = None

    @property
    def engines(self) -> dict[Role, int]:
        return {role: g.engines for role, g in self.roles.items()}

    def as_dict(self) -> dict[str, Any]:
        variant = {} if self.variant is None else {"deployment": self.deployment, "variant": self.variant}
        return {
            **variant,
            "gpu_type": self.gpu_type,
            "priority": self.priority,
            "gpus": self.gpus,
            "guaranteed_gpus": self.guaranteed_gpus,
            "wish_gpus": self.wish_gpus,
            "engines": self.engines,
            "roles": {role: g.as_dict() for role, g in self.roles.items()},
            "attainment_proxy": round(self.attainment_proxy, 4),
            "changed": self.changed,
            "cut_by": [c.as_dict() for c in self.cut_by],
        }


@dataclass(frozen=True)
class Move:
    """GPUs one deployment took from another this tick."""

    gpu_type: str
    taker: str
    taker_role: Role
    donor: str
    donor_role: Role
    gpus: int
    reason: MoveReason
    gain_per_gpu: float
    loss_per_gpu: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu_type": self.gpu_type,
            "taker": self.taker,
            "taker_role": self.taker_role,
            "donor": self.donor,
            "donor_role": self.donor_role,
            "gpus": self.gpus,
            "reason": str(self.reason),
            "gain_per_gpu": round(self.gain_per_gpu, 4),
            "loss_per_gpu": round(self.loss_per_gpu, 4),
        }


@dataclass(frozen=True)
class FleetDecision:
    # By deployment name; a deployment with variants has one grant per variant instead, under
    # `deployment@variant` (`of_deployment` gathers them).
    grants: Mapping[str, DeploymentGrant]
    moves: tuple[Move, ...]
    free_gpus: Mapping[str, int]  # per GPU type, after the grants
    state: FleetState  # the next call's `state`

    def of_deployment(self, name: str) -> dict[str | None, DeploymentGrant]:
        """A deployment's grants by variant (`{None: grant}` for one without variants)."""
        if name in self.grants:
            return {None: self.grants[name]}
        return {g.variant: g for g in self.grants.values() if g.deployment == name}

    def as_dict(self) -> dict[str, Any]:
        return {
            "grants": {name: g.as_dict() for name, g in self.grants.items()},
            "moves": [m.as_dict() for m in self.moves],
            "free_gpus": dict(self.free_gpus),
        }
