"""bench/dynamo_replay.py's `first-order` policy and its `--orders` flag; nothing needs Dynamo
installed (the policy answers the replay's plain-dict snapshots)."""

from __future__ import annotations

import pytest

from bench import dynamo_replay as dr


def test_first_order_orders_its_count_at_the_first_tick_then_holds() -> None:
    policy = dr.FirstOrder(8, 4)
    assert policy.initial_tick_ms() == 5000.0
    assert policy.on_tick({"now_ms": 5000.0}) == {
        "target_prefill": 8,
        "target_decode": 4,
        "next_tick_ms": 10000.0,
    }
    # Nothing after: the replay keeps what it has (None is "unchanged").
    assert policy.on_tick({"now_ms": 10000.0}) == {
        "target_prefill": None,
        "target_decode": None,
        "next_tick_ms": 15000.0,
    }


def test_orders_parse_prefill_slash_decode_pairs() -> None:
    assert dr.parse_orders("8/4, 32/32") == [(8, 4), (32, 32)]


@pytest.mark.parametrize("text", ["8-4", "8/", "0/4", "8/4,x/2", "-1/3"])
def test_a_bad_order_is_a_one_line_error_naming_the_flag(text: str) -> None:
    with pytest.raises(SystemExit, match=r"^--orders: expected PREFILL/DECODE counts like 8/4, got '"):
        dr.parse_orders(text)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--start", "2-1"], "--start: expected PREFILL/DECODE counts like 8/4, got '2-1'"),
        (["--start", "2/1,3/2"], "--start: one PREFILL/DECODE count, like 2/1"),
    ],
)
def test_a_bad_start_is_a_one_line_error_naming_the_flag(argv: list[str], message: str, monkeypatch) -> None:
    monkeypatch.setattr(dr, "dynamo_available", lambda: True)
    with pytest.raises(SystemExit, match=f"^{message}$"):
        dr.main(argv)


def test_the_planners_sizing_flag_reaches_its_deployment() -> None:
    workload = dr.WORKLOADS["azure-conv-x10-rr"]
    _, default = dr.deployment_for(workload)
    _, chosen = dr.deployment_for(workload, sizing="attainment")
    assert default.scaling.sizing == "headroom" and chosen.scaling.sizing == "attainment"
