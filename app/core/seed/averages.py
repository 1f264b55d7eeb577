"""The moving averages the FPM regressions keep beside their fits (ISL, decode length, batch)."""

from __future__ import annotations

from collections import deque


class MovingAverage:
    """Mean of the last `window` values; zeros before the first non-zero value are skipped, so an
    idle start does not drag the averages towards zero."""

    def __init__(self, window: int) -> None:
        self._values: deque[float] = deque(maxlen=window)
        self._seen_nonzero = False

    def add(self, value: float) -> None:
        if value == 0.0 and not self._seen_nonzero:
            return
        self._seen_nonzero = self._seen_nonzero or value != 0.0
        self._values.append(float(value))

    @property
    def value(self) -> float:
        return sum(self._values) / len(self._values) if self._values else 0.0

    def __len__(self) -> int:
        return len(self._values)

    def copy(self) -> MovingAverage:
        new = MovingAverage.__new__(MovingAverage)
        new._values, new._seen_nonzero = deque(self._values, maxlen=self._values.maxlen), self._seen_nonzero
        return new
