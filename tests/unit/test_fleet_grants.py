"""How a planner lives with its fleet grant (app/core/fleet/grants.py): the code `planner serve`
and `planner replay` share around the fleet step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from app.core.chain import effective_bounds
from app.core.fleet.grants import asked_of, grant_record, wish_of, with_grant
from app.core.fleet.step import FleetMember, FleetSettings, FleetState, fleet_step
from app.core.types import ActiveOverrides, RoleBounds

BOUNDS = {"prefill": RoleBounds(1, 8), "decode": RoleBounds(2, 8)}


def grant(engines: dict[str, int], wish: dict[str, int], *, priority: int = 1) -> dict[str, Any]:
    """A real grant from the fleet step: this deployment alone under a budget of sum(engines)
    GPUs (one GPU per engine)."""
    me = FleetMember("me", "h200", priority, 0, None, {"prefill": 1, "decode": 1}, wish)
    budget = sum(engines.values())
    decision = fleet_step([me], FleetSettings(budget_gpus={"h200": budget}), FleetState(), 0.0)
    g = decision.grants["me"].as_dict()
    assert g["engines"] == engines, g
    return g


@dataclass(frozen=True)
class BoundsCase:
    name: str
    overrides: ActiveOverrides
    engines: dict[str, int]
    want: dict[str, tuple[int, int]]  # role -> (min, max) after the grant
    why: str


BOUNDS_CASES = [
    BoundsCase(
        "grant_below_max",
        ActiveOverrides(),
        {"prefill": 3, "decode": 4},
        {"prefill": (1, 3), "decode": (2, 4)},
        "the grant is the role's maximum",
    ),
    BoundsCase(
        "grant_below_min",
        ActiveOverrides(),
        {"prefill": 3, "decode": 1},
        {"prefill": (1, 3), "decode": (1, 1)},
        "a minimum above the grant is lowered to it: the grant is a promise to the others",
    ),
    BoundsCase(
        "operator_max_tighter",
        ActiveOverrides(bounds_id=7, bounds={"prefill": {"max": 2}}),
        {"prefill": 3, "decode": 4},
        {"prefill": (1, 2), "decode": (2, 4)},
        "an operator's tighter maximum stays in force",
    ),
    BoundsCase(
        "operator_min_kept_under_grant",
        ActiveOverrides(bounds_id=7, bounds={"decode": {"min": 3}}),
        {"prefill": 3, "decode": 4},
        {"prefill": (1, 3), "decode": (3, 4)},
        "an operator's minimum within the grant stays",
    ),
]


@pytest.mark.parametrize("case", BOUNDS_CASES, ids=lambda c: c.name)
def test_the_grant_binds_as_maximum_bounds(case: BoundsCase) -> None:
    g = grant(case.engines, case.engines)
    out = with_grant(case.overrides, g, BOUNDS)
    got = effective_bounds(BOUNDS, out)
    assert {r: (b.min_replicas, b.max_replicas) for r, b in got.items()} == case.want, case.why
    assert out.bounds_id == case.overrides.bounds_id


def test_no_grant_changes_nothing() -> None:
    overrides = ActiveOverrides(pin_id=3, pin={"prefill": 2, "decode": 2})
    assert with_grant(overrides, None, BOUNDS) is overrides


def test_a_pin_and_a_pause_survive_the_grant() -> None:
    overrides = ActiveOverrides(pin_id=3, pin={"prefill": 5, "decode": 5}, pause_id=4)
    out = with_grant(overrides, grant({"prefill": 2, "decode": 2}, {"prefill": 2, "decode": 2}), BOUNDS)
    assert (out.pin_id, out.pin, out.pause_id) == (3, {"prefill": 5, "decode": 5}, 4)


def test_the_wish_is_the_proposal_within_the_configured_bounds() -> None:
    assert wish_of({"prefill": 12, "decode": 0}, BOUNDS) == {"prefill": 8, "decode": 2}
    assert wish_of(None, BOUNDS) is None


def test_asked_is_the_pin_stage() -> None:
    stages = [
        {"stage": "proposal", "replicas": {"prefill": 4}},
        {"stage": "pause", "replicas": {"prefill": 4}},
        {"stage": "pin", "replicas": {"prefill": 6}},
        {"stage": "bounds", "replicas": {"prefill": 3}},
    ]
    assert asked_of(stages) == {"prefill": 6}


def test_a_binding_grant_is_noted_with_who_holds_the_gpus() -> None:
    me = FleetMember("batch", "h200", 1, 0, None, {"prefill": 1, "decode": 1}, {"prefill": 4, "decode": 2})
    top = FleetMember("chat", "h200", 3, 0, None, {"prefill": 1, "decode": 1}, {"prefill": 3, "decode": 1})
    decision = fleet_step([me, top], FleetSettings(budget_gpus={"h200": 6}), FleetState(), 0.0)
    g = decision.grants["batch"].as_dict()
    assert g["engines"] == {"prefill": 1, "decode": 1}
    rec = grant_record(g, asked={"prefill": 4, "decode": 1}, target={"prefill": 1, "decode": 1}, at="t")
    assert rec is not None
    assert rec["cut"] is True and rec["binding"] is True
    assert rec["roles"]["prefill"]["binding"] is True
    # decode asked for 1, granted 1: not lowered by the grant, though its wish (2) was cut.
    assert rec["roles"]["decode"]["binding"] is False
    assert rec["roles"]["decode"]["reason"] == "cut_budget"
    assert rec["note"].startswith(
        "cut by the fleet grant: prefill 4 -> 1 (granted for a wish of 4: cut_budget"
    )
    assert "chat: higher priority (3 > 1)" in rec["note"]


def test_a_grant_that_does_not_bind_has_no_note() -> None:
    g = grant({"prefill": 3, "decode": 2}, {"prefill": 3, "decode": 2})
    rec = grant_record(g, asked={"prefill": 2, "decode": 2}, target={"prefill": 2, "decode": 2})
    assert rec is not None and rec["note"] is None and rec["cut"] is False and rec["cut_by"] == []
    assert grant_record(None, asked=None, target=None) is None
