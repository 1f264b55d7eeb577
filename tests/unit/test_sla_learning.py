"""What the SLA step learns from what it watches, and what that sets.

- The iteration scale: each fresh forward-pass record's wall time over the profile's for its
  batch, the median of a tick's records clamped to `scale_bounds`, smoothed into the state. It
  is a diagnostic; the batch limit rests on the learned latency model, with the profile at the
  measured scale as its floor beyond the batches seen.
- The lead: the time from an order to its engines being ready, the configured estimate until one
  is measured, an open order's age once that is longer; and the scale-down window it sets
  (`scale_down_window_leads` leads, never under `scale_down_window_s`).

The scenarios are those of `tests/unit/sla_scenarios.py`: 5 s ticks through `sla_step`, the
bundled H200 profile as the world unless a record says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.core.perf.interpolation import PerfModel
from app.core.sla.capacity import LengthMix
from app.core.sla.state import Order
from app.core.sla.step import scale_down_window_s
from app.core.sla.types import SlaReason
from tests.unit.sla_scenarios import (
    ISL,
    TICK_S,
    Run,
    batch_limit,
    decode_fpm,
    decode_record,
    h200_model,
    prefill_wish,
    settings_for,
)


@pytest.fixture(scope="module")
def h200() -> PerfModel:
    return h200_model()


# --- the iteration scale --------------------------------------------------------------------------


def test_decode_scale_follows_slower_iterations_by_ewma(h200: PerfModel) -> None:
    """Engines that iterate 1.2× slower than the profile move the scale towards 1.2 at the
    smoothing rate, never past it; the batch limit then rests on the learned line, and beyond
    the batches seen on the profile at the measured scale, so slower engines get smaller batches."""
    settings = settings_for(h200, ("decode",))
    run = Run(h200, settings, expected={"decode": 2})
    run.tick(150.0, fpm=decode_fpm(h200, [60, 60], ratio=1.0))
    assert run.state.scale["decode"] == 1.0
    scale = 1.0
    for _ in range(6):
        result = run.tick(150.0, fpm=decode_fpm(h200, [60, 60], ratio=1.2))
        scale += settings.scale_smoothing * (1.2 - scale)
        assert run.state.scale["decode"] == pytest.approx(scale, rel=1e-12)
        assert result.diagnostics["scale"]["decode"] == round(run.state.scale["decode"], 4)
        assert result.diagnostics["scale_samples"] == {"decode": 2}
    # 1.0, then 1.06, 1.102, 1.1314, ...: towards 1.2, never past it.
    assert scale == pytest.approx(1.2 - 0.2 * 0.7**6, rel=1e-12)
    # The scale is a diagnostic: the batch limit is the learned model's (14 records of 60
    # requests in 15.4 ms, and the prior), and iterations slower than the profile raise the
    # learned line above that of the same ticks at the profile's speed (12.9 ms): alone, it would
    # allow 145 requests against 160. Beyond the 60 requests seen the profile times the measured
    # scale is the floor, higher than both lines: 113 at the profile's speed, 88 at x1.18.
    decode = result.diagnostics["roles"]["decode"]
    measured = run.state.scale["decode"]
    assert decode["batch_limit"] == batch_limit(h200, settings, run.state.latency.decode, scale=measured)  # type: ignore[union-attr]
    same = Run(h200, settings, expected={"decode": 2})
    for _ in range(7):
        same.tick(150.0, fpm=decode_fpm(h200, [60, 60], ratio=1.0))
    lines = (
        batch_limit(h200, settings, run.state.latency.decode, floor=False),  # type: ignore[union-attr]
        batch_limit(h200, settings, same.state.latency.decode, floor=False),  # type: ignore[union-attr]
    )
    assert lines == (145, 160)
    limits = (decode["batch_limit"], same.results[-1].diagnostics["roles"]["decode"]["batch_limit"])
    assert limits == (88, 113), "slower engines, smaller batches at the same ITL target"


def test_scale_ratio_is_clamped_to_its_bounds_then_smoothed(h200: PerfModel) -> None:
    """One wild record must not set the scale: its ratio is clamped to `scale_bounds` before it
    is smoothed in."""
    settings = settings_for(h200, ("decode",))
    low, high = settings.scale_bounds
    run = Run(h200, settings, expected={"decode": 2})
    run.tick(150.0, fpm=decode_fpm(h200, [60], ratio=10.0))  # 10× slower: clamped to 4
    assert run.state.scale["decode"] == high
    run.tick(150.0, fpm=decode_fpm(h200, [60], ratio=0.1))  # 10× faster: clamped to 0.5, smoothed
    assert run.state.scale["decode"] == pytest.approx(
        high + settings.scale_smoothing * (low - high), rel=1e-12
    )


def test_scale_takes_the_median_of_fresh_records_only(h200: PerfModel) -> None:
    """One slow engine does not move the scale of the others (the median, not the mean), and a
    record seen before is no new iteration: neither the scale nor the latency model takes it
    twice."""
    settings = settings_for(h200, ("decode",))
    run = Run(h200, settings, expected={"decode": 2})
    records = {
        ("d0", 0): decode_record(h200, "d0", 60, 1.0),
        ("d1", 0): decode_record(h200, "d1", 60, 1.2),
        ("d2", 0): decode_record(h200, "d2", 60, 3.0),  # an outlier does not move the median
    }
    result = run.tick(150.0, fpm={"decode": records})
    assert run.state.scale["decode"] == pytest.approx(1.2, rel=1e-12)
    assert result.diagnostics["scale_samples"] == {"decode": 3}
    # Without `fpm_new`, the latency model learns each engine's latest record when it is new.
    assert result.diagnostics["latency"]["decode"]["learned_now"] == 3
    assert result.diagnostics["latency"]["decode"]["records"] == 3
    # The same records again (no new iteration reported): nothing folded, the scale stays.
    result = run.tick(150.0, fpm={"decode": records})
    assert run.state.scale["decode"] == pytest.approx(1.2, rel=1e-12)
    assert result.diagnostics["scale_samples"] == {"decode": 0}
    assert result.diagnostics["latency"]["decode"]["learned_now"] == 0
    assert result.diagnostics["latency"]["decode"]["records"] == 3


# --- the lead -------------------------------------------------------------------------------------


def test_lead_is_measured_from_order_to_ready(h200: PerfModel) -> None:
    """Every forecast looks one lead ahead and the scale-down window is counted in leads: the
    lead is the configured estimate until an order's engines are all ready, then that measured
    time."""
    settings = settings_for(h200, ("prefill",), scale_down_window_leads=2.0)
    need = prefill_wish(h200, settings, 100.0 / TICK_S * ISL, LengthMix.uniform(ISL), 1.0)
    assert need == 2  # an order above the single engine running (pinned on the H200 prior)
    run = Run(h200, settings, expected={"prefill": 1})
    result = run.tick(100.0, ready={"prefill": 1})
    ordered_s = run.now_s
    assert (result.replicas, result.reason) == ({"prefill": need}, SlaReason.SCALE_UP)
    assert run.state.orders == {"prefill": (ordered_s, need)}

    # The engines come up after 45 s: until then the lead is the configured estimate.
    startup_s = 45.0
    while run.now_s < ordered_s + startup_s - TICK_S:
        result = run.tick(100.0, ready={"prefill": 1})
        assert (result.diagnostics["lead_s"], result.diagnostics["lead_measured"]) == (
            settings.startup_estimate_s,
            False,
        ), "nothing measured while the order is open and younger than the estimate"
        # The scale-down window is two leads (set above): 2 × the 120 s estimate.
        assert result.diagnostics["scale_down_window_s"] == 240.0
    result = run.tick(100.0, ready={"prefill": need})
    assert run.now_s == ordered_s + startup_s
    assert run.state.lead_s == startup_s
    assert (result.diagnostics["lead_s"], result.diagnostics["lead_measured"]) == (startup_s, True)
    assert run.state.orders == {}
    # ... and follows the measured lead: 2 × 45 s.
    assert result.diagnostics["scale_down_window_s"] == 90.0


def test_open_order_older_than_the_estimate_lengthens_the_lead(h200: PerfModel) -> None:
    """A world slower than the estimate: an order still open after the estimate's 120 s is a
    censored measurement, so the lead is read as the order's age (never shorter than what has
    been measured), and the first completion sets the measured lead."""
    settings = settings_for(h200, ("prefill",))
    run = Run(h200, settings, expected={"prefill": 1})
    run.tick(100.0, ready={"prefill": 1})
    ordered_s, need = run.now_s, run.expected["prefill"]
    assert need == 2 and run.state.orders == {"prefill": (ordered_s, need)}
    leads = []
    while run.now_s < ordered_s + 300.0 - TICK_S:
        leads.append(run.tick(100.0, ready={"prefill": 1}).diagnostics["lead_s"])
    # The estimate (120 s) until the order is that old, then the order's age, tick by tick.
    ages = [ordered_s + TICK_S * (i + 1) - ordered_s for i in range(len(leads))]
    assert leads == [max(settings.startup_estimate_s, age) for age in ages]
    assert leads[-1] == 295.0
    result = run.tick(100.0, ready={"prefill": need})
    assert run.state.lead_s == 300.0
    assert (result.diagnostics["lead_s"], result.diagnostics["lead_measured"]) == (300.0, True)
    # A measured lead shorter than a later open order's age gives way to that age as well.
    run.state.orders, run.expected = {"prefill": Order(run.now_s - 400.0, 3)}, {"prefill": 3}
    assert run.tick(100.0, ready={"prefill": need}, follow=False).diagnostics["lead_s"] == 405.0


def test_order_cancelled_by_a_lower_expected_count_measures_no_lead(h200: PerfModel) -> None:
    """A lead is how long an order took to serve; an order taken back before its engines came
    says nothing about that."""
    settings = settings_for(h200, ("prefill",))
    run = Run(h200, settings, expected={"prefill": 1})
    run.tick(100.0, ready={"prefill": 1})
    assert "prefill" in run.state.orders
    # Someone (a pin, the budget) brought the count back to 1 before the engines came up.
    run.expected = {"prefill": 1}
    run.tick(100.0, ready={"prefill": 1}, follow=False)
    assert run.state.lead_s is None


def test_order_the_ready_engines_already_meet_measures_no_lead(h200: PerfModel) -> None:
    """An order whose engines already serve is ready at once: timing it would read a lead of one
    tick."""
    # A service that starts with no decision of its own thinks 0 are ordered while 5 serve.
    settings = settings_for(h200, ("prefill",))
    run = Run(h200, settings, expected={"prefill": 0}, ready={"prefill": 5})
    result = run.tick(100.0)
    assert result.reason == SlaReason.SCALE_UP  # 0 -> the wish, below the 5 serving
    assert result.replicas["prefill"] < 5  # type: ignore[index]
    assert run.state.orders == {}
    run.tick(100.0)
    assert run.state.lead_s is None


# --- the scale-down window ------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowCase:
    name: str
    window_s: float  # `scale_down_window_s`: the floor, or the window itself without leads
    leads: float  # `scale_down_window_leads`
    lead_s: float
    expected_s: float
    why: str


WINDOW_CASES = [
    WindowCase(
        "no_lead_known_reads_the_floor",
        60.0,
        2.0,
        0.0,
        60.0,
        "with no lead to count in, the floor is the window",
    ),
    WindowCase(
        "short_lead_reads_the_floor",
        60.0,
        2.0,
        20.0,
        60.0,
        "two leads of 20 s are 40 s, too short to see a wish come back: the 60 s floor holds",
    ),
    WindowCase(
        "two_leads_at_the_floor",
        60.0,
        2.0,
        30.0,
        60.0,
        "two leads of 30 s are the floor exactly",
    ),
    WindowCase(
        "lead_above_half_the_floor_reads_two_leads",
        60.0,
        2.0,
        45.0,
        90.0,
        "two leads of 45 s are above the floor: what goes down can be back within 90 s",
    ),
    WindowCase(
        "long_lead_reads_two_leads",
        60.0,
        2.0,
        300.0,
        600.0,
        "engines that take 300 s to start are let go only after 600 s without a wish for them",
    ),
    WindowCase(
        "no_leads_reads_the_fixed_window_without_a_lead",
        300.0,
        0.0,
        0.0,
        300.0,
        "with `scale_down_window_leads` 0 the window is `scale_down_window_s`, whatever the lead",
    ),
    WindowCase(
        "no_leads_reads_the_fixed_window_at_a_short_lead",
        300.0,
        0.0,
        45.0,
        300.0,
        "a short lead does not shorten a fixed window",
    ),
    WindowCase(
        "no_leads_reads_the_fixed_window_at_a_long_lead",
        300.0,
        0.0,
        600.0,
        300.0,
        "a long lead does not lengthen a fixed window",
    ),
]


@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: c.name)
def test_scale_down_window_is_leads_times_the_lead_with_a_floor(h200: PerfModel, case: WindowCase) -> None:
    settings = settings_for(
        h200, ("prefill",), scale_down_window_s=case.window_s, scale_down_window_leads=case.leads
    )
    assert scale_down_window_s(settings, case.lead_s) == case.expected_s, case.why
