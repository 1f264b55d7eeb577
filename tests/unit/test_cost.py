"""The cost rule (app/core/cost): which engines a tick bills, which of them are idle, how an
interval is billed, how a stored account resumes, and how the price is configured."""

from __future__ import annotations

import math

import pytest

from app.config import ConfigError, validate_deployments
from app.core.cost.account import (
    MAX_BILLED_GAP_S,
    CostSample,
    CostTotals,
    advance,
    billed_engines,
    idle_engines,
    resume,
)
from app.core.cost.report import cost_report
from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics
from tests.support import demo_config

IDLE = ForwardPassMetrics.heartbeat("e1")
BUSY = ForwardPassMetrics("e2", 0, 0.02, scheduled=ScheduledRequestMetrics(num_decode_requests=3))
QUEUED = ForwardPassMetrics("e3", 0, 0.01, queued=QueuedRequestMetrics(num_prefill_requests=1))
EMPTY_PASS = ForwardPassMetrics("e4", 0, 0.01)


@pytest.mark.parametrize(
    ("ordered", "ready", "fpm", "billed", "why"),
    [
        ({"decode": 4}, {"decode": 2}, {}, {"decode": 4}, "engines still starting are billed from the order"),
        ({"decode": 1}, {"decode": 3}, {}, {"decode": 3}, "a lowered order bills until the engines leave"),
        (
            {"decode": 1},
            {"decode": 1},
            {"decode": {("e1", 0): IDLE, ("e2", 0): BUSY}},
            {"decode": 2},
            "an engine draining reports forward passes until it stops",
        ),
        (None, {"decode": 2}, {}, {"decode": 2}, "no decision in force: what is ready"),
        (None, None, {"decode": {("e1", 0): IDLE}}, {"decode": 1}, "no inventory: what reports"),
        (None, None, {}, None, "nothing known is not zero engines"),
    ],
)
def test_billed_engines(ordered, ready, fpm, billed, why) -> None:
    assert billed_engines(("decode",), ordered=ordered, ready=ready, fpm=fpm) == billed, why


@pytest.mark.parametrize(
    ("billed", "fpm", "idle", "why"),
    [
        (
            {"decode": 4},
            {"decode": {("e1", 0): IDLE, ("e2", 0): BUSY, ("e3", 0): QUEUED, ("e4", 0): EMPTY_PASS}},
            {"decode": 2},
            "a heartbeat and an empty pass are idle; running or queued work is not",
        ),
        (
            {"decode": 1},
            {"decode": {("e1", 0): IDLE, ("e1", 1): BUSY}},
            {"decode": 0},
            "an engine is idle only when every data-parallel rank is",
        ),
        ({"decode": 2}, {}, {"decode": None}, "no forward passes read: unknown"),
        ({"decode": 0}, {}, {"decode": 0}, "no engine billed: none idle"),
    ],
)
def test_idle_engines(billed, fpm, idle, why) -> None:
    assert idle_engines(billed, fpm) == idle, why


def sample(
    at_s: float, billed: dict[str, int] | None, idle: dict[str, int | None] | None = None
) -> CostSample:
    return CostSample(at_s, billed, idle or {}, {"prefill": 1, "decode": 2}, 4.0)


@pytest.mark.parametrize(
    ("previous", "at_s", "gpu_s", "cost", "unobserved_s", "why"),
    [
        (
            sample(0, {"prefill": 2, "decode": 1}),
            30,
            {"prefill": 60, "decode": 60},
            120 / 3600 * 4,
            0,
            "at the earlier counts",
        ),
        (sample(0, None), 30, {}, 0, 30, "unknown counts bill nothing"),
        (
            sample(0, {"decode": 1}),
            MAX_BILLED_GAP_S + 1,
            {},
            0,
            MAX_BILLED_GAP_S + 1,
            "a planner stopped for long",
        ),
        (
            sample(0, {"decode": 1}),
            MAX_BILLED_GAP_S,
            {"decode": 2 * MAX_BILLED_GAP_S},
            2 * MAX_BILLED_GAP_S / 3600 * 4,
            0,
            "a restart's gap is billed",
        ),
    ],
)
def test_an_interval_is_billed_at_the_earlier_ticks_engines(
    previous, at_s, gpu_s, cost, unobserved_s, why
) -> None:
    totals, _ = advance(CostTotals(), previous, sample(at_s, {"decode": 9}))
    assert totals.gpu_s == pytest.approx(gpu_s), why
    assert totals.cost == pytest.approx(cost), why
    assert totals.unobserved_s == unobserved_s, why


