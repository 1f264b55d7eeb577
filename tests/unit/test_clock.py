"""ManualClock: time moves only on `advance`, and sleepers wake exactly when their time has come.
ScaledClock: accelerated real time (PLANNER_TIME_SCALE). SharedClock: the time another process
drives (`planner demo`'s simulated clock, PLANNER_CLOCK_FILE)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from app.workers.clock import SIM_EPOCH, ManualClock, ScaledClock, SharedClock, SharedClockWriter

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


class FakeMonotonic:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_scaled_clock_runs_speed_times_faster() -> None:
    wall = FakeMonotonic()
    clock = ScaledClock(60.0, start=T0, monotonic=wall)
    assert clock.now() == T0
    wall.t += 3.0  # three wall seconds are three simulated minutes
    assert clock.now() == T0 + timedelta(minutes=3)
    assert clock.now().tzinfo is UTC
    assert clock.scaled_monotonic() == pytest.approx(1003.0 * 60.0)


def test_scaled_clock_starts_at_the_wall_time() -> None:
    before = datetime.now(UTC)
    clock = ScaledClock(10.0)
    assert before <= clock.now() <= datetime.now(UTC) + timedelta(seconds=60)
    assert clock.now().tzinfo is not None


async def test_scaled_clock_sleeps_divided_by_speed() -> None:
    """A 20 s sleep at speed 200 lasts 0.1 wall seconds; without the division it would take 20."""
    clock = ScaledClock(200.0)
    target = clock.now() + timedelta(seconds=20)
    wall_start = time.monotonic()
    await clock.sleep_until(target)
    assert time.monotonic() - wall_start < 5.0  # generous: a loaded machine may be slow to wake us
    assert clock.now() >= target
    started = time.monotonic()
    await clock.sleep_until(target - timedelta(seconds=60))  # already past: returns at once
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("speed", [0.0, -1.0, float("nan"), float("inf")])
def test_scaled_clock_rejects_bad_speeds(speed: float) -> None:
    with pytest.raises(ValueError, match="speed"):
        ScaledClock(speed)


# --- SharedClock: the time `planner demo`'s simulator drives, read by the planner service ----------


def test_shared_clock_reads_what_the_writer_drives(tmp_path):
    mono = FakeMonotonic()
    writer = SharedClockWriter(tmp_path / "clock", rate=10.0, monotonic=mono)
    reader = SharedClock(tmp_path / "clock", monotonic=mono)
    assert reader.now() == SIM_EPOCH
    mono.t += 2.0
    assert writer.sim_s() == reader.scaled_monotonic() == 20.0
    assert reader.now() == SIM_EPOCH + timedelta(seconds=20)
    writer.set_rate(2.0)  # continuous: the new line starts where the old one is
    mono.t += 1.0  # past the reader's re-read interval
    assert writer.sim_s() == reader.scaled_monotonic() == 22.0
    assert reader.rate == 2.0
    assert reader.describe()["kind"] == "simulated"
    assert reader.describe()["epoch"] == "2000-01-01T00:00:00+00:00"


def test_shared_clock_never_goes_back_when_it_reads_a_slowdown_late(tmp_path):
    mono = FakeMonotonic()
    writer = SharedClockWriter(tmp_path / "clock", rate=10.0, monotonic=mono)
    reader = SharedClock(tmp_path / "clock", monotonic=mono)
    mono.t += 1.0
    assert reader.scaled_monotonic() == 10.0
    writer.set_rate(1.0)
    mono.t += 0.01  # within the re-read interval: the reader still extrapolates at x10
    ahead = reader.scaled_monotonic()
    assert ahead == pytest.approx(10.1)
    mono.t += 0.02  # re-read: the writer says 10.03, less than what was already shown
    assert reader.scaled_monotonic() == ahead
    mono.t += 1.0
    assert reader.scaled_monotonic() == pytest.approx(11.03)


def test_shared_clock_refuses_a_missing_or_bad_file(tmp_path):
    with pytest.raises(ValueError, match="PLANNER_CLOCK_FILE"):
        SharedClock(tmp_path / "missing")
    (tmp_path / "short").write_bytes(b"123")
    with pytest.raises(ValueError, match="PLANNER_CLOCK_FILE"):
        SharedClock(tmp_path / "short")
    with pytest.raises(ValueError, match="rate"):
        SharedClockWriter(tmp_path / "clock", rate=0.0)


async def test_shared_clock_sleeps_follow_a_rate_change(tmp_path):
    """A sleep re-reads the rate: slowed down while asleep, it wakes at the simulated time."""
    writer = SharedClockWriter(tmp_path / "clock", rate=1000.0)
    reader = SharedClock(tmp_path / "clock")
    due = reader.now() + timedelta(seconds=300)  # 0.3 wall seconds at x1000
    sleeper = asyncio.create_task(reader.sleep_until(due))
    await asyncio.sleep(0.05)
    writer.set_rate(100.0)  # now 300 simulated seconds take longer
    started = time.monotonic()
    await asyncio.wait_for(sleeper, timeout=10)
    assert reader.now() >= due
    assert time.monotonic() - started > 0.5  # slower than the x1000 it started at
