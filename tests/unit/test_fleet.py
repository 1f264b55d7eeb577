"""The fleet step (app/core/fleet/step.py): priorities, guarantees, max shares and hysteresis, with
hand-computed expectations. Single-role members use one decode GPU per engine unless a case says
otherwise, so that engines and GPUs are the same number."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from app.core.fleet.step import (
    FleetMember,
    FleetSettings,
    FleetState,
    GrantReason,
    MoveReason,
    attainment_proxy,
    fleet_step,
)

GPU = "h200"


def member(name: str, wish: int | dict, *, priority: int = 0, guaranteed: int = 0, max_gpus=None, gpus=None):
    wish = {"decode": wish} if isinstance(wish, int) else wish
    return FleetMember(
        name=name,
        gpu_type=GPU,
        priority=priority,
        guaranteed_gpus=guaranteed,
        max_gpus=max_gpus,
        gpus_per_engine=gpus or {role: 1 for role in wish},
        wish=wish,
    )


def state(grants: dict[str, int], changed_s: float = 0.0) -> FleetState:
    return FleetState(
        grants={n: {"decode": g} for n, g in grants.items()},
        changed_s={n: {"decode": changed_s} for n in grants},
    )


def settings(budget: int, **kw) -> FleetSettings:
    return FleetSettings(budget_gpus={GPU: budget}, **kw)


@dataclass(frozen=True)
class Case:
    name: str
    why: str
    members: list
    budget: int
    previous: dict[str, int]
    expect: dict[str, int]
    now_s: float = 10_000.0  # every hold long passed
    reasons: dict[str, GrantReason] = field(default_factory=dict)


CASES = [
    Case(
        name="priority-preempts-at-once",
        why="hi (priority 2) wants 6; lo got in first with 6 of the 8 GPUs and has no guarantee: "
        "hi takes 4 of lo's engines in the same tick, no margin or hold",
        members=[member("hi", 6, priority=2), member("lo", 6, priority=1)],
        budget=8,
        previous={"hi": 2, "lo": 6},
        expect={"hi": 6, "lo": 2},
        reasons={"hi": GrantReason.WISH_MET, "lo": GrantReason.CUT_BUDGET},
    ),
    Case(
        name="low-priority-never-takes-from-high",
        why="lo (priority 1) wants 6 but holds 2; hi holds the 6 it wants: lo stays at 2, "
        "however long it waits and whatever its value per GPU",
        members=[member("hi", 6, priority=2), member("lo", 6, priority=1)],
        budget=8,
        previous={"hi": 6, "lo": 2},
        expect={"hi": 6, "lo": 2},
        now_s=1e9,
    ),
    Case(
        name="low-priority-gets-what-high-cannot-hold",
        why="hi's max share is 5 GPUs: it stops at 5 of its 6, and lo gets the other 3 of 8",
        members=[member("hi", 6, priority=2, max_gpus=5), member("lo", 6, priority=1)],
        budget=8,
        previous={},
        expect={"hi": 5, "lo": 3},
        reasons={"hi": GrantReason.CUT_MAX_SHARE, "lo": GrantReason.CUT_BUDGET},
    ),
    Case(
        name="a-wish-above-the-whole-budget-is-a-budget-cut",
        why="solo wishes 12 of an 8-GPU type and has no max share of its own: the budget cut "
        "it, not a max share",
        members=[member("solo", 12)],
        budget=8,
        previous={},
        expect={"solo": 8},
        reasons={"solo": GrantReason.CUT_BUDGET},
    ),
    Case(
        name="guarantee-kept-under-pressure",
        why="hi (priority 5) wants all 10 GPUs; lo is guaranteed 3 and holds 4: hi takes lo's "
        "unguaranteed 4th engine, never the 3 guaranteed ones",
        members=[member("hi", 10, priority=5), member("lo", 4, guaranteed=3)],
        budget=10,
        previous={"hi": 6, "lo": 4},
        expect={"hi": 7, "lo": 3},
    ),
    Case(
        name="guarantee-is-not-an-idle-reservation",
        why="lo is guaranteed 3 but wishes 2: it gets 2, and hi the other 8",
        members=[member("hi", 10, priority=5), member("lo", 2, guaranteed=3)],
        budget=10,
        previous={},
        expect={"hi": 8, "lo": 2},
    ),
    Case(
        name="equal-priority-higher-value-first",
        why="from nothing: a gets 1/4 attainment per GPU, b 1/8; a is served first (4), b gets "
        "the remaining 3 of 7",
        members=[member("b", 8), member("a", 4)],
        budget=7,
        previous={},
        expect={"a": 4, "b": 3},
    ),
    Case(
        name="tie-keeps-the-holder",
        why="a and b both wish 4 and gain 1/4 per GPU; b holds 4, a 3: a move would gain exactly "
        "what it costs, so nothing moves",
        members=[member("a", 4), member("b", 4)],
        budget=7,
        previous={"a": 3, "b": 4},
        expect={"a": 3, "b": 4},
        reasons={"a": GrantReason.CUT_BUDGET},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_grants(case: Case) -> None:
    decision = fleet_step(case.members, settings(case.budget), state(case.previous), case.now_s)
    got = {name: g.engines["decode"] for name, g in decision.grants.items()}
    assert got == case.expect, case.why
    for name, reason in case.reasons.items():
        assert decision.grants[name].roles["decode"].reason == reason, case.why
    assert sum(got.values()) <= case.budget


def test_a_cut_names_who_took_the_gpus_and_why() -> None:
    decision = fleet_step(
        [member("hi", 6, priority=2), member("lo", 6, priority=1)],
        settings(8),
        state({"hi": 2, "lo": 6}),
        5.0,
    )
    lo = decision.grants["lo"]
    assert [(c.by, c.why, c.gpus) for c in lo.cut_by] == [("hi", "higher priority (2 > 1)", 6)]
    assert [(m.taker, m.donor, m.gpus, m.reason) for m in decision.moves] == [
        ("hi", "lo", 1, MoveReason.PRIORITY)
    ] * 4
    assert decision.grants["hi"].cut_by == ()


def test_a_tie_and_a_small_gain_say_why_the_holder_keeps() -> None:
    tie = fleet_step([member("a", 4), member("b", 4)], settings(7), state({"a": 3, "b": 4}), 1e4)
    assert [c.why for c in tie.grants["a"].cut_by] == [
        "equal marginal value (0.2500 vs 0.2500 attainment per GPU)"
    ]
    # b (9 of 10) would gain 1/10 per GPU, a (10 of 11) lose 1/11: below 1.2x, so hysteresis holds it.
    small = fleet_step([member("a", 11), member("b", 10)], settings(19), state({"a": 10, "b": 9}), 1e4)
    assert small.grants["b"].roles["decode"].reason == GrantReason.HELD
    assert [c.why for c in small.grants["b"].cut_by] == [
        "hysteresis (a move gains 0.1000 for 0.0909 attainment per GPU; needs 1.2x and 120 s unchanged)"
    ]


def test_guarantee_fills_both_roles_in_balance() -> None:
    # lo: prefill engines of 2 GPUs, decode of 1, guaranteed 5, wish 2 prefill + 4 decode. The
    # lowest share first, prefill first on a tie: p1 (2 GPUs), d1 (3), d2 (4), then p and d tie
    # at 1/2 but a second prefill engine (6 GPUs) does not fit the 5, so d3 (5). hi, priority 9,
    # wants 100 decode engines and gets the other 15 of 20 GPUs.
    lo = member("lo", {"prefill": 2, "decode": 4}, guaranteed=5, gpus={"prefill": 2, "decode": 1})
    hi = member("hi", 100, priority=9)
    decision = fleet_step([lo, hi], settings(20), FleetState(), 0.0)
    assert decision.grants["lo"].engines == {"prefill": 1, "decode": 3}
    assert decision.grants["lo"].gpus == 5
    assert decision.grants["hi"].engines == {"decode": 15}
    assert decision.free_gpus == {GPU: 0}


def test_attainment_proxy_is_the_mean_share_of_the_wish() -> None:
    assert attainment_proxy({"prefill": 2, "decode": 4}, {"prefill": 1, "decode": 4}) == 0.75
    assert attainment_proxy({"prefill": 0, "decode": 4}, {"prefill": 0, "decode": 1}) == 0.625


# --- hysteresis: many ticks ----------------------------------------------------------------------


def run_ticks(wishes, budget, first: FleetState, times, **kw) -> list[tuple[float, dict[str, int]]]:
    """(time, grants) at every tick whose grants differ from the previous tick's."""
    current, changes, last = first, [], {n: g.get("decode", 0) for n, g in first.grants.items()}
    for t in times:
        decision = fleet_step(
            [member(n, w) for n, w in wishes(t).items()], settings(budget, **kw), current, t
        )
        current = decision.state
        grants = {n: g.engines["decode"] for n, g in decision.grants.items()}
        if grants != last:
            changes.append((t, grants))
        last = grants
    return changes


