"""bench/dynamo_replay.py's `first-order` policy and its `--orders` flag; nothing needs Dynamo
installed (the policy answers the replay's plain-dict snapshots)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import dynamo_replay as dr  # noqa: E402


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
