"""The demo's terminal wording: simulated clock times, the clock's slowdown, how the planner
service ended."""

from __future__ import annotations

import signal

from app.sim.demo.plan import STOP_TIMEOUT_S


def _clock_text(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


# The simulated clock slows down when the simulation cannot keep up; within this share of the
# asked speed it is the slice's own jitter, not worth a word.
CLOCK_BEHIND_SHARE = 0.95


def clock_note(rate: float, speed: float) -> str | None:
    """What the status line says of the simulated clock: nothing at the asked speed, its actual
    speed and why when it runs slower (the machine cannot simulate the cluster that fast)."""
    if rate >= CLOCK_BEHIND_SHARE * speed:
        return None
    return f"clock ×{rate:.3g} of ×{speed:g} asked: the simulation cannot keep up"


def service_outcome(status: int | None) -> str:
    """How the planner service ended, in words: the demo stops it with SIGTERM, so a SIGTERM
    status is the clean stop it asked for, not a failure."""
    if status is None:
        return "not started"
    if status in (0, -signal.SIGTERM):
        return "stopped"
    if status == -signal.SIGKILL:
        return f"killed: it did not stop within {STOP_TIMEOUT_S:g} s"
    return f"exited with status {status}"
