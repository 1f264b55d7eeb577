"""Decisions and their acknowledgements.

Every write to a deployment's decisions starts by bumping its `deployment_state` row, which
serialises read-judge-insert per deployment on both backends (row lock on PostgreSQL, the write
lock on SQLite). Decision ids come from that row, so they are strictly increasing, never reused,
and survive restarts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, RowMapping, bindparam, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from app.core.errors import ConflictError, ConflictingFieldError, NotFoundError
from app.core.protocol import ProtocolOutcome, Verdict, ack_overdue, judge
from app.core.types import DecisionSource, DecisionStatus, DecisionView, Replicas, Role
from app.store.models import Decision, DecisionAck, DeploymentState
from app.store.write_versions import note_write

NOTIFY_CHANNEL = "planner_decisions"
WRITES_CHANNEL = "planner_decision_writes"  # every bump of a write_seq, with the new seq

_ROLE_COLUMNS: dict[Role, str] = {"prefill": "num_prefill", "decode": "num_decode", "workers": "num_workers"}


def replicas_of(decision: Decision) -> Replicas:
    return {
        role: getattr(decision, col)
        for role, col in _ROLE_COLUMNS.items()
        if getattr(decision, col) is not None
    }


def view_of(decision: Decision) -> DecisionView:
    return DecisionView(
        id=decision.decision_id,
        replicas=replicas_of(decision),
        source=DecisionSource(decision.source),
        status=DecisionStatus(decision.status),
        created_s=decision.created_at.timestamp(),
    )


def ensure_deployments(session: Session, names: list[str]) -> None:
    """Create the state row of every configured deployment; existing rows (and so the decision
    id sequence) are kept, also when another process creates them at the same moment."""
    insert_fn = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    for name in names:
        session.execute(
            insert_fn(DeploymentState)
            .values(name=name, last_decision_id=0, write_seq=0)
            .on_conflict_do_nothing(index_elements=["name"])
        )


def lock_deployment(session: Session, deployment: str) -> None:
    seq = session.execute(
        update(DeploymentState)
        .where(DeploymentState.name == deployment)
        .values(write_seq=DeploymentState.write_seq + 1)
        .returning(DeploymentState.write_seq)
    ).scalar_one_or_none()
    if seq is None:
        raise NotFoundError(f"deployment {deployment!r} has no state row", field="deployment")
    # Every process's page cache learns the new version without reading it (write_versions.py).
    note_write(session, deployment, seq)
    if session.get_bind().dialect.name == "postgresql":
        payload = json.dumps({"deployment": deployment, "seq": seq})
        session.execute(text("SELECT pg_notify(:c, :p)"), {"c": WRITES_CHANNEL, "p": payload})


def latest_decision(session: Session, deployment: str) -> Decision | None:
    return session.scalars(
        select(Decision)
        .where(Decision.deployment == deployment)
        .order_by(Decision.decision_id.desc())
        .limit(1)
    ).first()


def latest_decision_after(session: Session, deployment: str, after: int) -> Decision | None:
    latest = latest_decision(session, deployment)
    return latest if latest is not None and latest.decision_id > after else None


def get_decision_or_raise(session: Session, deployment: str, decision_id: int) -> Decision:
    decision = session.scalars(
        select(Decision).where(Decision.deployment == deployment, Decision.decision_id == decision_id)
    ).first()
    if decision is None:
        raise NotFoundError(f"deployment {deployment!r} has no decision {decision_id}", field="id")
    return decision


def list_decisions(
    session: Session,
    *,
    deployment: str | None = None,
    after: int | None = None,
    status: DecisionStatus | None = None,
    cursor: int | None = None,
    limit: int = 100,
) -> list[Decision]:
    query = select(Decision).order_by(Decision.pk).limit(limit)
    if deployment is not None:
        query = query.where(Decision.deployment == deployment)
    if after is not None:
        query = query.where(Decision.decision_id > after)
    if status is not None:
        query = query.where(Decision.status == str(status))
    if cursor is not None:
        query = query.where(Decision.pk > cursor)
    return list(session.scalars(query))


# What a decision's response body holds, as plain rows (keys: pk, id, deployment, ...).
DECISION_ROW_COLUMNS = (
    Decision.pk,
    Decision.decision_id.label("id"),
    Decision.deployment,
    Decision.num_prefill,
    Decision.num_decode,
    Decision.num_workers,
    Decision.source,
    Decision.reasons,
    Decision.created_at,
    Decision.status,
    Decision.status_reason,
    Decision.completed_at,
    Decision.observed,
    Decision.message,
    Decision.remove,
    Decision.tick_id,
    Decision.override_id,
)


def decisions_version(session: Session | Connection, deployment: str | None) -> tuple[tuple[str, int], ...]:
    """What changes whenever the decisions of `deployment` (of every deployment, for None) do:
    each write to them first bumps the deployment's `write_seq`, in the same transaction. Equal
    versions mean equal decisions, so a response built from them can be served again."""
    if deployment is None:
        return tuple((name, seq) for name, seq in session.execute(_ALL_VERSIONS))
    return tuple((name, seq) for name, seq in session.execute(_ONE_VERSION, {"name": deployment}))


# Built once: the page polled most runs this on every request.
_ALL_VERSIONS = select(DeploymentState.name, DeploymentState.write_seq).order_by(DeploymentState.name)
_ONE_VERSION = _ALL_VERSIONS.where(DeploymentState.name == bindparam("name"))


def list_decision_rows(
    session: Session | Connection,
    *,
    deployment: str | None = None,
    after: int | None = None,
    status: DecisionStatus | None = None,
    cursor: int | None = None,
    limit: int = 100,
) -> list[RowMapping]:
    """`list_decisions` as mappings of DECISION_ROW_COLUMNS, without building ORM objects."""
    query = select(*DECISION_ROW_COLUMNS).order_by(Decision.pk).limit(limit)
    if deployment is not None:
        query = query.where(Decision.deployment == deployment)
    if after is not None:
        query = query.where(Decision.decision_id > after)
    if status is not None:
        query = query.where(Decision.status == str(status))
    if cursor is not None:
        query = query.where(Decision.pk > cursor)
    return list(session.execute(query).mappings())


@dataclass(frozen=True)
class ProposalResult:
    outcome: ProtocolOutcome
    decision: Decision | None  # the new decision, when one was created
    retired: Decision | None  # the decision it superseded or expired, if any


def _notify(session: Session, deployment: str, decision_id: int) -> None:
    # Delivered on commit, to every planner process LISTENing on the same database.
    if session.get_bind().dialect.name == "postgresql":
        payload = json.dumps({"deployment": deployment, "id": decision_id})
        session.execute(text("SELECT pg_notify(:c, :p)"), {"c": NOTIFY_CHANNEL, "p": payload})


def propose_decision(
    session: Session,
    *,
    deployment: str,
    target: Replicas,
    source: DecisionSource,
    reasons: list[str],
    now: datetime,
    ack_timeout_s: float,
    await_ack: bool = True,
    tick_id: int | None = None,
    override_id: int | None = None,
    remove: Mapping[str, Sequence[str]] | None = None,
    shadow: bool = False,
) -> ProposalResult:
    """Apply the decision protocol to a new target; the caller commits. `shadow`: the deployment
    runs in shadow mode, and the decision is recorded as `shadow` (never applied nor awaited)."""
    lock_deployment(session, deployment)
    latest = latest_decision(session, deployment)
    if latest is not None:
        # The caller may have loaded it before the lock (a tick reads its snapshot first), and
        # the session keeps the attributes it read then: an acknowledgement committed since
        # would be judged as still pending, and superseded.
        session.refresh(latest)
    latest_view = view_of(latest) if latest is not None else None
    outcome = judge(
        latest=latest_view,
        target=target,
        source=source,
        now_s=now.timestamp(),
        ack_timeout_s=ack_timeout_s,
        await_ack=await_ack,
        shadow=shadow,
    )
    if outcome.verdict != Verdict.CREATE:
        return ProposalResult(outcome, None, None)

    state = session.get(DeploymentState, deployment)
    assert state is not None  # lock_deployment proved the row exists
    state.last_decision_id += 1
    if outcome.retire_latest_as is not None and latest is not None:
        # Said on the retired decision: which one replaced it, and why.
        latest.status = str(outcome.retire_latest_as)
        latest.status_reason = f"replaced by decision {state.last_decision_id}: {outcome.reason}"
    decision = Decision(
        deployment=deployment,
        decision_id=state.last_decision_id,
        num_prefill=target.get("prefill"),
        num_decode=target.get("decode"),
        num_workers=target.get("workers"),
        source=str(source),
        reasons=[*reasons, f"protocol: {outcome.reason}"],
        created_at=now,
        status=str(DecisionStatus.SHADOW if shadow else DecisionStatus.PENDING),
        tick_id=tick_id,
        override_id=override_id,
        remove={role: list(ids) for role, ids in remove.items()} if remove else None,
    )
    session.add(decision)
    session.flush()
    _notify(session, deployment, decision.decision_id)
    return ProposalResult(outcome, decision, latest if outcome.retire_latest_as else None)


def expire_overdue(
    session: Session, *, deployment: str, now: datetime, ack_timeout_s: float
) -> Decision | None:
    """Mark the latest decision expired if it has waited for its acknowledgement too long."""
    latest = latest_decision(session, deployment)
    if latest is None or not ack_overdue(view_of(latest), now.timestamp(), ack_timeout_s):
        return None
    lock_deployment(session, deployment)
    session.refresh(latest)
    if latest.status != DecisionStatus.PENDING:
        return None
    latest.status = str(DecisionStatus.EXPIRED)
    latest.status_reason = f"no acknowledgement within {ack_timeout_s:g} s"
    return latest


# A report of what runs while a decision is applied, kept with the acknowledgements.
PROGRESS = "progress"


@dataclass(frozen=True)
class CompletionResult:
    decision: Decision
    outcome: str  # applied | repeated | conflict
    detail: str
    field: str | None = None  # the field of the acknowledgement a conflict is about, if one is


def complete_decision(
    session: Session,
    *,
    deployment: str,
    decision_id: int,
    status: DecisionStatus,
    observed: dict[str, int] | None,
    message: str | None,
    actor_role: str,
    now: datetime,
) -> CompletionResult:
    """Record an acknowledgement. Only a pending decision changes status; repeating the same
    acknowledgement (status and observed replicas; the message may differ) is harmless, and
    one that reports other observed replicas conflicts, since they would be dropped silently;
    every acknowledgement is kept, even one that conflicts."""
    lock_deployment(session, deployment)
    decision = get_decision_or_raise(session, deployment, decision_id)
    field = None
    if decision.status == DecisionStatus.PENDING:
        decision.status = str(status)
        decision.completed_at = now
        decision.observed = observed
        decision.message = message
        outcome, detail = "applied", f"decision {decision_id} {status}"
    elif decision.status == status and (decision.observed or None) == (observed or None):
        outcome, detail = "repeated", f"decision {decision_id} was already {status}"
    elif decision.status == status:
        outcome, field = "conflict", "body.observed"
        detail = (
            f"decision {decision_id} was already acknowledged as {status} with observed "
            f"{_replicas_text(decision.observed)}; this acknowledgement reports {_replicas_text(observed)}"
        )
    else:
        outcome = "conflict"
        why = f" ({decision.status_reason})" if decision.status_reason else ""
        detail = f"decision {decision_id} is {decision.status}{why}; it cannot become {status}"
    session.execute(
        insert(DecisionAck).values(
            decision_pk=decision.pk,
            received_at=now,
            status=str(status),
            observed=observed,
            message=message,
            actor_role=actor_role,
            outcome=outcome,
        )
    )
    return CompletionResult(decision, outcome, detail, field)


def _replicas_text(observed: dict[str, int] | None) -> str:
    return ", ".join(f"{role}={n}" for role, n in sorted(observed.items())) if observed else "nothing"


def complete_decision_or_raise(session: Session, **kwargs) -> Decision:  # type: ignore[no-untyped-def]
    """`complete_decision`, committing the acknowledgement even when it conflicts. A shadow
    decision is not acknowledged at all (nothing is stored): nobody applies it, and observed
    counts on it would read as what runs."""
    shadow = get_decision_or_raise(session, kwargs["deployment"], kwargs["decision_id"])
    if shadow.status == DecisionStatus.SHADOW:
        raise ConflictError(
            f"decision {shadow.decision_id} is a shadow decision: deployment {shadow.deployment} "
            "runs in shadow mode, where the planner's decisions are recorded and never applied; "
            f"report what runs with POST /decisions/{shadow.decision_id}/progress instead"
        )
    result = complete_decision(session, **kwargs)
    session.commit()
    if result.outcome == "conflict":
        if result.field is not None:
            raise ConflictingFieldError(result.field, result.detail)
        raise ConflictError(result.detail)
    return result.decision


def report_observed(
    session: Session,
    *,
    deployment: str,
    decision_id: int,
    observed: dict[str, int],
    message: str | None,
    actor_role: str,
    now: datetime,
) -> Decision:
    """Record what an orchestrator sees running while it applies `decision_id` (engines that
    became ready or left since the order): kept beside the acknowledgements, status `progress`,
    and the decision itself unchanged, whatever its status."""
    decision = get_decision_or_raise(session, deployment, decision_id)
    session.execute(
        insert(DecisionAck).values(
            decision_pk=decision.pk,
            received_at=now,
            status=PROGRESS,
            observed=observed,
            message=message,
            actor_role=actor_role,
            outcome=PROGRESS,
        )
    )
    return decision


@dataclass(frozen=True)
class Observed:
    """The freshest report of what runs: its counts and where they come from."""

    replicas: dict[str, int]
    source: str


def freshest_observed(session: Session, deployment: str) -> Observed | None:
    """What runs, by the newest report an orchestrator sent: observed counts on any
    acknowledgement (also of a superseded or expired decision, which the store keeps though it
    conflicts) or progress report, or a decision acknowledged as succeeded without counts (its
    replicas). None before any."""
    rows = session.execute(
        select(DecisionAck, Decision)
        .join(Decision, DecisionAck.decision_pk == Decision.pk)
        .where(Decision.deployment == deployment)
        .order_by(DecisionAck.id.desc())
        .limit(_RECENT_ACKS)
    ).all()
    for ack, decision in rows:
        # JSON null and an empty mapping both say nothing about what runs.
        succeeded = ack.status == str(DecisionStatus.SUCCEEDED) and ack.outcome == "applied"
        if not ack.observed and not succeeded:
            continue
        kind = f"acknowledgement ({ack.status}, {ack.outcome})"
        if ack.status == PROGRESS:
            kind = "progress report"
        replicas = dict(ack.observed) if ack.observed else replicas_of(decision)
        return Observed(replicas, f"{kind} of decision {decision.decision_id}")
    confirmed = last_acknowledged(session, deployment)
    if confirmed is None:
        return None
    replicas = dict(confirmed.observed or replicas_of(confirmed))
    return Observed(replicas, f"acknowledgement (succeeded) of decision {confirmed.decision_id}")


# The acknowledgements read for the freshest counts: a failed acknowledgement without counts says
# nothing, and a run of them this long is read past to the last succeeded decision.
_RECENT_ACKS = 20


def last_acknowledged(session: Session, deployment: str) -> Decision | None:
    """The latest decision an orchestrator confirmed, for the 'ready replicas' view."""
    return session.scalars(
        select(Decision)
        .where(Decision.deployment == deployment, Decision.status == str(DecisionStatus.SUCCEEDED))
        .order_by(Decision.decision_id.desc())
        .limit(1)
    ).first()