def test_a_simulator_sampling_at_changes_bills_any_gap() -> None:
    totals, _ = advance(CostTotals(), sample(0, {"decode": 1}), sample(7200, None), max_gap_s=math.inf)
    assert totals.gpu_s == {"decode": 2 * 7200}


@pytest.mark.parametrize(
    ("stored", "resumed", "why"),
    [
        (
            {
                "billed": {"decode": 2},
                "idle": {"decode": None},
                "gpus_per_engine": {"decode": 2},
                "cost_per_gpu_hour": 1.5,
                "totals": {
                    "gpu_s": {"decode": 7200.0},
                    "cost": 3.0,
                    "idle_gpu_s": 0,
                    "idle_known_gpu_s": 0,
                    "unobserved_s": 5,
                },
            },
            (3.0, {"decode": 2}),
            "the last tick's account and counts",
        ),
        (None, (0.0, None), "a tick from before the account: afresh"),
        ({"billed": {"decode": 2}, "totals": {"cost": "x"}}, (0.0, None), "what does not read: afresh"),
        (
            {
                "billed": {"decode": -1},
                "idle": {},
                "gpus_per_engine": {},
                "cost_per_gpu_hour": 1,
                "totals": {"gpu_s": {}, "cost": 0, "idle_gpu_s": 0, "idle_known_gpu_s": 0, "unobserved_s": 0},
            },
            (0.0, None),
            "a negative count is not a count",
        ),
    ],
)
def test_a_stored_account_resumes(stored, resumed, why) -> None:
    totals, last = resume(100.0, stored)
    assert (totals.cost, last.billed if last else None) == resumed, why


def test_the_report_holds_the_historys_peak_per_role() -> None:
    # Prefill peaks at 3 in the first minute, decode at 2 in the second: the static allocation
    # holds both peaks both minutes (3 x 1 + 2 x 2 GPUs for 120 s); idle known only in the first.
    report = cost_report(
        [
            sample(0, {"prefill": 3, "decode": 1}, {"prefill": 1, "decode": 0}),
            sample(60, {"prefill": 1, "decode": 2}),
            sample(120, {"prefill": 1, "decode": 1}),
        ]
    )
    assert report.peak_engines == {"prefill": 3, "decode": 2}
    assert report.total_gpu_hours == pytest.approx((5 * 60 + 5 * 60) / 3600)
    assert report.static_gpu_hours == pytest.approx(7 * 120 / 3600)
    assert report.saving == pytest.approx((7 * 120 - 10 * 60) / 3600 * 4)
    assert report.idle_share == pytest.approx(1 / 5)


def test_hours_split_an_interval_across_their_boundary() -> None:
    report = cost_report([sample(3540, {"decode": 1}), sample(3660, {"decode": 1})])
    assert [(b.start_s, b.gpu_hours) for b in report.per_hour] == [
        (0.0, pytest.approx(120 / 3600)),
        (3600.0, pytest.approx(120 / 3600)),
    ]


def with_variant(price: float, **deployment) -> dict:
    config = demo_config(profile="../data/profiles/h200-llama3.1-8b-fp8", **deployment)
    config["fleet"] = {
        "budget_gpus": {"h200": 8},
        "deployments": {"demo": {"variants": [{"gpu_type": "h200", "price_per_gpu_hour": price}]}},
    }
    return config


@pytest.mark.parametrize(
    ("config", "price", "error", "why"),
    [
        (demo_config(), 1.0, None, "unset: figures read as GPU-hours"),
        (demo_config(cost_per_gpu_hour=2.5), 2.5, None, "a price in any currency"),
        (with_variant(3.5), 3.5, None, "the first hardware variant's price is the deployment's"),
        (with_variant(3.5, cost_per_gpu_hour=3.5), 3.5, None, "the same price twice"),
        (
            with_variant(3.5, cost_per_gpu_hour=2.0),
            None,
            "cost_per_gpu_hour: 2, but fleet.deployments.demo.variants.0.price_per_gpu_hour is 3.5",
            "two prices",
        ),
        (demo_config(cost_per_gpu_hour=0), None, "cost_per_gpu_hour", "a GPU costs something"),
        (demo_config(cost_per_gpu_hour="cheap"), None, "cost_per_gpu_hour", "not a number"),
    ],
)
def test_the_price_of_a_gpu_hour(config, price, error, why) -> None:
    if error is None:
        assert validate_deployments(config, "file.yaml").deployments[0].cost_per_gpu_hour == price, why
        return
    with pytest.raises(ConfigError) as exc:
        validate_deployments(config, "file.yaml")
    assert error in str(exc.value), (why, str(exc.value))
    assert "\n" not in str(exc.value)
