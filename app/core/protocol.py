"""The decision protocol of Dynamo's virtual connector, as pure rules.

- While the latest decision is unacknowledged, no new automatic decision is issued, until
  `ack_timeout_s` has passed; then the old one is expired and the new one proceeds.
- An operator override supersedes an unacknowledged decision at once; so does SLA scaling, which
  accounts for the engines still starting itself.
- A target equal to the one in force (pending or succeeded) creates nothing.
- In shadow mode decisions are recorded as `shadow` and never awaited: a new target simply
  follows the last one, and one equal to it creates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from app.core.types import DecisionSource, DecisionStatus, DecisionView, Replicas


class Verdict(StrEnum):
    CREATE = "create"
    UNCHANGED = "unchanged"
    AWAITING_ACK = "awaiting_ack"


@dataclass(frozen=True)
class ProtocolOutcome:
    verdict: Verdict
    reason: str
    # The latest decision's new status when the new one replaces it (superseded or expired).
    retire_latest_as: DecisionStatus | None = None


def ack_overdue(latest: DecisionView | None, now_s: float, ack_timeout_s: float) -> bool:
    return (
        latest is not None
        and latest.status == DecisionStatus.PENDING
        and now_s - latest.created_s >= ack_timeout_s
    )


def judge(
    *,
    latest: DecisionView | None,
    target: Replicas,
    source: DecisionSource,
    now_s: float,
    ack_timeout_s: float,
    await_ack: bool = True,
    shadow: bool = False,
) -> ProtocolOutcome:
    """`await_ack=False` is the advisory connector: nobody acknowledges, so a pending decision
    never holds the next one back. `shadow`: the deployment runs in shadow mode, where the last
    shadow decision is the one a new target is compared with; out of it a shadow decision (made
    before the switch to control) orders nothing, and a new target creates a decision."""
    in_force_statuses = [DecisionStatus.PENDING, DecisionStatus.SUCCEEDED]
    if shadow:
        in_force_statuses.append(DecisionStatus.SHADOW)
    in_force = latest is not None and latest.status in in_force_statuses
    if in_force and latest.replicas == target:  # type: ignore[union-attr]
        return ProtocolOutcome(Verdict.UNCHANGED, f"target equals decision {latest.id} ({latest.status})")  # type: ignore[union-attr]

    if latest is None or latest.status != DecisionStatus.PENDING:
        return ProtocolOutcome(Verdict.CREATE, "no decision awaits acknowledgement")
    if not await_ack:
        return ProtocolOutcome(
            Verdict.CREATE,
            f"advisory: decision {latest.id} is not awaited; superseded",
            DecisionStatus.SUPERSEDED,
        )
    if source == DecisionSource.SLA:
        # SLA scaling counts the engines still starting itself and stabilises its own scale-downs;
        # waiting for them would hold a burst's scale-up back by a whole start-up delay.
        return ProtocolOutcome(
            Verdict.CREATE,
            f"sla scaling supersedes unacknowledged decision {latest.id}",
            DecisionStatus.SUPERSEDED,
        )
    if source == DecisionSource.OVERRIDE:
        return ProtocolOutcome(
            Verdict.CREATE,
            f"override supersedes unacknowledged decision {latest.id}",
            DecisionStatus.SUPERSEDED,
        )
    if ack_overdue(latest, now_s, ack_timeout_s):
        return ProtocolOutcome(
            Verdict.CREATE,
            f"decision {latest.id} unacknowledged for over {ack_timeout_s:g} s: expired",
            DecisionStatus.EXPIRED,
        )
    age_s = now_s - latest.created_s
    return ProtocolOutcome(
        Verdict.AWAITING_ACK,
        f"decision {latest.id} unacknowledged for {age_s:.0f} s (timeout {ack_timeout_s:g} s)",
    )
