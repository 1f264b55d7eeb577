"""Engines that never come (app/core/sla/shortfall.py): an order whose engines are not ready
within the wait bound caps the role at what is ready, reports it, and asks again after a
backoff; pending engines never stretch the lead beyond the bound.

The world: one prefill engine runs, and 100 requests a tick need two (as in test_sla_learning.py);
the lead is the 120 s estimate, so the bound is ten minutes (three leads would be six)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.core.perf.interpolation import PerfModel
from app.core.sla.shortfall import WAIT_MIN_S
from app.core.sla.types import SlaReason, SlaResult
from tests.unit.sla_scenarios import TICK_S, Run, h200_model, settings_for

NEED = 2  # prefill engines 100 requests a tick need (pinned in test_sla_learning.py)


@pytest.fixture(scope="module")
def h200() -> PerfModel:
    return h200_model()


def ordered_run(h200: PerfModel) -> tuple[Run, float]:
    """A run that has just ordered a second engine; the order's time."""
    run = Run(h200, settings_for(h200, ("prefill",)), expected={"prefill": 1})
    result = run.tick(100.0, ready={"prefill": 1})
    assert (result.replicas, result.reason) == ({"prefill": NEED}, SlaReason.SCALE_UP)
    return run, run.now_s


def tick_until(run: Run, until_s: float, ready: int) -> list[SlaResult]:
    results = []
    while run.now_s < until_s:
        results.append(run.tick(100.0, ready={"prefill": ready}))
    return results


@dataclass(frozen=True)
class Arrival:
    name: str
    ready_after_s: float | None  # when the ordered engine becomes ready (None: never)
    shortfall: bool
    why: str


ARRIVALS = [
    Arrival(
        "slow start within the bound", 500.0, False, "a start-up slower than the lead is still a start-up"
    ),
    Arrival("just within the bound", WAIT_MIN_S, False, "the bound itself is still waiting"),
    Arrival("never", None, True, "ten minutes without the engine: no capacity, not a slow start"),
]


@pytest.mark.parametrize("case", ARRIVALS, ids=lambda c: c.name)
def test_an_order_is_a_shortfall_only_past_the_bound(h200: PerfModel, case: Arrival) -> None:
    run, ordered_s = ordered_run(h200)
    arrives_s = ordered_s + (case.ready_after_s if case.ready_after_s is not None else 3600.0)
    results = tick_until(run, min(arrives_s, ordered_s + WAIT_MIN_S + 2 * TICK_S) - TICK_S, ready=1)
    if case.ready_after_s is not None:
        results.append(run.tick(100.0, ready={"prefill": NEED}))
    reasons = {r.reason for r in results}
    assert (SlaReason.CAPACITY_UNAVAILABLE in reasons) == case.shortfall, case.why
    leads = [r.diagnostics["lead_s"] for r in results]
    assert max(leads) <= WAIT_MIN_S, "a pending order never stretches the lead beyond the bound"
    if not case.shortfall:
        assert run.state.lead_s == case.ready_after_s and run.state.shortfalls is None


def test_a_shortfall_gives_back_the_engines_that_did_not_come_and_asks_again_with_backoff(
    h200: PerfModel,
) -> None:
    run, ordered_s = ordered_run(h200)
    tick_until(run, ordered_s + WAIT_MIN_S, ready=1)
    assert run.expected == {"prefill": NEED}, "within the bound the order stands"

    # Past the bound: capped at the one engine that runs, which lowers the pending order.
    capped = run.tick(100.0, ready={"prefill": 1})
    assert (capped.replicas, capped.reason) == ({"prefill": 1}, SlaReason.CAPACITY_UNAVAILABLE)
    report = capped.diagnostics["capacity_unavailable"]["prefill"]
    assert (report["asked"], report["ready"], report["attempts"]) == (NEED, 1, 1)
    assert report["retry_in_s"] == WAIT_MIN_S, "the first retry waits one bound"
    assert run.state.orders == {}, "the failed order measures no lead"

    # Held at what runs until the retry, then asked again.
    held = tick_until(run, run.now_s + WAIT_MIN_S - TICK_S, ready=1)
    assert {r.reason for r in held} == {SlaReason.CAPACITY_UNAVAILABLE}
    assert {r.replicas["prefill"] for r in held} == {1}
    retried = run.tick(100.0, ready={"prefill": 1})
    assert (retried.replicas, retried.reason) == ({"prefill": NEED}, SlaReason.SCALE_UP)

    # The second order fails as well: the backoff doubles.
    tick_until(run, run.now_s + WAIT_MIN_S, ready=1)
    again = run.tick(100.0, ready={"prefill": 1})
    assert again.reason == SlaReason.CAPACITY_UNAVAILABLE
    report = again.diagnostics["capacity_unavailable"]["prefill"]
    assert (report["attempts"], report["retry_in_s"]) == (2, 2 * WAIT_MIN_S)


@dataclass(frozen=True)
class Ending:
    name: str
    requests: float
    ready: int
    ticks: int  # at that demand, within the retry's backoff
    why: str


ENDINGS = [
    Ending("the engine comes late", 100.0, NEED, 1, "what was asked for is there: nothing is missing"),
    Ending(
        "the demand falls",
        10.0,
        1,
        30,  # the level's and the burst's windows forget the busy ticks
        "a wish no higher than what runs needs nothing the cluster lacks",
    ),
]


@pytest.mark.parametrize("case", ENDINGS, ids=lambda c: c.name)
def test_a_shortfall_ends_when_nothing_is_missing(h200: PerfModel, case: Ending) -> None:
    run, ordered_s = ordered_run(h200)
    tick_until(run, ordered_s + WAIT_MIN_S + TICK_S, ready=1)
    assert run.state.shortfalls is not None
    for _ in range(case.ticks):
        result = run.tick(case.requests, ready={"prefill": case.ready})
    assert result.reason != SlaReason.CAPACITY_UNAVAILABLE, case.why
    assert "capacity_unavailable" not in result.diagnostics, case.why
    assert run.state.shortfalls is None, case.why


def test_an_order_cut_by_a_grant_times_out_as_the_grant(h200: PerfModel) -> None:
    """The step wishes more engines than its bounds or the fleet's grant let it order (two here):
    the order of those two still ages from when it was placed, and fails at the bound as an
    order of two, not one that is placed afresh each tick and never grows old."""
    granted = 2
    run = Run(h200, settings_for(h200, ("prefill",)), expected={"prefill": 1})
    results = []
    while run.now_s < WAIT_MIN_S + 2 * TICK_S:
        result = run.tick(300.0, ready={"prefill": 1}, follow=False)
        results.append(result)
        run.expected = {"prefill": min(result.replicas["prefill"], granted)}
    assert results[0].replicas["prefill"] > granted, "the wish must exceed the grant"
    capped = results[-1]
    assert (capped.replicas, capped.reason) == ({"prefill": 1}, SlaReason.CAPACITY_UNAVAILABLE)
    report = capped.diagnostics["capacity_unavailable"]["prefill"]
    assert (report["asked"], report["ready"]) == (granted, 1)
