"""Deciding while a signal is missing: a signal the worker could not read for several ticks in a
row (the traffic source, a role's forward passes, the connector's inventory; app/workers/
signals.py counts them) is unavailable, and a proposal made without it may not lower a count.

The algorithm still proposes from what it has. Where that would lower a role below what runs (the
decision in force, else the ready engines), the role is held: a missing signal is never read as
less demand. A rise goes through, since it comes from the signals still fresh.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from app.core.types import Role, Stage


def hold_on_missing(
    proposal: Stage, unavailable: Collection[str], current: Mapping[Role, int] | None
) -> Stage:
    """The proposal with every role it would lower held at `current`, while any signal is
    unavailable; unchanged otherwise (or when nothing says what runs)."""
    if not unavailable or proposal.replicas is None or current is None:
        return proposal
    held = {role: max(n, current.get(role, n)) for role, n in proposal.replicas.items()}
    if held == proposal.replicas:
        return proposal
    kept = ", ".join(
        f"{role} {proposal.replicas[role]}->{held[role]}"
        for role in held
        if held[role] != proposal.replicas[role]
    )
    missing = ", ".join(sorted(unavailable))
    return Stage(proposal.name, held, f"{proposal.reason}; held while unavailable: {missing} ({kept})")
