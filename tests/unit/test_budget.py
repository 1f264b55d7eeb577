"""GPU budget stage (reference §1.4 and §10.2 A cases 3 and 8), with the E4 fix that a ceiling
never seats replicas nobody asked for."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.core.chain import apply_gpu_budget
from app.core.types import RoleBounds


@dataclass(frozen=True)
class Case:
    name: str
    why: str
    replicas: dict[str, int] | None
    budget: int | None
    gpus: dict[str, int]
    mins: dict[str, int]
    expected: dict[str, int] | None


CASES = [
    Case(
        "no_target", "nothing to fit", None, 8, {"prefill": 1, "decode": 1}, {"prefill": 1, "decode": 1}, None
    ),
    Case(
        "no_budget",
        "no budget set: unchanged",
        {"prefill": 9, "decode": 9},
        None,
        {},
        {"prefill": 1, "decode": 1},
        {"prefill": 9, "decode": 9},
    ),
    Case(
        "ref_a3_within",
        "§10.2 A3: budget 3, P=1 D=1 uses 2",
        {"prefill": 1, "decode": 1},
        3,
        {"prefill": 1, "decode": 1},
        {"prefill": 1, "decode": 1},
        {"prefill": 1, "decode": 1},
    ),
    Case(
        "ref_a8_within",
        "§10.2 A8: budget 5, 2 GPUs each, P=1 D=1 uses 4",
        {"prefill": 1, "decode": 1},
        5,
        {"prefill": 2, "decode": 2},
        {"prefill": 1, "decode": 1},
        {"prefill": 1, "decode": 1},
    ),
    Case(
        "exactly_at_budget",
        "equal to the budget is within it",
        {"prefill": 3, "decode": 5},
        8,
        {"prefill": 1, "decode": 1},
        {"prefill": 1, "decode": 1},
        {"prefill": 3, "decode": 5},
    ),
    Case(
        "proportional_pair",
        "10 GPUs into 8: scale 0.8, P=floor(4*0.8)=3, D=min(6, 8-3)=5",
        {"prefill": 4, "decode": 6},
        8,
        {"prefill": 1, "decode": 1},
        {"prefill": 1, "decode": 1},
        {"prefill": 3, "decode": 5},
    ),
    Case(
        "decode_never_grows",
        "P 6 D 1 into 4: P=max(1,min(3,floor(6*4/7)=3))=3; leftover 1 stays 1, not more",
        {"prefill": 6, "decode": 1},
        4,
        {"prefill": 1, "decode": 1},
        {"prefill": 1, "decode": 1},
        {"prefill": 3, "decode": 1},
    ),
    Case(
        "leftover_not_given_to_decode",
        "P 9 D 2 into 10 (2 GPU prefill): P=min(4,floor(9*10/20)=4)=4, D=min(2,2)=2",
        {"prefill": 9, "decode": 2},
        10,
        {"prefill": 2, "decode": 1},
        {"prefill": 1, "decode": 1},
        {"prefill": 4, "decode": 2},
    ),
    Case(
        "multi_gpu_pair",
        "P 4x2 + D 4x4 = 24 into 12: P=max(1,min(4,floor(4*0.5)))=2, D=min(4,(12-4)//4)=2",
        {"prefill": 4, "decode": 4},
        12,
        {"prefill": 2, "decode": 4},
        {"prefill": 1, "decode": 1},
        {"prefill": 2, "decode": 2},
    ),
    Case(
        "minimums_kept",
        "min 2 each, P 10 D 10 into 6: P=max(2,min(4,3))=3, D=min(10,max(2,3))=3",
        {"prefill": 10, "decode": 10},
        6,
        {"prefill": 1, "decode": 1},
        {"prefill": 2, "decode": 2},
        {"prefill": 3, "decode": 3},
    ),
    Case(
        "infeasible_to_zero",
        "the minimums alone need 4 GPUs, the budget is 3: (0, 0)",
        {"prefill": 5, "decode": 5},
        3,
        {"prefill": 1, "decode": 1},
        {"prefill": 2, "decode": 2},
        {"prefill": 0, "decode": 0},
    ),
    Case(
        "single_role",
        "agg: 10 workers x 2 GPUs into 9: floor(9/2)=4",
        {"workers": 10},
        9,
        {"workers": 2},
        {"workers": 1},
        {"workers": 4},
    ),
    Case(
        "single_role_infeasible",
        "agg: min 3 x 4 GPUs = 12 > 8: zero",
        {"workers": 5},
        8,
        {"workers": 4},
        {"workers": 3},
        {"workers": 0},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gpu_budget(case: Case) -> None:
    bounds = {role: RoleBounds(case.mins[role], 100) for role in case.mins}
    stage = apply_gpu_budget(case.replicas, budget_gpus=case.budget, gpus_per_engine=case.gpus, bounds=bounds)
    assert stage.replicas == case.expected, case.why
    assert stage.name == "budget"
    if case.replicas is not None and case.expected is not None and case.budget is not None:
        used = sum(case.expected[r] * case.gpus.get(r, 1) for r in case.expected)
        assert used <= case.budget, "a budgeted target fits the budget"
        assert all(case.expected[r] <= case.replicas[r] for r in case.expected), "never above what was asked"


def test_reason_names_the_budget_and_the_changes() -> None:
    stage = apply_gpu_budget(
        {"prefill": 4, "decode": 6},
        budget_gpus=8,
        gpus_per_engine={"prefill": 1, "decode": 1},
        bounds={"prefill": RoleBounds(1, 10), "decode": RoleBounds(1, 10)},
    )
    assert stage.reason == "10 GPUs over the budget of 8: prefill 4 -> 3, decode 6 -> 5 (8 GPUs)"
