"""When each scaling mode runs: load every `load_interval_s`, throughput every
`throughput_interval_s`, merged into one tick when they fall close together.

Reference §5.2: the next tick is at min(next load, next throughput); a cadence is due when its
time is at most `MERGE_TOLERANCE_S` after that tick, so a load tick at 59.9 s and a throughput
tick at 60 s are one tick. A mode that is off is never due. Pure: the caller passes `now`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MERGE_TOLERANCE_S = 0.5


@dataclass(frozen=True)
class Due:
    load: bool
    throughput: bool


@dataclass(frozen=True)
class Cadence:
    load_interval_s: float | None  # None: load scaling off
    throughput_interval_s: float | None  # None: throughput scaling off
    next_load_s: float = math.inf
    next_throughput_s: float = math.inf

    @classmethod
    def start(
        cls, start_s: float, *, load_interval_s: float | None, throughput_interval_s: float | None
    ) -> Cadence:
        for name, value in (
            ("load_interval_s", load_interval_s),
            ("throughput_interval_s", throughput_interval_s),
        ):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        return cls(
            load_interval_s,
            throughput_interval_s,
            next_load_s=start_s + load_interval_s if load_interval_s else math.inf,
            next_throughput_s=start_s + throughput_interval_s if throughput_interval_s else math.inf,
        )

    @property
    def next_tick_s(self) -> float:
        """When to tick next; infinite when both modes are off (the caller still ticks on its own
        interval, for overrides)."""
        return min(self.next_load_s, self.next_throughput_s)

    def due(self, now_s: float) -> Due:
        return Due(
            load=self.next_load_s <= now_s + MERGE_TOLERANCE_S,
            throughput=self.next_throughput_s <= now_s + MERGE_TOLERANCE_S,
        )

    def after(self, now_s: float, due: Due) -> Cadence:
        """The cadence once the due modes have run at `now_s`: each one next at now + its interval."""
        return Cadence(
            self.load_interval_s,
            self.throughput_interval_s,
            next_load_s=now_s + self.load_interval_s
            if due.load and self.load_interval_s
            else self.next_load_s,
            next_throughput_s=(
                now_s + self.throughput_interval_s
                if due.throughput and self.throughput_interval_s
                else self.next_throughput_s
            ),
        )