TICKS = [5.0 * k for k in range(1, 201)]  # 1,000 s of 5 s ticks


def alternating(t: float) -> dict[str, int]:
    """Both want the last GPU, their wishes jittering by one engine in opposite directions."""
    return {"a": 11, "b": 10} if round(t / 5) % 2 else {"a": 10, "b": 11}


def test_no_flapping_when_two_want_the_last_gpu() -> None:
    # a holds 10, b 9 of 19. On an odd tick b (9 of 10) would gain 1/10 per GPU and a (10 of
    # 11) lose 1/11: 0.1 < 1.2 x 0.0909; on an even tick the same with the names swapped. Noise
    # below the margin never moves a GPU.
    assert run_ticks(alternating, 19, state({"a": 10, "b": 9}), TICKS) == []


def test_without_hysteresis_the_same_wishes_flap_every_tick() -> None:
    # The control for the test above: margin 0 and no hold, and the last GPU changes hands on
    # every one of the 200 ticks.
    changes = run_ticks(alternating, 19, state({"a": 10, "b": 9}), TICKS, margin=0.0, hold_s=0.0)
    assert len(changes) == 200


def test_the_hold_time_bounds_the_swaps() -> None:
    # Margin 0, hold 120 s, grants set at t = 0. The first tick at least 120 s after the last
    # change whose wishes favour the other deployment moves the GPU: at 120 (even) b 9 of 11
    # gains 1/11 < a's loss 1/10, no; at 125 (odd) b gains 1/10 > 1/11: b takes it. Then 245 (odd)
    # no, 250 yes; 370 no, 375 yes; 495 no, 500 yes; nothing more by 600 s.
    times = [5.0 * k for k in range(1, 121)]
    changes = run_ticks(alternating, 19, state({"a": 10, "b": 9}), times, margin=0.0, hold_s=120.0)
    assert [t for t, _ in changes] == [125.0, 250.0, 375.0, 500.0]


