"""Missing signals: when one counts as unavailable (app/workers/signals.py), and what a proposal
made without it may do (app/core/signals.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.core.signals import hold_on_missing
from app.core.types import Stage
from app.workers.signals import SIGNAL_MISSES, SignalHealth


@dataclass(frozen=True)
class Reads:
    name: str
    ticks: list[dict[str, bool]]
    unavailable: set[str]
    became_at: dict[str, int]  # signal -> the tick (0-based) it became unavailable at
    why: str


READS = [
    Reads("always read", [{"traffic": True}] * 5, set(), {}, "nothing missing"),
    Reads(
        "two misses are noise",
        [{"traffic": False}] * (SIGNAL_MISSES - 1) + [{"traffic": True}],
        set(),
        {},
        "a failed scrape or a skipped beat is not an outage",
    ),
    Reads(
        "three in a row",
        [{"traffic": False}] * SIGNAL_MISSES,
        {"traffic"},
        {"traffic": SIGNAL_MISSES - 1},
        "three ticks without it: unavailable, reported once",
    ),
    Reads(
        "misses must be consecutive",
        [{"traffic": False}, {"traffic": False}, {"traffic": True}, {"traffic": False}, {"traffic": False}],
        set(),
        {},
        "a read in between starts the count again",
    ),
    Reads(
        "not assessed keeps the count",
        [{"fpm_prefill": False}, {}, {"fpm_prefill": False}, {}, {"fpm_prefill": False}],
        {"fpm_prefill"},
        {"fpm_prefill": 4},
        "a tick that did not assess a signal (no requests served) neither reads nor misses it",
    ),
    Reads(
        "back once read",
        [{"inventory": False}] * SIGNAL_MISSES + [{"inventory": True}],
        set(),
        {"inventory": SIGNAL_MISSES - 1},
        "one successful read ends the outage",
    ),
]


@pytest.mark.parametrize("case", READS, ids=lambda c: c.name)
def test_a_signal_is_unavailable_after_consecutive_misses(case: Reads) -> None:
    health = SignalHealth()
    became_at: dict[str, int] = {}
    for i, read in enumerate(case.ticks):
        became, _ = health.observe(read)
        for signal in became:
            assert signal not in became_at, case.why  # reported once per outage
            became_at[signal] = i
    assert health.unavailable == case.unavailable, case.why
    assert became_at == case.became_at, case.why


@dataclass(frozen=True)
class Hold:
    name: str
    proposal: dict[str, int] | None
    unavailable: set[str]
    current: dict[str, int] | None
    replicas: dict[str, int] | None
    why: str


HOLDS = [
    Hold(
        "lower while missing",
        {"prefill": 2, "decode": 3},
        {"traffic"},
        {"prefill": 4, "decode": 3},
        {"prefill": 4, "decode": 3},
        "a missing signal is never read as less demand",
    ),
    Hold(
        "higher while missing",
        {"prefill": 6, "decode": 3},
        {"fpm_decode"},
        {"prefill": 4, "decode": 3},
        {"prefill": 6, "decode": 3},
        "a rise comes from the signals still read: it goes through",
    ),
    Hold(
        "lower with every signal read",
        {"prefill": 2, "decode": 3},
        set(),
        {"prefill": 4, "decode": 3},
        {"prefill": 2, "decode": 3},
        "nothing missing: the proposal stands",
    ),
    Hold(
        "nothing known to run",
        {"prefill": 2, "decode": 3},
        {"traffic"},
        None,
        {"prefill": 2, "decode": 3},
        "without an inventory there is nothing to hold",
    ),
    Hold(
        "no proposal",
        None,
        {"traffic"},
        {"prefill": 4, "decode": 3},
        None,
        "no proposal is made up from a hold",
    ),
]


@pytest.mark.parametrize("case", HOLDS, ids=lambda c: c.name)
def test_a_proposal_lowers_nothing_while_a_signal_is_missing(case: Hold) -> None:
    held = hold_on_missing(Stage("proposal", case.proposal, "sla scale_down"), case.unavailable, case.current)
    assert held.replicas == case.replicas, case.why
    if held.replicas != case.proposal:
        assert "held while unavailable: traffic (prefill 2->4)" in held.reason, held.reason
