"""Clocks. The worker loop asks a clock for `now` and to sleep; tests and replay pass their own."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import struct
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
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

    def describe(self) -> dict[str, object]:
        return {"kind": "wall", "rate": 1.0, "detail": "UTC wall-clock time"}


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

    def describe(self) -> dict[str, object]:
        return {
            "kind": "scaled",
            "epoch": self._start.isoformat(),
            "rate": self.speed,
            "detail": f"accelerated: from {self._start.isoformat()} (wall time at start-up) the clock "
            f"runs {self.speed:g} times faster than the wall clock (PLANNER_TIME_SCALE)",
        }


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


# --- a clock another process drives -----------------------------------------------------------------

# The demo's simulated day: simulated second s is SIM_EPOCH + s, so a timestamp can never be taken
# for a wall-clock time, and its time of day is the demo's `sim hh:mm:ss`.
SIM_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_CLOCK_FORMAT = "<4d"  # epoch (Unix s), anchor (CLOCK_MONOTONIC s), simulated s at the anchor, rate
_REREAD_S = 0.02  # wall seconds a reader trusts what it read last
_MAX_SLEEP_S = 0.25  # wall seconds between re-reads while sleeping (the rate may change)


class SharedClockWriter:
    """The driving side of a `SharedClock`: simulated time as a line through (anchor, simulated
    seconds) with a rate, in a 32-byte file replaced atomically. CLOCK_MONOTONIC is the same for
    every process of the host, so a reader extrapolates between writes exactly as the writer does.
    `set_rate` keeps the time continuous (the new line starts where the old one is now)."""

    def __init__(
        self,
        path: str | Path,
        *,
        rate: float,
        epoch: datetime = SIM_EPOCH,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.epoch = epoch
        self._monotonic = monotonic
        self._lock = threading.Lock()  # the simulator thread sets the rate, others read the time
        self._anchor = monotonic()
        self._sim_s = 0.0
        self.rate = _checked_rate(rate)
        self._write()

    def sim_s(self) -> float:
        with self._lock:
            return self._sim_s + (self._monotonic() - self._anchor) * self.rate

    def set_rate(self, rate: float) -> None:
        rate = _checked_rate(rate)
        with self._lock:
            now = self._monotonic()
            self._sim_s += (now - self._anchor) * self.rate
            self._anchor, self.rate = now, rate
            self._write()

    def _write(self) -> None:
        data = struct.pack(_CLOCK_FORMAT, self.epoch.timestamp(), self._anchor, self._sim_s, self.rate)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)  # atomic: a reader sees the old line or the new one


class SharedClock:
    """The planner's clock when another process drives time (`PLANNER_CLOCK_FILE`, set by
    `planner demo` to its simulated clock): `now` is the writer's epoch plus its simulated
    seconds, which run at the writer's rate (the demo's --speed, slower while its simulator cannot
    keep up). Never goes backwards, even across a rate change read late."""

    def __init__(self, path: str | Path, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._read_at = -math.inf
        self._last = -math.inf
        self._line = self._read()

    def _read(self) -> tuple[float, float, float, float]:
        try:
            data = self.path.read_bytes()
            return struct.unpack(_CLOCK_FORMAT, data)
        except (OSError, struct.error) as exc:
            raise ValueError(f"PLANNER_CLOCK_FILE: cannot read a clock from {self.path}: {exc}") from None

    @property
    def rate(self) -> float:
        return self._line[3]

    @property
    def epoch(self) -> datetime:
        return datetime.fromtimestamp(self._line[0], UTC)

    def scaled_monotonic(self) -> float:
        """Simulated seconds, for interval measurements (scrape and FPM sources)."""
        with self._lock:
            mono = self._monotonic()
            if mono - self._read_at > _REREAD_S:
                with contextlib.suppress(ValueError):  # the writer gone: keep extrapolating
                    self._line = self._read()
                self._read_at = mono
            _, anchor, sim_s, rate = self._line
            self._last = max(self._last, sim_s + (mono - anchor) * rate)
            return self._last

    def now(self) -> datetime:
        sim_s = self.scaled_monotonic()
        return datetime.fromtimestamp(self._line[0], UTC) + timedelta(seconds=sim_s)

    async def sleep_until(self, at: datetime) -> None:
        while True:
            delay_s = (at - self.now()).total_seconds()
            if delay_s <= 0:
                return
            await asyncio.sleep(min(delay_s / self.rate, _MAX_SLEEP_S))

    def describe(self) -> dict[str, object]:
        return {
            "kind": "simulated",
            "epoch": self.epoch.isoformat(),
            "rate": self.rate,
            "detail": f"simulated (planner demo): {self.epoch.isoformat()} is simulated second 0, the start "
            f"of the trace; the clock runs {self.rate:g} times faster than the wall clock now",
        }


def _checked_rate(rate: float) -> float:
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a finite number > 0, got {rate!r}")
    return float(rate)
