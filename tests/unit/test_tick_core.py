"""The pure tick: overrides (pause, pin, bounds), the normalisation chain with its reasons, and the
planner's tick record."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from app.core.chain import (
    apply_bounds,
    apply_pause,
    apply_pin,
    bound_violations,
    effective_bounds,
    normalise,
)
from app.core.planner import NO_POLICY_REASON, Planner, PlannerSettings, TickInput
from app.core.types import (
    ActiveOverrides,
    DecisionSource,
    DecisionStatus,
    DecisionView,
    Replicas,
    Role,
    RoleBounds,
    Stage,
)

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
SRC = DecisionSource
CONFIG_BOUNDS: dict[Role, RoleBounds] = {"prefill": RoleBounds(1, 8), "decode": RoleBounds(1, 8)}
NO_OVERRIDES = ActiveOverrides()
PAUSED = ActiveOverrides(pause_id=4)


# --- effective_bounds -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EffectiveCase:
    name: str
    why: str
    overrides: ActiveOverrides
    expected: dict[Role, RoleBounds]


EFFECTIVE_CASES = [
    EffectiveCase("no_override", "configured bounds stand", NO_OVERRIDES, CONFIG_BOUNDS),
    EffectiveCase(
        "min_only",
        "only the field the operator set replaces the configured one",
        ActiveOverrides(bounds_id=2, bounds={"prefill": {"min": 3}}),
        {"prefill": RoleBounds(3, 8), "decode": RoleBounds(1, 8)},
    ),
    EffectiveCase(
        "max_only",
        "max alone keeps the configured min",
        ActiveOverrides(bounds_id=2, bounds={"decode": {"max": 5}}),
        {"prefill": RoleBounds(1, 8), "decode": RoleBounds(1, 5)},
    ),
    EffectiveCase(
        "both_roles_both_fields",
        "every field given replaces its own",
        ActiveOverrides(
            bounds_id=2, bounds={"prefill": {"min": 2, "max": 4}, "decode": {"min": 0, "max": 12}}
        ),
        {"prefill": RoleBounds(2, 4), "decode": RoleBounds(0, 12)},
    ),
    EffectiveCase(
        "role_not_configured",
        "bounds for a role the deployment lacks are ignored",
        ActiveOverrides(bounds_id=2, bounds={"workers": {"min": 3}}),
        CONFIG_BOUNDS,
    ),
]


@pytest.mark.parametrize("case", EFFECTIVE_CASES, ids=lambda c: c.name)
def test_effective_bounds(case: EffectiveCase) -> None:
    assert effective_bounds(CONFIG_BOUNDS, case.overrides) == case.expected, case.why


# --- bound_violations -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ViolationCase:
    name: str
    why: str
    replicas: Replicas
    expected: list[tuple[Role, str]]


VIOLATION_CASES = [
    ViolationCase("within", "nothing to report", {"prefill": 3, "decode": 5}, []),
    ViolationCase("at_edges", "bounds are inclusive", {"prefill": 1, "decode": 8}, []),
    ViolationCase(
        "below_min",
        "under the minimum",
        {"prefill": 0, "decode": 5},
        [("prefill", "0 is below the minimum 1")],
    ),
    ViolationCase(
        "above_max", "over the maximum", {"prefill": 3, "decode": 9}, [("decode", "9 is above the maximum 8")]
    ),
    ViolationCase(
        "both_roles",
        "every role is reported, in target order",
        {"prefill": 20, "decode": 0},
        [("prefill", "20 is above the maximum 8"), ("decode", "0 is below the minimum 1")],
    ),
]


@pytest.mark.parametrize("case", VIOLATION_CASES, ids=lambda c: c.name)
def test_bound_violations(case: ViolationCase) -> None:
    assert bound_violations(case.replicas, CONFIG_BOUNDS) == case.expected, case.why


# --- the stages one by one ------------------------------------------------------------------------


@dataclass(frozen=True)
class PauseCase:
    name: str
    why: str
    replicas: Replicas | None
    source: DecisionSource | None
    overrides: ActiveOverrides
    expected: Stage


PAUSE_CASES = [
    PauseCase(
        "not_paused",
        "the proposal passes",
        {"prefill": 2, "decode": 2},
        SRC.THROUGHPUT,
        NO_OVERRIDES,
        Stage("pause", {"prefill": 2, "decode": 2}, "not paused"),
    ),
    PauseCase(
        "paused_drops_throughput",
        "pause stops automatic scaling",
        {"prefill": 2, "decode": 2},
        SRC.THROUGHPUT,
        PAUSED,
        Stage("pause", None, "automatic scaling paused by override #4"),
    ),
    PauseCase(
        "paused_drops_load",
        "load-based proposals are automatic too",
        {"prefill": 2, "decode": 2},
        SRC.LOAD,
        PAUSED,
        Stage("pause", None, "automatic scaling paused by override #4"),
    ),
    PauseCase(
        "paused_keeps_override",
        "an operator's own target is not automatic",
        {"prefill": 2, "decode": 2},
        SRC.OVERRIDE,
        PAUSED,
        Stage("pause", {"prefill": 2, "decode": 2}, "paused"),
    ),
    PauseCase(
        "paused_nothing_proposed", "nothing to drop", None, None, PAUSED, Stage("pause", None, "paused")
    ),
    PauseCase(
        "not_paused_nothing_proposed",
        "nothing to pass",
        None,
        None,
        NO_OVERRIDES,
        Stage("pause", None, "not paused"),
    ),
]


@pytest.mark.parametrize("case", PAUSE_CASES, ids=lambda c: c.name)
def test_apply_pause(case: PauseCase) -> None:
    assert apply_pause(case.replicas, case.source, case.overrides) == case.expected, case.why


@dataclass(frozen=True)
class PinCase:
    name: str
    why: str
    replicas: Replicas | None
    overrides: ActiveOverrides
    expected: Stage


PIN = ActiveOverrides(pin_id=3, pin={"prefill": 3, "decode": 5})
PIN_CASES = [
    PinCase(
        "no_pin_passes",
        "no pin leaves the target alone",
        {"prefill": 2, "decode": 2},
        NO_OVERRIDES,
        Stage("pin", {"prefill": 2, "decode": 2}, "no pin"),
    ),
    PinCase("no_pin_no_target", "nothing in, nothing out", None, NO_OVERRIDES, Stage("pin", None, "no pin")),
    PinCase(
        "pin_replaces_proposal",
        "a pin wins over any proposal",
        {"prefill": 2, "decode": 2},
        PIN,
        Stage("pin", {"prefill": 3, "decode": 5}, "pinned by override #3"),
    ),
    PinCase(
        "pin_without_proposal",
        "a pin gives a target where there was none",
        None,
        PIN,
        Stage("pin", {"prefill": 3, "decode": 5}, "pinned by override #3"),
    ),
]


@pytest.mark.parametrize("case", PIN_CASES, ids=lambda c: c.name)
def test_apply_pin(case: PinCase) -> None:
    assert apply_pin(case.replicas, case.overrides) == case.expected, case.why


def test_apply_pin_copies_the_pin() -> None:
    pin: Replicas = {"prefill": 3, "decode": 5}
    stage = apply_pin(None, ActiveOverrides(pin_id=3, pin=pin))
    assert stage.replicas is not None
    stage.replicas["prefill"] = 99
    assert pin == {"prefill": 3, "decode": 5}


@dataclass(frozen=True)
class BoundsCase:
    name: str
    why: str
    replicas: Replicas | None
    expected: Stage


BOUNDS_CASES = [
    BoundsCase("no_target", "nothing to bound", None, Stage("bounds", None, "no target to bound")),
    BoundsCase(
        "within",
        "unchanged inside the bounds",
        {"prefill": 1, "decode": 8},
        Stage("bounds", {"prefill": 1, "decode": 8}, "within bounds"),
    ),
    BoundsCase(
        "above_max",
        "clamped down to the max, naming the role",
        {"prefill": 12, "decode": 4},
        Stage("bounds", {"prefill": 8, "decode": 4}, "prefill 12 -> 8 (min 1, max 8)"),
    ),
    BoundsCase(
        "below_min",
        "clamped up to the min, naming the role",
        {"prefill": 3, "decode": 0},
        Stage("bounds", {"prefill": 3, "decode": 1}, "decode 0 -> 1 (min 1, max 8)"),
    ),
    BoundsCase(
        "both_roles",
        "every clamp is reported",
        {"prefill": 0, "decode": 20},
        Stage(
            "bounds",
            {"prefill": 1, "decode": 8},
            "prefill 0 -> 1 (min 1, max 8); decode 20 -> 8 (min 1, max 8)",
        ),
    ),
]


@pytest.mark.parametrize("case", BOUNDS_CASES, ids=lambda c: c.name)
def test_apply_bounds(case: BoundsCase) -> None:
    assert apply_bounds(case.replicas, CONFIG_BOUNDS) == case.expected, case.why


# --- the chain, and the planner's tick around it -----------------------------------------------


@dataclass(frozen=True)
class Tick:
    """One tick's inputs for the chain: the overrides, an algorithm's proposal and its source."""

    overrides: ActiveOverrides = NO_OVERRIDES
    proposal: Replicas | None = None
    proposal_source: DecisionSource | None = None
    gpus_per_engine: dict[Role, int] = field(default_factory=lambda: {"prefill": 1, "decode": 1})
    budget_gpus: int | None = None

    def run(self) -> tuple[Replicas | None, DecisionSource | None, list[str]]:
        """The target, its source and the reasons, as `Planner.on_tick` derives them."""
        reason = NO_POLICY_REASON if self.proposal is None else f"proposed by {self.proposal_source}"
        stages, source = normalise(
            Stage("proposal", self.proposal, reason),
            self.proposal_source,
            overrides=self.overrides,
            bounds=effective_bounds(CONFIG_BOUNDS, self.overrides),
            budget_gpus=self.budget_gpus,
            gpus_per_engine=self.gpus_per_engine,
        )
        return stages[-1].replicas, source, [f"{s.name}: {s.reason}" for s in stages]


def snapshot(
    overrides: ActiveOverrides = NO_OVERRIDES,
    *,
    proposal: Replicas | None = None,
    proposal_source: DecisionSource | None = None,
) -> Tick:
    return Tick(overrides, proposal, proposal_source)


@dataclass(frozen=True)
class TickCase:
    name: str
    why: str
    snapshot: Tick
    target: Replicas | None
    source: DecisionSource | None
    reasons: list[str] = field(default_factory=list)


TICK_CASES = [
    TickCase(
        "nothing",
        "no proposal and no pin: no opinion, and the reasons say why",
        snapshot(),
        None,
        None,
        [f"proposal: {NO_POLICY_REASON}", "pause: not paused", "pin: no pin", "bounds: no target to bound"],
    ),
    TickCase(
        "pin_only",
        "a pin is the target, sourced as an override",
        snapshot(ActiveOverrides(pin_id=3, pin={"prefill": 3, "decode": 5})),
        {"prefill": 3, "decode": 5},
        SRC.OVERRIDE,
        [
            f"proposal: {NO_POLICY_REASON}",
            "pause: not paused",
            "pin: pinned by override #3",
            "bounds: within bounds",
        ],
    ),
    TickCase(
        "pin_outside_bounds_clamped",
        "bounds apply after the pin and name the clamped role",
        snapshot(ActiveOverrides(pin_id=3, pin={"prefill": 3, "decode": 12})),
        {"prefill": 3, "decode": 8},
        SRC.OVERRIDE,
        [
            f"proposal: {NO_POLICY_REASON}",
            "pause: not paused",
            "pin: pinned by override #3",
            "bounds: decode 12 -> 8 (min 1, max 8)",
        ],
    ),
    TickCase(
        "pin_clamped_by_bounds_override",
        "operator bounds replace configured ones before clamping",
        snapshot(
            ActiveOverrides(
                pin_id=3, pin={"prefill": 3, "decode": 5}, bounds_id=6, bounds={"prefill": {"min": 4}}
            )
        ),
        {"prefill": 4, "decode": 5},
        SRC.OVERRIDE,
        [
            f"proposal: {NO_POLICY_REASON}",
            "pause: not paused",
            "pin: pinned by override #3",
            "bounds: prefill 3 -> 4 (min 4, max 8)",
        ],
    ),
    TickCase(
        "automatic_proposal",
        "without overrides the proposal is the target",
        snapshot(proposal={"prefill": 2, "decode": 2}, proposal_source=SRC.THROUGHPUT),
        {"prefill": 2, "decode": 2},
        SRC.THROUGHPUT,
        ["proposal: proposed by throughput", "pause: not paused", "pin: no pin", "bounds: within bounds"],
    ),
    TickCase(
        "automatic_proposal_clamped",
        "a proposal outside the bounds is clamped",
        snapshot(proposal={"prefill": 0, "decode": 2}, proposal_source=SRC.LOAD),
        {"prefill": 1, "decode": 2},
        SRC.LOAD,
        [
            "proposal: proposed by load",
            "pause: not paused",
            "pin: no pin",
            "bounds: prefill 0 -> 1 (min 1, max 8)",
        ],
    ),
    TickCase(
        "pause_drops_automatic",
        "pause drops an automatic proposal: no target at all",
        snapshot(PAUSED, proposal={"prefill": 2, "decode": 2}, proposal_source=SRC.THROUGHPUT),
        None,
        None,
        [
            "proposal: proposed by throughput",
            "pause: automatic scaling paused by override #4",
            "pin: no pin",
            "bounds: no target to bound",
        ],
    ),
    TickCase(
        "pause_keeps_pin",
        "a pin still applies while paused",
        snapshot(
            ActiveOverrides(pin_id=3, pin={"prefill": 3, "decode": 5}, pause_id=4),
            proposal={"prefill": 2, "decode": 2},
            proposal_source=SRC.THROUGHPUT,
        ),
        {"prefill": 3, "decode": 5},
        SRC.OVERRIDE,
        [
            "proposal: proposed by throughput",
            "pause: automatic scaling paused by override #4",
            "pin: pinned by override #3",
            "bounds: within bounds",
        ],
    ),
    TickCase(
        "pin_beats_proposal",
        "the pin replaces the proposal and the source is override",
        snapshot(
            ActiveOverrides(pin_id=3, pin={"prefill": 3, "decode": 5}),
            proposal={"prefill": 2, "decode": 2},
            proposal_source=SRC.THROUGHPUT,
        ),
        {"prefill": 3, "decode": 5},
        SRC.OVERRIDE,
        [
            "proposal: proposed by throughput",
            "pause: not paused",
            "pin: pinned by override #3",
            "bounds: within bounds",
        ],
    ),
]


@pytest.mark.parametrize("case", TICK_CASES, ids=lambda c: c.name)
def test_chain(case: TickCase) -> None:
    target, source, reasons = case.snapshot.run()
    assert (target, source) == (case.target, case.source), case.why
    # No GPU budget in these snapshots: the budget stage passes the bounded target through.
    budget = "budget: no target" if case.target is None else "budget: no GPU budget"
    assert reasons == [*case.reasons, budget], case.why


def planner(budget_gpus: int | None = None, gpus: dict[Role, int] | None = None) -> Planner:
    """A planner with no algorithm on: its targets come only from pins (the chain's input)."""
    settings = PlannerSettings(
        deployment="demo",
        roles=("prefill", "decode"),
        bounds=dict(CONFIG_BOUNDS),
        gpus_per_engine=gpus or {"prefill": 1, "decode": 1},
        tick_interval_s=180.0,
        budget_gpus=budget_gpus,
    )
    return Planner(settings, model=None)


def test_on_tick_diagnostics_record() -> None:
    latest = DecisionView(
        id=9,
        replicas={"prefill": 2, "decode": 2},
        source=SRC.THROUGHPUT,
        status=DecisionStatus.SUCCEEDED,
        created_s=T0.timestamp(),
    )
    overrides = ActiveOverrides(
        pin_id=3,
        pin={"prefill": 3, "decode": 12},
        bounds_id=6,
        bounds={"decode": {"max": 10}},
        pause_id=4,
    )
    effects = planner().on_tick(TickInput(now_s=T0.timestamp(), overrides=overrides, latest_decision=latest))
    assert effects.diagnostics.as_json() == {
        "version": 2,
        "at": None,
        "at_s": T0.timestamp(),
        "deployment": "demo",
        "latest_decision_id": 9,
        "latest_decision_status": "succeeded",
        "overrides": {"pin_id": 3, "bounds_id": 6, "pause_id": 4},
        "bounds": {"prefill": {"min": 1, "max": 8}, "decode": {"min": 1, "max": 10}},
        "stages": [
            {"stage": "proposal", "replicas": None, "reason": NO_POLICY_REASON},
            {"stage": "pause", "replicas": None, "reason": "paused"},
            {"stage": "pin", "replicas": {"prefill": 3, "decode": 12}, "reason": "pinned by override #3"},
            {
                "stage": "bounds",
                "replicas": {"prefill": 3, "decode": 10},
                "reason": "decode 12 -> 10 (min 1, max 10)",
            },
            {"stage": "budget", "replicas": {"prefill": 3, "decode": 10}, "reason": "no GPU budget"},
        ],
        "target": {"prefill": 3, "decode": 10},
        "remove": None,
        "throughput": None,
        "load": None,
        "sla": None,
        "fpm": None,
        "traffic": None,
        "expired_decision_id": None,
        "fleet": None,
        "settings_revision": None,  # the worker sets it; the core does not know the store
        "signals": None,  # the worker's account of what it read
        "ready_source": None,
        "cost": None,  # the shells' cost account (app/workers/cost.py, app/embedding.py)
        "shadow": None,  # shadow mode's section, the worker's (app/workers/shadow.py)
        "verdict": None,
        "decision_id": None,
    }
    assert effects.target == {"prefill": 3, "decode": 10}
    assert effects.source == SRC.OVERRIDE


def test_on_tick_without_latest_decision_records_none() -> None:
    record = planner().on_tick(TickInput(now_s=T0.timestamp())).diagnostics
    assert (record.latest_decision_id, record.latest_decision_status) == (None, None)


def test_on_tick_does_not_mutate_the_pin() -> None:
    pin: Replicas = {"prefill": 0, "decode": 20}
    planner().on_tick(TickInput(now_s=T0.timestamp(), overrides=ActiveOverrides(pin_id=1, pin=pin)))
    assert pin == {"prefill": 0, "decode": 20}


def test_budget_limits_the_bounded_target() -> None:
    """The GPU budget is the last stage: it caps pins and proposals alike."""
    for overrides, proposal in (
        (NO_OVERRIDES, {"prefill": 3, "decode": 2}),
        (ActiveOverrides(pin_id=1, pin={"prefill": 3, "decode": 2}), None),
    ):
        gpus: dict[Role, int] = {"prefill": 2, "decode": 1}
        tick = Tick(overrides, proposal, SRC.THROUGHPUT, gpus_per_engine=gpus, budget_gpus=6)
        target, _, reasons = tick.run()
        # 3*2 + 2 = 8 GPUs into 6: P = max(1, min((6-1)//2, floor(3*6/8))) = 2, D = min(2, (6-4)//1) = 2
        assert target == {"prefill": 2, "decode": 2}
        assert reasons[-1] == "budget: 8 GPUs over the budget of 6: prefill 3 -> 2 (6 GPUs)"
    effects = planner(budget_gpus=6, gpus={"prefill": 2, "decode": 1}).on_tick(
        TickInput(now_s=T0.timestamp(), overrides=ActiveOverrides(pin_id=1, pin={"prefill": 3, "decode": 2}))
    )
    assert effects.target == {"prefill": 2, "decode": 2}
