"""Clocks. The worker loop asks a clock for `now` and to sleep; tests and replay pass their own."""

from __future__ import annotations

import asyncio
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
