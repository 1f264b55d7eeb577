"""The demo's last line says how the planner service ended in words, not as a raw status."""

from __future__ import annotations

import signal

import pytest

from app.sim.demo import service_outcome


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
