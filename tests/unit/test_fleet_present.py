"""Rule 3b of the fleet step (app/core/fleet/step.py): running engines are taken from others only for
a deployment's load now, never for its forecast headroom; and `present_need`
(app/core/fleet/value.py), which reads the load now from the SLA step's diagnostics. Every
expectation is computed by hand in its `why`. Single-role members use one decode GPU per engine."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.core.fleet.step import FleetMember, FleetSettings, FleetState, GrantReason, MoveReason, fleet_step
from app.core.fleet.value import present_need

GPU = "h200"


def member(name: str, wish: int, *, present: int | None = None, priority: int = 0) -> FleetMember:
    return FleetMember(
        name=name,
        gpu_type=GPU,
        priority=priority,
        guaranteed_gpus=0,
        max_gpus=None,
        gpus_per_engine={"decode": 1},
        wish={"decode": wish},
        present=None if present is None else {"decode": present},
    )


def state(grants: dict[str, int]) -> FleetState:
    return FleetState(
        grants={n: {"decode": g} for n, g in grants.items()},
        changed_s={n: {"decode": 0.0} for n in grants},
    )


@dataclass(frozen=True)
class Case:
    name: str
    why: str
    members: list
    budget: int
    previous: dict[str, int]
    expect: dict[str, int]


CASES = [
    Case(
        name="priority-takes-only-for-the-load-now",
        why="hi (priority 2) wishes 6 but its load now needs 3; it holds 2 and lo holds 6 of the 8: "
        "hi takes 1 engine of lo's (2 -> 3), not 4 (the old rule gave hi 6, lo 2); no GPU is "
        "free for the other 3 of headroom",
        members=[member("hi", 6, present=3, priority=2), member("lo", 6, priority=1)],
        budget=8,
        previous={"hi": 2, "lo": 6},
        expect={"hi": 3, "lo": 5},
    ),
    Case(
        name="headroom-grows-into-free-gpus",
        why="hi wishes 6 (3 now); hi 2 + lo 2 leave 4 of the 8 free: headroom takes free GPUs at once",
        members=[member("hi", 6, present=3, priority=2), member("lo", 2, priority=1)],
        budget=8,
        previous={"hi": 2, "lo": 2},
        expect={"hi": 6, "lo": 2},
    ),
    Case(
        name="a-lower-priority-load-now-before-a-higher-headroom",
        why="6 free GPUs; hi (priority 2) wishes 6 with 2 now and holds 2, lo (priority 1) wishes 4 "
        "now and holds 0: lo's 4 first, then hi's headroom gets the 2 left (4); the old rule "
        "gave hi its 6 first and lo the 2 left",
        members=[member("hi", 6, present=2, priority=2), member("lo", 4, priority=1)],
        budget=8,
        previous={"hi": 2, "lo": 0},
        expect={"hi": 4, "lo": 4},
    ),
    Case(
        name="no-value-move-for-headroom",
        why="equal priorities, budget 7: a wishes 2 (1 now) and holds 1, b holds its 6. Under the "
        "value rule a gains 1/2 per GPU and b loses 1/6 (more than 1.2x, holds long passed), so "
        "the old rule moved one engine (a 2, b 5); a's second engine is headroom, so nothing moves",
        members=[member("a", 2, present=1), member("b", 6)],
        budget=7,
        previous={"a": 1, "b": 6},
        expect={"a": 1, "b": 6},
    ),
    Case(
        name="without-present-all-of-the-wish-is-load-now",
        why="the first case with no `present`: the old rule, hi takes 4 of lo's engines",
        members=[member("hi", 6, priority=2), member("lo", 6, priority=1)],
        budget=8,
        previous={"hi": 2, "lo": 6},
        expect={"hi": 6, "lo": 2},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_grants(case: Case) -> None:
    decision = fleet_step(
        case.members, FleetSettings(budget_gpus={GPU: case.budget}), state(case.previous), 1e4
    )
    got = {name: g.engines["decode"] for name, g in decision.grants.items()}
    assert got == case.expect, case.why
    assert sum(got.values()) <= case.budget


def test_a_headroom_cut_says_so_and_the_move_is_for_the_load_now() -> None:
    decision = fleet_step(
        [member("hi", 6, present=3, priority=2), member("lo", 6, priority=1)],
        FleetSettings(budget_gpus={GPU: 8}),
        state({"hi": 2, "lo": 6}),
        1e4,
    )
    hi = decision.grants["hi"].roles["decode"]
    assert hi.reason == GrantReason.CUT_BUDGET
    assert "the load now needs 3" in hi.detail and "headroom" in hi.detail
    assert [(m.taker, m.donor, m.gpus, m.reason) for m in decision.moves] == [
        ("hi", "lo", 1, MoveReason.PRIORITY)
    ]


def _sla_record(**prefill_decode: dict) -> dict:
    # The tick at 745 s of chat's flash crowd in docs/fleet.md, rounded: the level is 100
    # requests/s of 1000-token prompts (100 000 tokens/s), sized for 300 000 (growth x3).
    return {
        "demand": {
            "request_rate_s": 100.0,
            "token_rate_s": 300_000.0,
            "isl_mean": 1000.0,
            "osl_mean": 201.0,
            "in_flight_mean": 3000.0,
            "in_flight": 3000.0,
        },
        "roles": {
            "prefill": {"needed": 10, "backlog_tokens_s": 100_000.0, **prefill_decode.get("prefill", {})},
            "decode": {
                "needed": 10,
                "batch_limit": 300,
                "in_flight_at_target": 3000.0,
                "held_now": 450,
                **prefill_decode.get("decode", {}),
            },
        },
    }


def test_present_need_scales_the_wish_by_the_load_now() -> None:
    # Prefill: sized for 300 000 + 100 000 backlog = 400 000 tokens/s; now 100 000 + the same
    # backlog = 200 000, half: 10 x 0.5 = 5. Decode: now 100 x 200 x 0.030 = 600 in flight of
    # the 3000 sized for (0.2): 3000 x 0.2 / 300 = 2 engines; 450 held / 300 -> 2; so 2.
    assert present_need(_sla_record(), itl_target_ms=30) == {"prefill": 5, "decode": 2}
    # 700 requests held now (decoding or queued) need ceil(700 / 300) = 3 engines: load now too.
    assert present_need(_sla_record(decode={"held_now": 700}), itl_target_ms=30)["decode"] == 3


def test_present_need_is_the_wish_without_growth() -> None:
    # Sized for the level itself (100 000 tokens/s, 600 in flight): the need is all of `needed`.
    record = _sla_record()
    record["demand"].update(token_rate_s=100_000.0, in_flight_mean=600.0)
    assert present_need(record, itl_target_ms=30) == {"prefill": 10, "decode": 10}


def test_present_need_without_a_sizing_is_none() -> None:
    assert present_need(None, itl_target_ms=30) is None
    assert present_need({"reason": "model_not_ready"}, itl_target_ms=30) is None


def test_present_need_keeps_the_sizing_quantile_of_the_count_in_flight() -> None:
    # Sized for a mean of 3000 in flight and a quantile of 4000: z·sqrt(dispersion) =
    # 1000 / sqrt(3000) = 18.26. Now: mean 600, quantile 600 + 18.26 x sqrt(600) = 1047 in
    # flight, / 300 per engine = 3.49 -> 4 engines (scaling the quantile by 600 / 3000 would give
    # 800 / 300 -> 3, too few: the spread of a smaller count shrinks more slowly than its mean).
    record = _sla_record(decode={"needed": 14, "in_flight_at_target": 4000.0})
    assert present_need(record, itl_target_ms=30)["decode"] == 4


def test_present_need_reads_the_count_in_flight_at_the_sized_pace() -> None:
    # Decode sized at half the target's pace (a full engine of 250 iterating at 15 ms of 30): a
    # mean of 3000 x 0.5 = 1500 in flight, its quantile 1600 (z·sqrt(dispersion) = 100 /
    # sqrt(1500) = 2.58), 7 engines. Now: 600 x 0.5 = 300 in flight, quantile 300 + 2.58 x
    # sqrt(300) = 344.7 -> 2 engines. Read at the target's pace, the load now would be 600 in
    # flight (the sized 1600 below its mean of 3000: no spread) -> 3.
    decode = {"needed": 7, "batch_limit": 250, "in_flight_at_target": 1600.0, "pace": 0.5, "held_now": 0}
    record = _sla_record(decode=decode)
    assert present_need(record, itl_target_ms=30)["decode"] == 2
    record["roles"]["decode"].pop("pace")
    assert present_need(record, itl_target_ms=30)["decode"] == 3
