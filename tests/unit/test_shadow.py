"""Shadow mode's predicted attainment (app/core/shadow.py) and its report over tick records
(app/reports/shadow.py), on small hand-made scenarios.

The predictions run on the bundled H200 profile's prior after 30 ticks of steady traffic
(tests/unit/sla_scenarios.py): 175 requests of 2,000 prompt tokens per 5 s tick, 70,000 prompt
tokens/s, which SLA scaling serves with 3 prefill engines and 2 decode engines."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

import pytest

from app.core.diagnostics import ShadowDiagnostics, SlaDiagnostics
from app.core.shadow import CAVEAT, Conditions, conditions, predicted_attainment, shadow_section
from app.core.sla.state import SlaState
from app.core.types import Role
from app.reports.shadow import EMPTY_NOTE, shadow_report
from tests.unit.sla_scenarios import ISL, Run, h200_model, settings_for

ROLES: tuple[Role, ...] = ("prefill", "decode")
REQUESTS_PER_TICK = 175


@dataclass(frozen=True)
class Steady:
    conditions: Conditions
    wish: dict[Role, int]


@cache
def steady() -> Steady:
    model = h200_model()
    settings = settings_for(model, ROLES)
    run = Run(model, settings, expected={"prefill": 1, "decode": 1})
    for _ in range(30):
        result = run.tick(REQUESTS_PER_TICK)
    record = SlaDiagnostics.model_validate({"reason": str(result.reason), **result.diagnostics})
    wish = {role: int(record.roles[role].wish) for role in ROLES}  # type: ignore[index, arg-type]
    return Steady(conditions(run.state, settings, run.now_s, record), wish)


def test_the_scenario_is_what_the_module_says() -> None:
    """The scenario's demand and SLA scaling's answer, as the docstring states them."""
    s = steady()
    assert s.conditions.demand is not None
    assert s.conditions.demand.token_rate_s == pytest.approx(REQUESTS_PER_TICK / 5 * ISL)
    assert s.wish == {"prefill": 3, "decode": 2}


@dataclass(frozen=True)
class CompareCase:
    name: str
    role: Role
    incumbent: int  # engines the incumbent runs
    planner: int | None  # None: the planner's own wish for the role
    relation: str  # "lower" | "equal" | "higher": the incumbent's prediction against the planner's
    why: str


COMPARE_CASES = [
    CompareCase(
        "prefill_under_provisioned",
        "prefill",
        incumbent=2,
        planner=None,
        relation="lower",
        why="two engines for what SLA scaling sizes at three: the queue waits longer, so fewer "
        "prompts meet the TTFT target",
    ),
    CompareCase(
        "prefill_saturated",
        "prefill",
        incumbent=1,
        planner=None,
        relation="lower",
        why="one engine offered 70,000 tokens/s runs beyond its capacity: it is taken to miss",
    ),
    CompareCase(
        "decode_none_running",
        "decode",
        incumbent=0,
        planner=None,
        relation="lower",
        why="no decode engine while requests arrive: nothing is served within target",
    ),
    CompareCase(
        "equal_counts",
        "prefill",
        incumbent=3,
        planner=3,
        relation="equal",
        why="the same count under the same demand is the same prediction",
    ),
    CompareCase(
        "incumbent_over_provisioned",
        "prefill",
        incumbent=2,
        planner=1,
        relation="higher",
        why="more engines never predict fewer requests within target",
    ),
]


@pytest.mark.parametrize("case", COMPARE_CASES, ids=lambda c: c.name)
def test_predicted_attainment_orders_the_counts(case: CompareCase) -> None:
    s = steady()
    planner = s.wish[case.role] if case.planner is None else case.planner
    section = shadow_section(
        ROLES,
        incumbent={**s.wish, case.role: case.incumbent},
        incumbent_ready=None,
        planner={**s.wish, case.role: planner},
        wish=s.wish,
        conditions=s.conditions,
    )
    row = section.roles[case.role]  # type: ignore[index]
    ran, ordered = row.attainment_incumbent, row.attainment_planner
    assert ran is not None and ordered is not None, case.why
    assert 0.0 <= ran <= 1.0 and 0.0 <= ordered <= 1.0
    relation = "lower" if ran < ordered else "higher" if ran > ordered else "equal"
    assert relation == case.relation, f"{case.why}: incumbent {ran}, planner {ordered}"
    assert section.caveat == CAVEAT


def test_nothing_serves_nothing() -> None:
    """Hand-checked ends: no engine while requests arrive meets nobody (0); none arriving, every
    count meets everyone (1)."""
    s = steady()
    assert predicted_attainment("prefill", 0, s.conditions) == 0.0
    assert predicted_attainment("decode", 0, s.conditions) == 0.0
    assert s.conditions.demand is not None
    silent = replace(s.conditions.demand, token_rate_s=0.0, in_flight_mean=0.0)
    quiet = replace(s.conditions, demand=silent)
    assert predicted_attainment("prefill", 1, quiet) == 1.0
    assert predicted_attainment("decode", 1, quiet) == 1.0


@dataclass(frozen=True)
class UnknownCase:
    name: str
    role: Role
    engines: int | None
    change: dict
    why: str


UNKNOWN_CASES = [
    UnknownCase(
        "no_latency_model",
        "prefill",
        3,
        {"latency": None},
        "without a profile the planner has no picture of its engines' speed",
    ),
    UnknownCase("no_latency_model_decode", "decode", 1, {"latency": None}, "nor of the decode engines'"),
    UnknownCase(
        "no_demand_signal",
        "prefill",
        3,
        {"demand": None},
        "no traffic observed: a prediction would be a guess, and 1 would read as a perfect score",
    ),
    UnknownCase(
        "no_batch_limit",
        "decode",
        1,
        {"decode_batch_limit": None},
        "the SLA step did not size decode this tick: nothing says how many requests an engine holds",
    ),
    UnknownCase("count_unknown", "prefill", None, {}, "the incumbent's count was not read"),
]


@pytest.mark.parametrize("case", UNKNOWN_CASES, ids=lambda c: c.name)
def test_what_the_model_cannot_predict_is_none(case: UnknownCase) -> None:
    c = replace(steady().conditions, **case.change)
    assert predicted_attainment(case.role, case.engines, c) is None, case.why


def test_a_fresh_state_predicts_nothing() -> None:
    """Before the first tick: no latency model and no traffic sample."""
    settings = settings_for(h200_model(), ROLES)
    c = conditions(SlaState(), settings, 5.0, None)
    assert (c.latency, c.demand, c.decode_batch_limit) == (None, None, None)
    section = shadow_section(
        ROLES,
        incumbent={"prefill": 1, "decode": 1},
        incumbent_ready=None,
        planner=None,
        wish=None,
        conditions=c,
    )
    for row in section.roles.values():  # type: ignore[union-attr]
        assert (row.attainment_incumbent, row.attainment_planner, row.planner) == (None, None, None)


# --- the report over tick records -------------------------------------------------------------------


def row(
    at_s: float,
    incumbent: dict[str, int | None],
    planner: dict[str, int | None],
    *,
    attainment: tuple[float | None, float | None] = (None, None),
    gpus: dict[str, int] | None = None,
    price: float = 2.0,
) -> tuple[float, dict, dict]:
    shadow = {
        "caveat": CAVEAT,
        "roles": {
            role: {
                "incumbent": incumbent[role],
                "planner": planner[role],
                "attainment_incumbent": attainment[0],
                "attainment_planner": attainment[1],
            }
            for role in ROLES
        },
    }
    cost = {"gpus_per_engine": gpus or {"prefill": 1, "decode": 2}, "cost_per_gpu_hour": price}
    return at_s, shadow, cost


def test_report_counts_a_hand_made_window() -> None:
    """Five ticks a minute apart, counted by hand:

    | t (s) | incumbent p/d | planner p/d | exact | within one |
    | 0     | 2/2           | 2/2         | yes   | yes         |
    | 60    | 2/2           | 3/2         | no    | yes         |
    | 120   | 1/2           | 3/2         | no    | no          |
    | 180   | None/2        | 3/2         | -     | -           |  (not compared)
    | 240   | 3/1           | 3/2         | no    | yes         |

    Engine-seconds, each tick's counts for 60 s until the next (the last tick bills nothing):
    incumbent prefill 2+2+1 = 5 minutes, decode 2+2+2 = 6 (the tick at 180 s bills neither role:
    its counts are unknown as a whole); planner prefill 2+3+3+3 = 11, decode 8. Decode engines
    take 2 GPUs, GPUs cost 2 per hour."""
    rows = [
        row(0, {"prefill": 2, "decode": 2}, {"prefill": 2, "decode": 2}, attainment=(0.9, 0.95)),
        row(60, {"prefill": 2, "decode": 2}, {"prefill": 3, "decode": 2}, attainment=(0.7, None)),
        row(120, {"prefill": 1, "decode": 2}, {"prefill": 3, "decode": 2}),
        row(180, {"prefill": None, "decode": 2}, {"prefill": 3, "decode": 2}),
        row(240, {"prefill": 3, "decode": 1}, {"prefill": 3, "decode": 2}),
    ]
    report = shadow_report(rows, ROLES)
    assert (report.ticks, report.compared, report.exact, report.within_one) == (5, 4, 1, 3)
    assert report.exact_share == pytest.approx(1 / 4)
    assert report.within_one_share == pytest.approx(3 / 4)
    incumbent, planner = report.sides["incumbent"], report.sides["planner"]
    # The incumbent's tick at 180 s knows no prefill count: its minute to 240 s is not billed.
    assert incumbent.billed_s == 180.0 and planner.billed_s == 240.0
    assert incumbent.engine_hours == pytest.approx({"prefill": 5 / 60, "decode": 6 / 60})
    assert planner.engine_hours == pytest.approx({"prefill": 11 / 60, "decode": 8 / 60})
    assert incumbent.gpu_hours == pytest.approx({"prefill": 5 / 60, "decode": 12 / 60})
    assert incumbent.cost == pytest.approx(2 * 17 / 60)
    assert planner.cost == pytest.approx(2 * (11 + 16) / 60)
    # The mean over the ticks that predicted one.
    assert incumbent.mean_attainment == pytest.approx({"prefill": 0.8, "decode": 0.8})
    assert planner.mean_attainment == pytest.approx({"prefill": 0.95, "decode": 0.95})
    assert report.note is None


def test_an_empty_window_says_so() -> None:
    """Ticks from before shadow mode was on carry no shadow section: they are not counted."""
    report = shadow_report([(0.0, None, {"gpus_per_engine": {}})], ROLES)
    assert (report.ticks, report.compared, report.exact_share, report.within_one_share) == (0, 0, None, None)
    assert report.note == EMPTY_NOTE
    assert report.sides["planner"].mean_attainment == {"prefill": None, "decode": None}
    assert report.sides["incumbent"].engine_hours == {}


def test_a_gap_longer_than_the_account_bills_is_not_billed() -> None:
    """Two ticks 1,000 s apart (the planner was stopped): nothing between them is known."""
    one = {"prefill": 1, "decode": 1}
    rows = [row(0, one, one), row(1000, one, one)]
    report = shadow_report(rows, ROLES)
    assert report.sides["incumbent"].billed_s == 0.0
    assert report.exact_share == 1.0


def test_the_section_reads_back_leniently() -> None:
    """A stored section with a value that is not a number reads it as unknown."""
    section = ShadowDiagnostics.model_validate({"roles": {"prefill": {"incumbent": "two", "planner": 2}}})
    assert (section.roles["prefill"].incumbent, section.roles["prefill"].planner) == (None, 2)  # type: ignore[index]
