"""ManualClock: time moves only on `advance`, and sleepers wake exactly when their time has come."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from app.workers.clock import ManualClock

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


async def settle() -> None:
    """Let every task that can run, run (a few loop turns; no wall-clock waiting)."""
    for _ in range(5):
        await asyncio.sleep(0)


@dataclass(frozen=True)
class WakeCase:
    name: str
    why: str
    sleeps_s: tuple[float, ...]  # each sleeper's wake-up time, seconds after T0, in start order
    advances_s: tuple[float, ...]  # successive advance() calls
    awake_after_each: tuple[frozenset[int], ...]  # indices of sleepers done after each advance


def S(*indices: int) -> frozenset[int]:
    return frozenset(indices)


WAKE_CASES = [
    WakeCase("one_sleeper_exact", "due exactly at its time", (10,), (10,), (S(0),)),
    WakeCase("one_sleeper_short", "not before its time", (10,), (9.999, 0.001), (S(), S(0))),
    WakeCase("two_sleepers_in_order", "each wakes when passed", (10, 20), (10, 10), (S(0), S(0, 1))),
    WakeCase(
        "started_out_of_order",
        "start order does not matter",
        (30, 10, 20),
        (15, 10, 5),
        (S(1), S(1, 2), S(0, 1, 2)),
    ),
    WakeCase("one_big_advance", "a jump past every time wakes all", (5, 50, 500), (1000,), (S(0, 1, 2),)),
    WakeCase("same_time", "sleepers due at the same time wake together", (10, 10), (9, 1), (S(), S(0, 1))),
    WakeCase("no_advance_past", "advancing by zero wakes nobody", (10,), (0, 0), (S(), S())),
]


@pytest.mark.parametrize("case", WAKE_CASES, ids=lambda c: c.name)
async def test_sleepers_wake_when_passed(case: WakeCase) -> None:
    clock = ManualClock(T0)
    tasks = [asyncio.create_task(clock.sleep_until(T0 + timedelta(seconds=s))) for s in case.sleeps_s]
    try:
        await settle()
        assert [t.done() for t in tasks] == [False] * len(tasks), "nobody wakes before time moves"
        for advance_s, expected in zip(case.advances_s, case.awake_after_each, strict=True):
            clock.advance(advance_s)
            await settle()
            assert {i for i, t in enumerate(tasks) if t.done()} == expected, case.why
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_now_moves_only_on_advance() -> None:
    clock = ManualClock(T0)
    await settle()
    assert clock.now() == T0
    clock.advance(1.5)
    assert clock.now() == T0 + timedelta(seconds=1.5)


@pytest.mark.parametrize("offset_s", [-60.0, 0.0], ids=["past", "now"])
async def test_sleep_until_past_returns_at_once(offset_s: float) -> None:
    clock = ManualClock(T0)
    task = asyncio.create_task(clock.sleep_until(T0 + timedelta(seconds=offset_s)))
    await settle()
    assert task.done()
    assert task.result() is None
    assert clock.now() == T0


async def test_cancelled_sleeper_does_not_break_advance() -> None:
    clock = ManualClock(T0)
    cancelled = asyncio.create_task(clock.sleep_until(T0 + timedelta(seconds=5)))
    other = asyncio.create_task(clock.sleep_until(T0 + timedelta(seconds=5)))
    await settle()
    cancelled.cancel()
    await settle()
    clock.advance(5)
    await settle()
    assert cancelled.cancelled()
    assert other.done() and other.result() is None
