"""The demo's status and last lines say how the clock and the planner service are doing, in words."""

from __future__ import annotations

import signal

import pytest

from app.sim.demo.status import clock_note, service_outcome


@pytest.mark.parametrize(
    "status, said, why",
    [
        (-signal.SIGTERM, "stopped", "the demo stops the service with SIGTERM: the clean stop it asked for"),
        (0, "stopped", "a service that exits on its own after the SIGTERM handler ran"),
        (-signal.SIGKILL, "killed: it did not stop within 10 s", "the demo killed it after its stop timeout"),
        (3, "exited with status 3", "a failure is still named by its status"),
        (None, "not started", "the demo stopped before the service was started"),
    ],
)
def test_the_service_outcome_in_words(status: int | None, said: str, why: str) -> None:
    assert service_outcome(status) == said, why


@pytest.mark.parametrize(
    "rate, speed, said, why",
    [
        (10.0, 10.0, None, "at the asked speed there is nothing to say"),
        (9.9, 10.0, None, "within 5% of it: the slice's jitter, not a clock falling behind"),
        (9.4, 10.0, "clock ×9.4 of ×10 asked: the simulation cannot keep up", "both speeds, told apart"),
        (2.35, 20.0, "clock ×2.35 of ×20 asked: the simulation cannot keep up", "three digits"),
    ],
)
def test_the_status_line_says_when_the_clock_falls_behind(
    rate: float, speed: float, said: str | None, why: str
) -> None:
    assert clock_note(rate, speed) == said, why
