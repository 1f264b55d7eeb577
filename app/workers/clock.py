"""Clocks. The worker loop asks a clock for `now` and to sleep; tests and replay pass their own."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...

    async def sleep_until(self, at: datetime) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, at: datetime) -> None:
        delay_s = (at - self.now()).total_seconds()
        if delay_s > 0:
            await asyncio.sleep(delay_s)


class ScaledClock:
    """Accelerated real time for demos and tests (`PLANNER_TIME_SCALE`): `now` starts at the wall
    time of construction and runs `speed` times faster, so a 180 s throughput interval or an
    ack timeout passes in 180 / speed wall seconds. Sleeps last (simulated delay) / speed."""

    def __init__(
        self,
        speed: float,
        *,
        start: datetime | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed must be a finite number > 0, got {speed!r}")
        self.speed = float(speed)
        self._start = start if start is not None else datetime.now(UTC)
        self._monotonic = monotonic
        self._t0 = monotonic()

    def now(self) -> datetime:
        # Elapsed time from the monotonic clock: a wall-clock step (NTP) must not jump the
        # simulated time.
        return self._start + timedelta(seconds=(self._monotonic() - self._t0) * self.speed)

    def scaled_monotonic(self) -> float:
        """Monotonic seconds at this clock's speed, for interval measurements (scrape sources)."""
        return self._monotonic() * self.speed

    async def sleep_until(self, at: datetime) -> None:
        delay_s = (at - self.now()).total_seconds()
        if delay_s > 0:
            await asyncio.sleep(delay_s / self.speed)


class ManualClock:
    """Time moves only when `advance` is called; sleepers due by then wake up."""

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._sleepers: list[tuple[datetime, asyncio.Future[None]]] = []

    def now(self) -> datetime:
        return self._now

    async def sleep_until(self, at: datetime) -> None:
        if at <= self._now:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((at, future))
        await future

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)
        due = [(t, f) for t, f in self._sleepers if t <= self._now]
        self._sleepers = [(t, f) for t, f in self._sleepers if t > self._now]
        for _, future in due:
            if not future.done():
                future.set_result(None)