def test_a_lasting_advantage_moves_the_gpu_once_after_the_hold() -> None:
    # a 10 of 10 loses 1/10 per GPU, b 5 of 6 gains 1/6 > 1.2 x 1/10: a move, once both grants
    # are 120 s old (t = 120); then b is met and a's 10th engine (1/10) is worth less than b's 6th
    # (1/6): it never moves back.
    changes = run_ticks(lambda t: {"a": 10, "b": 6}, 15, state({"a": 10, "b": 5}), TICKS)
    assert changes == [(120.0, {"a": 9, "b": 6})]


# --- wake-up from zero ---------------------------------------------------------------------------


def test_wake_up_from_zero_takes_from_an_equal_priority_after_the_hold() -> None:
    # a sat at 0 engines (wish 0) while b held all 8 since t = 0; at 1,000 s a wishes 2: its first
    # engines are worth 1/2 per GPU, b's 8th 1/8: b gives 2.
    members = [member("a", 2), member("b", 8)]
    decision = fleet_step(members, settings(8), state({"a": 0, "b": 8}), 1000.0)
    assert {n: g.engines["decode"] for n, g in decision.grants.items()} == {"a": 2, "b": 6}
    assert {m.reason for m in decision.moves} == {MoveReason.VALUE}


def test_wake_up_from_zero_of_a_higher_priority_is_immediate() -> None:
    members = [member("a", 2, priority=1), member("b", 8)]
    decision = fleet_step(members, settings(8), state({"a": 0, "b": 8}, changed_s=0.0), 5.0)
    assert decision.grants["a"].engines == {"decode": 2}
    assert decision.grants["b"].engines == {"decode": 6}


