"""Load and throughput cadences, merged into ticks (reference §5.2 timing examples)."""

from __future__ import annotations

import math

import pytest

from app.core.cadence import Cadence, Due


def test_first_tick_is_the_load_tick_when_both_run() -> None:
    c = Cadence.start(100, load_interval_s=5, throughput_interval_s=60)
    assert c.next_tick_s == 105
    assert c.due(105) == Due(load=True, throughput=False)


def test_a_load_tick_schedules_the_next_one_interval_later() -> None:
    c = Cadence.start(0, load_interval_s=5, throughput_interval_s=60)
    c = c.after(10, Due(load=True, throughput=False))
    assert c.next_load_s == 15
    assert c.next_throughput_s == 60


def test_a_throughput_tick_at_60_schedules_the_next_at_120() -> None:
    c = Cadence.start(0, load_interval_s=None, throughput_interval_s=60)
    assert c.due(60) == Due(load=False, throughput=True)
    assert c.after(60, c.due(60)).next_tick_s == 120


def test_close_cadences_merge_into_one_tick() -> None:
    c = Cadence(5, 60, next_load_s=59.7, next_throughput_s=60.0)
    assert c.due(59.7) == Due(load=True, throughput=True)
    c = Cadence(5, 60, next_load_s=59.4, next_throughput_s=60.0)
    assert c.due(59.4) == Due(load=True, throughput=False)


def test_a_mode_that_is_off_is_never_due() -> None:
    c = Cadence.start(0, load_interval_s=None, throughput_interval_s=None)
    assert c.next_tick_s == math.inf
    assert c.due(1e9) == Due(load=False, throughput=False)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_bad_intervals_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="load_interval_s"):
        Cadence.start(0, load_interval_s=bad, throughput_interval_s=60)
