"""Engines that never come: an order whose engines are not ready within a bound is a shortfall
of capacity (no GPU free, a quota, an image that does not pull), not a slow start.

Without this, an order that cannot be met is read as a lead that grows without end (learners.py
counts an open order's age as the lead), every forecast looks further ahead, and the planner goes
on asking for what the cluster cannot give. With it:

- an order still open after `wait_bound_s` (three leads, at least ten minutes) is closed as a
  shortfall: the role is capped at the engines that did become ready, so the ordered ones that
  cannot start are given back, and the lead counts the order's age only up to the bound;
- the role asks again after a backoff (one bound, then two, then four at most): the cluster may
  have freed GPUs; an order that then fails again doubles the wait;
- an order that completes, or a wish no higher than what runs, ends the shortfall.
"""

from __future__ import annotations

from typing import NamedTuple

from app.core.types import Role

# How long an order may take before its engines are taken not to come: a few leads (a start-up
# slower than the lead measured so far is still a start-up), and never under ten minutes (pulling
# a large image or loading weights on a cold node takes minutes without anything being wrong).
WAIT_LEADS = 3.0
WAIT_MIN_S = 600.0
# The retries' backoff, in bounds: 1, 2, 4, then 4 again; GPUs freed later are found within four
# bounds, and a cluster that stays full is asked at most once in that time.
MAX_BACKOFF_BOUNDS = 4.0


class Shortfall(NamedTuple):
    """A role's order that did not become ready within the bound."""

    since_s: float  # when the order passed the bound
    ready: int  # engines ready then: what the role is capped at until the retry
    asked: int  # the order's count
    retry_s: float  # from when the role may ask for more again
    attempts: int  # orders that failed in a row


def wait_bound_s(lead_s: float) -> float:
    """How long an order's engines may take, from the lead as measured (or estimated)."""
    return max(WAIT_LEADS * lead_s, WAIT_MIN_S)


def record_shortfall(
    previous: Shortfall | None, now_s: float, ready: int, asked: int, bound_s: float
) -> Shortfall:
    """The shortfall of an order that passed the bound at `now_s`; the backoff doubles with each
    order that fails in a row."""
    attempts = (previous.attempts if previous is not None else 0) + 1
    backoff_s = bound_s * min(2.0 ** (attempts - 1), MAX_BACKOFF_BOUNDS)
    return Shortfall(now_s, ready, asked, now_s + backoff_s, attempts)


def capped(target: int, ready: int, shortfall: Shortfall | None, now_s: float) -> int | None:
    """The role's count under a shortfall: no more than what is ready (or was, when the order
    failed) until the retry; None when no cap applies."""
    if shortfall is None or now_s >= shortfall.retry_s:
        return None
    cap = max(shortfall.ready, ready)
    return cap if target > cap else None


def summary(shortfalls: dict[Role, Shortfall], now_s: float) -> dict[str, dict[str, float | int]]:
    """The tick record's account: per role, what was asked, what came, and when it asks again."""
    return {
        role: {
            "asked": s.asked,
            "ready": s.ready,
            "since_s": round(s.since_s, 1),
            "retry_in_s": round(max(0.0, s.retry_s - now_s), 1),
            "attempts": s.attempts,
        }
        for role, s in shortfalls.items()
    }