def test_a_lowered_budget_sheds_the_lowest_priority_first() -> None:
    members = [member("hi", 5, priority=1), member("lo", 5, guaranteed=2)]
    decision = fleet_step(members, settings(6), state({"hi": 5, "lo": 5}), 5.0)
    assert {n: g.engines["decode"] for n, g in decision.grants.items()} == {"hi": 4, "lo": 2}


def test_the_step_is_pure() -> None:
    members = [member("hi", 6, priority=2), member("lo", 6, priority=1)]
    previous = state({"hi": 2, "lo": 6})
    first = fleet_step(members, settings(8), previous, 5.0)
    again = fleet_step(members, settings(8), previous, 5.0)
    assert first == again
    assert previous.grants == {"hi": {"decode": 2}, "lo": {"decode": 6}}


# --- the `fleet:` section of the deployments file ------------------------------------------------

FLEET_FILE = """
deployments:
  - {name: chat, connector: {type: none}, sla: {ttft_ms: 1000, itl_ms: 30}}
  - {name: batch, connector: {type: none}, sla: {ttft_ms: 1000, itl_ms: 30}}
fleet:
  budget_gpus: {h200: 8}
  deployments:
    chat: {priority: 2, guaranteed_gpus: 4}
    batch: {guaranteed_gpus: 2, max_gpus: 6}
"""


def fleet_file(**changes) -> dict:
    import yaml

    raw = yaml.safe_load(FLEET_FILE)
    for path, value in changes.items():
        node = raw
        *parents, last = path.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    return raw


def test_a_fleet_section_is_read_with_its_defaults() -> None:
    from app.config import validate_deployments

    fleet = validate_deployments(fleet_file(), "f.yaml").fleet
    assert fleet is not None
    assert (fleet.interval_s, fleet.margin, fleet.hold_s) == (5.0, 0.2, 120.0)
    chat, batch = fleet.member("chat"), fleet.member("batch")
    assert (chat.priority, chat.gpu_type, chat.guaranteed_gpus, chat.max_gpus) == (2, "h200", 4, None)
    assert (batch.priority, batch.gpu_type, batch.guaranteed_gpus, batch.max_gpus) == (0, "h200", 2, 6)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"fleet__deployments__batch__guaranteed_gpus": 5},
            "fleet.budget_gpus.h200: 8 GPUs, but the guarantees add up to 9",
        ),
        (
            {"fleet__deployments__batch__max_gpus": 1},
            "fleet.deployments.batch: guaranteed_gpus (2) is above max_gpus (1)",
        ),
        ({"fleet__deployments__nope": {"priority": 1}}, "fleet.deployments.nope: no deployment named 'nope'"),
        (
            {"fleet__deployments__chat__gpu_type": "a100"},
            "fleet.deployments.chat.gpu_type: 'a100' has no budget (have: h200)",
        ),
        (
            {"fleet__budget_gpus": {"h200": 0}},
            "fleet.budget_gpus.h200: Input should be greater than or equal to 1",
        ),
        ({"fleet__hold_s": -1}, "fleet.hold_s: Input should be greater than or equal to 0"),
        (
            {"fleet__deployments__chat__priorty": 1},
            "fleet.deployments.chat: unknown key 'priorty'",
        ),
    ],
)
def test_a_bad_fleet_section_names_the_field(changes: dict, message: str) -> None:
    from app.config import ConfigError, validate_deployments

    with pytest.raises(ConfigError) as err:
        validate_deployments(fleet_file(**changes), "f.yaml")
    assert message in str(err.value)


def test_the_example_fleet_shares_less_than_the_peaks() -> None:
    from app.config import REPO_ROOT
    from app.sim.fleet.config import load_fleet_config

    config = load_fleet_config(REPO_ROOT / "examples" / "fleet.yaml")
    assert [d.name for d in config.deployments] == ["chat", "code", "batch"]
    assert config.fleet.budget_gpus == {"h200": 24}
    assert {n: config.fleet.member(n).priority for n in ("chat", "code", "batch")} == {
        "chat": 3,
        "code": 2,
        "batch": 1,
    }
    assert {n: t.workload for n, t in config.traces.items()} == {
        "chat": "flash-crowd",
        "code": "bursty-gaps",
        "batch": "diurnal",
    }


# --- the fleet replay, end to end on two tiny traces ---------------------------------------------


def test_planner_replay_runs_a_fleet_file_within_its_budget(tmp_path, capsys) -> None:
    import csv
    import json

    from app.cli import main as planner_main
    from app.config import REPO_ROOT

    profile = REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"

    def deployment(name: str) -> str:
        return (
            f"{{name: {name}, connector: {{type: virtual}}, sla: {{ttft_ms: 1000, itl_ms: 30}}, "
            f"profile: {profile}, scaling: {{algorithm: sla}}}}"
        )

    (tmp_path / "fleet.yaml").write_text(
        "deployments:\n"
        f"  - {deployment('chat')}\n"
        f"  - {deployment('batch')}\n"
        "fleet:\n"
        "  budget_gpus: {h200: 3}\n"
        "  deployments: {chat: {priority: 1, guaranteed_gpus: 2}}\n"
        "simulation:\n"
        "  startup_delay_s: 30\n"
        "  traces:\n"
        "    chat: {workload: flash-crowd, rate_scale: 0.05, duration_s: 90}\n"
        "    batch: {workload: diurnal, rate_scale: 0.05, duration_s: 90}\n"
    )
    out = tmp_path / "out"
    code = planner_main(["replay", "--config", str(tmp_path / "fleet.yaml"), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == "fleet"
    assert set(summary["deployments"]) == {"chat", "batch"}
    for d in summary["deployments"].values():
        assert d["requests"] > 0 and 0.0 <= d["slo_attainment"] <= 1.0 and d["gpu_hours"] > 0
        assert isinstance(d["grant_changes"], int)
    # Replaying the grant changes: at no tick do the grants add up to more than the 3 GPUs.
    grants: dict[tuple[str, str], int] = {}
    with (out / "grants.csv").open() as f:
        rows = list(csv.DictReader(f))
    # The first grants (4 engines asked for at the start, 3 GPUs) are logged at the first tick.
    assert {(r["deployment"], r["role"]) for r in rows if float(r["at_s"]) == 5.0} == {
        ("chat", "prefill"),
        ("chat", "decode"),
        ("batch", "prefill"),
        ("batch", "decode"),
    }
    for at_s in sorted({float(r["at_s"]) for r in rows}):
        for r in rows:
            if float(r["at_s"]) == at_s:
                grants[(r["deployment"], r["role"])] = int(r["grant"])
        assert sum(grants.values()) <= 3, at_s
