"""The SQL store on both backends: decision ids, the decision protocol, acknowledgements,
overrides with their audit log, the worker lease and tick pagination."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.core.errors import ConflictError, NotFoundError
from app.core.protocol import Verdict
from app.core.types import DecisionSource, DecisionStatus, OverrideAction
from app.store import decisions as dstore
from app.store import overrides as ostore
from app.store import ticks as tstore
from app.store.db import make_engine, make_session_factory
from app.store.models import AuditEntry, Decision, DecisionAck
from app.store.overrides import Actor
from tests.conftest import T0

DEPLOYMENTS = ["demo", "other"]
OPERATOR = Actor(role="operator", name="token:abc")


@pytest.fixture
def sf(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url)
    factory = make_session_factory(engine)
    with factory() as s, s.begin():
        dstore.ensure_deployments(s, DEPLOYMENTS)
    yield factory
    engine.dispose()


def t(seconds: float):
    return T0 + timedelta(seconds=seconds)


def propose(
    sf,
    target,
    *,
    deployment="demo",
    source=DecisionSource.OVERRIDE,
    at=0.0,
    ack_timeout_s=60.0,
    await_ack=True,
):
    """One proposal in its own committed transaction; returns (verdict, new decision id or None)."""
    with sf() as s, s.begin():
        result = dstore.propose_decision(
            s,
            deployment=deployment,
            target=target,
            source=source,
            reasons=["test"],
            now=t(at),
            ack_timeout_s=ack_timeout_s,
            await_ack=await_ack,
        )
        return result.outcome.verdict, (result.decision.decision_id if result.decision else None)


def statuses(sf, deployment="demo") -> dict[int, str]:
    with sf() as s:
        rows = s.scalars(select(Decision).where(Decision.deployment == deployment)).all()
        return {d.decision_id: d.status for d in rows}


def decision(sf, decision_id, deployment="demo") -> Decision:
    with sf() as s:
        return dstore.get_decision_or_raise(s, deployment, decision_id)


def complete(sf, decision_id, status, *, observed=None, at=10.0):
    with sf() as s, s.begin():
        result = dstore.complete_decision(
            s,
            deployment="demo",
            decision_id=decision_id,
            status=status,
            observed=observed,
            message="m",
            actor_role="orchestrator",
            now=t(at),
        )
        return result.outcome, result.decision.status


def acks(sf) -> list[tuple[str, str, str]]:
    with sf() as s:
        rows = s.scalars(select(DecisionAck).order_by(DecisionAck.id)).all()
        return [(a.status, a.outcome, a.actor_role) for a in rows]


def audit_count(sf) -> int:
    with sf() as s:
        return s.scalar(select(func.count()).select_from(AuditEntry))


# --- decision ids ------------------------------------------------------------------------------


def test_decision_ids_start_at_one_and_increase_per_deployment(sf):
    ids = []
    for n in range(1, 5):
        ids.append(propose(sf, {"prefill": n, "decode": n})[1])
    assert ids == [1, 2, 3, 4]
    # another deployment has its own sequence
    assert propose(sf, {"prefill": 1, "decode": 1}, deployment="other")[1] == 1
    assert propose(sf, {"prefill": 2, "decode": 1}, deployment="other")[1] == 2
    assert propose(sf, {"prefill": 9, "decode": 9})[1] == 5
    assert sorted(statuses(sf, "other")) == [1, 2]


def test_decision_ids_continue_after_restart(db_url):
    engine = make_engine(db_url)
    factory = make_session_factory(engine)
    with factory() as s, s.begin():
        dstore.ensure_deployments(s, DEPLOYMENTS)
    assert propose(factory, {"prefill": 1, "decode": 1})[1] == 1
    assert propose(factory, {"prefill": 2, "decode": 1})[1] == 2
    engine.dispose()

    engine = make_engine(db_url)
    factory = make_session_factory(engine)
    with factory() as s, s.begin():
        dstore.ensure_deployments(s, DEPLOYMENTS)  # a restart runs it again; it must keep the sequence
    try:
        assert propose(factory, {"prefill": 3, "decode": 1})[1] == 3
        assert statuses(factory) == {1: "superseded", 2: "superseded", 3: "pending"}
    finally:
        engine.dispose()


def test_a_rolled_back_proposal_leaves_no_gap_or_duplicate(sf):
    assert propose(sf, {"prefill": 1, "decode": 1})[1] == 1
    with sf() as s:
        r = dstore.propose_decision(
            s,
            deployment="demo",
            target={"prefill": 2, "decode": 2},
            source=DecisionSource.OVERRIDE,
            reasons=[],
            now=T0,
            ack_timeout_s=60,
        )
        assert r.decision.decision_id == 2
        s.rollback()
    # the rolled-back id 2 left nothing behind; the next committed decision is 2 and the row set
    # holds no gap or duplicate
    assert propose(sf, {"prefill": 3, "decode": 3})[1] == 2
    assert sorted(statuses(sf)) == [1, 2]


def test_propose_for_unknown_deployment_raises_not_found(sf):
    with pytest.raises(NotFoundError):
        propose(sf, {"prefill": 1, "decode": 1}, deployment="nope")


# --- the decision protocol --------------------------------------------------------------------


def test_unchanged_target_creates_no_decision(sf):
    assert propose(sf, {"prefill": 3, "decode": 5}) == (Verdict.CREATE, 1)
    assert propose(sf, {"prefill": 3, "decode": 5}, at=5) == (Verdict.UNCHANGED, None)
    complete(sf, 1, DecisionStatus.SUCCEEDED)
    # equal to the succeeded decision: still nothing
    assert propose(sf, {"prefill": 3, "decode": 5}, source=DecisionSource.THROUGHPUT, at=20) == (
        Verdict.UNCHANGED,
        None,
    )
    assert statuses(sf) == {1: "succeeded"}


def test_automatic_decision_waits_for_ack_then_expires_the_old_one(sf):
    assert propose(sf, {"prefill": 2, "decode": 2}, source=DecisionSource.THROUGHPUT) == (Verdict.CREATE, 1)
    # still within ack_timeout_s=60: no new automatic decision, no row
    assert propose(sf, {"prefill": 4, "decode": 2}, source=DecisionSource.THROUGHPUT, at=30) == (
        Verdict.AWAITING_ACK,
        None,
    )
    assert propose(sf, {"prefill": 4, "decode": 2}, source=DecisionSource.LOAD, at=59) == (
        Verdict.AWAITING_ACK,
        None,
    )
    assert statuses(sf) == {1: "pending"}
    # past the timeout: the old one expires and the new one is created
    assert propose(sf, {"prefill": 4, "decode": 2}, source=DecisionSource.THROUGHPUT, at=61) == (
        Verdict.CREATE,
        2,
    )
    assert statuses(sf) == {1: "expired", 2: "pending"}
    old = decision(sf, 1)
    assert old.status_reason == "replaced by decision 2: decision 1 unacknowledged for over 60 s: expired"
    assert old.completed_at is None


def test_automatic_decision_after_ack_is_created_at_once(sf):
    propose(sf, {"prefill": 2, "decode": 2}, source=DecisionSource.THROUGHPUT)
    complete(sf, 1, DecisionStatus.FAILED, at=1)
    assert propose(sf, {"prefill": 3, "decode": 2}, source=DecisionSource.THROUGHPUT, at=2) == (
        Verdict.CREATE,
        2,
    )
    assert statuses(sf) == {1: "failed", 2: "pending"}


def test_override_supersedes_a_pending_decision_at_once(sf):
    propose(sf, {"prefill": 2, "decode": 2}, source=DecisionSource.THROUGHPUT)
    assert propose(sf, {"prefill": 3, "decode": 5}, source=DecisionSource.OVERRIDE, at=1) == (
        Verdict.CREATE,
        2,
    )
    assert statuses(sf) == {1: "superseded", 2: "pending"}
    assert (
        decision(sf, 1).status_reason
        == "replaced by decision 2: override supersedes unacknowledged decision 1"
    )


def test_a_proposal_judges_the_latest_decision_as_committed_under_the_lock(sf):
    # A tick reads its snapshot (the latest decision, pending) before it proposes; the
    # orchestrator's acknowledgement commits in between. The proposal must see it succeeded: an
    # SLA proposal supersedes only a decision still pending.
    propose(sf, {"prefill": 2, "decode": 2}, source=DecisionSource.SLA)
    with sf() as s, s.begin():
        seen = dstore.latest_decision(s, "demo")
        assert seen is not None and seen.status == "pending"
        assert complete(sf, 1, DecisionStatus.SUCCEEDED, at=1) == ("applied", "succeeded")
        result = dstore.propose_decision(
            s,
            deployment="demo",
            target={"prefill": 3, "decode": 2},
            source=DecisionSource.SLA,
            reasons=["test"],
            now=t(2),
            ack_timeout_s=60.0,
        )
        assert (result.outcome.verdict, result.outcome.reason, result.retired) == (
            Verdict.CREATE,
            "no decision awaits acknowledgement",
            None,
        )
    assert statuses(sf) == {1: "succeeded", 2: "pending"}


def test_await_ack_false_never_waits(sf):
    propose(sf, {"prefill": 2, "decode": 2}, source=DecisionSource.THROUGHPUT, await_ack=False)
    assert propose(
        sf, {"prefill": 3, "decode": 2}, source=DecisionSource.THROUGHPUT, at=1, await_ack=False
    ) == (
        Verdict.CREATE,
        2,
    )
    assert statuses(sf) == {1: "superseded", 2: "pending"}
    # the stored source is still the automatic one
    assert decision(sf, 2).source == "throughput"


# --- acknowledgements ---------------------------------------------------------------------------


def test_complete_applies_repeats_and_conflicts_and_keeps_every_ack(sf):
    propose(sf, {"prefill": 3, "decode": 5})
    assert complete(sf, 1, DecisionStatus.SUCCEEDED, observed={"prefill": 3, "decode": 5}, at=7) == (
        "applied",
        "succeeded",
    )
    d = decision(sf, 1)
    assert (d.status, d.completed_at, d.observed, d.message) == (
        "succeeded",
        t(7),
        {"prefill": 3, "decode": 5},
        "m",
    )
    assert acks(sf) == [("succeeded", "applied", "orchestrator")]

    assert complete(sf, 1, DecisionStatus.SUCCEEDED, observed={"prefill": 3, "decode": 5}, at=8) == (
        "repeated",
        "succeeded",
    )
    # The same status with other observed replicas would be dropped silently: a conflict.
    assert complete(sf, 1, DecisionStatus.SUCCEEDED, observed={"prefill": 1, "decode": 1}, at=8) == (
        "conflict",
        "succeeded",
    )
    d = decision(sf, 1)
    assert (d.completed_at, d.observed) == (t(7), {"prefill": 3, "decode": 5})  # unchanged
    assert acks(sf) == [
        ("succeeded", "applied", "orchestrator"),
        ("succeeded", "repeated", "orchestrator"),
        ("succeeded", "conflict", "orchestrator"),
    ]

    assert complete(sf, 1, DecisionStatus.FAILED, at=9) == ("conflict", "succeeded")
    assert decision(sf, 1).status == "succeeded"
    assert acks(sf)[-1] == ("failed", "conflict", "orchestrator")


def test_complete_or_raise_commits_the_conflicting_ack_then_raises(sf):
    propose(sf, {"prefill": 3, "decode": 5})
    propose(sf, {"prefill": 4, "decode": 5}, at=1)  # 1 is superseded
    with sf() as s, pytest.raises(ConflictError) as err:
        dstore.complete_decision_or_raise(
            s,
            deployment="demo",
            decision_id=1,
            status=DecisionStatus.SUCCEEDED,
            observed=None,
            message=None,
            actor_role="orchestrator",
            now=t(2),
        )
    assert "superseded" in err.value.detail
    assert acks(sf) == [("succeeded", "conflict", "orchestrator")]


def test_complete_unknown_decision_raises_not_found(sf):
    propose(sf, {"prefill": 3, "decode": 5})
    with pytest.raises(NotFoundError):
        complete(sf, 2, DecisionStatus.SUCCEEDED)
    with pytest.raises(NotFoundError):
        with sf() as s, s.begin():
            dstore.complete_decision(
                s,
                deployment="other",
                decision_id=1,
                status=DecisionStatus.SUCCEEDED,
                observed=None,
                message=None,
                actor_role="orchestrator",
                now=T0,
            )
    assert acks(sf) == []


def test_expire_overdue(sf):
    with sf() as s, s.begin():
        assert dstore.expire_overdue(s, deployment="demo", now=T0, ack_timeout_s=60) is None  # no decision
    propose(sf, {"prefill": 3, "decode": 5})
    with sf() as s, s.begin():
        assert dstore.expire_overdue(s, deployment="demo", now=t(59), ack_timeout_s=60) is None
    assert statuses(sf) == {1: "pending"}
    with sf() as s, s.begin():
        expired = dstore.expire_overdue(s, deployment="demo", now=t(61), ack_timeout_s=60)
        assert expired is not None and expired.decision_id == 1
    d = decision(sf, 1)
    assert d.status == "expired"
    assert d.status_reason == "no acknowledgement within 60 s"
    with sf() as s, s.begin():
        assert dstore.expire_overdue(s, deployment="demo", now=t(120), ack_timeout_s=60) is None  # only once


def test_expire_overdue_leaves_acknowledged_decisions_alone(sf):
    propose(sf, {"prefill": 3, "decode": 5})
    complete(sf, 1, DecisionStatus.SUCCEEDED, at=1)
    with sf() as s, s.begin():
        assert dstore.expire_overdue(s, deployment="demo", now=t(3600), ack_timeout_s=60) is None
    assert statuses(sf) == {1: "succeeded"}


# --- overrides and the audit log ------------------------------------------------------------------


def override(sf, action, params=None, *, at=0.0, expires_in_s=None, actor=OPERATOR, deployment="demo"):
    with sf() as s, s.begin():
        o = ostore.create_override(
            s,
            deployment=deployment,
            action=action,
            params=params or {},
            reason=f"{action} test",
            expires_at=t(at + expires_in_s) if expires_in_s else None,
            actor=actor,
            now=t(at),
        )
        return o.id


def get_override(sf, override_id):
    with sf() as s:
        return ostore.get_override_or_raise(s, override_id)


def active(sf, at=0.0, deployment="demo"):
    with sf() as s:
        return ostore.active_overrides(s, deployment, t(at))


def test_second_pin_ends_the_first(sf):
    first = override(sf, OverrideAction.PIN, {"prefill": 2, "decode": 2})
    second = override(sf, OverrideAction.PIN, {"prefill": 3, "decode": 5}, at=5)
    old = get_override(sf, first)
    assert old.ended_at == t(5)
    assert old.ended_reason == f"replaced by override #{second}"
    a = active(sf, at=6)
    assert (a.pin_id, a.pin) == (second, {"prefill": 3, "decode": 5})


def test_bounds_replace_bounds_and_leave_the_pin(sf):
    pin = override(sf, OverrideAction.PIN, {"prefill": 2, "decode": 2})
    first = override(sf, OverrideAction.BOUNDS, {"max_prefill": 4})
    second = override(sf, OverrideAction.BOUNDS, {"min_decode": 2, "max_decode": 6}, at=1)
    assert get_override(sf, first).ended_reason == f"replaced by override #{second}"
    assert get_override(sf, pin).ended_at is None
    a = active(sf, at=2)
    assert (a.pin_id, a.bounds_id, a.bounds, a.pause_id) == (
        pin,
        second,
        {"decode": {"min": 2, "max": 6}},
        None,
    )


def test_pause_and_resume(sf):
    pause = override(sf, OverrideAction.PAUSE)
    assert active(sf, at=1).pause_id == pause
    resume = override(sf, OverrideAction.RESUME, at=2)
    assert get_override(sf, pause).ended_reason == f"ended by override #{resume}"
    r = get_override(sf, resume)
    assert r.ended_at == t(2)  # resume is an event
    assert active(sf, at=3).paused is False


def test_resume_without_pause_is_a_conflict(sf):
    with pytest.raises(ConflictError):
        override(sf, OverrideAction.RESUME)
    assert audit_count(sf) == 0
    with sf() as s:
        assert ostore.list_overrides(s, deployment="demo", include_inactive=True, now=T0) == []


def test_override_expiry(sf):
    pin = override(sf, OverrideAction.PIN, {"prefill": 2, "decode": 2}, expires_in_s=60)
    assert active(sf, at=0).pin_id == pin
    assert active(sf, at=59).pin_id == pin
    assert active(sf, at=60).pin is None
    assert active(sf, at=61).pin is None
    with sf() as s:
        assert [
            o.id for o in ostore.list_overrides(s, deployment="demo", include_inactive=False, now=t(30))
        ] == [pin]
        assert ostore.list_overrides(s, deployment="demo", include_inactive=False, now=t(61)) == []
        assert [
            o.id for o in ostore.list_overrides(s, deployment="demo", include_inactive=True, now=t(61))
        ] == [pin]
    assert get_override(sf, pin).ended_at is None  # expiry is not an end


def test_overrides_are_per_deployment(sf):
    override(sf, OverrideAction.PAUSE, deployment="other")
    assert active(sf).paused is False
    assert active(sf, deployment="other").paused is True


def test_every_override_write_adds_one_audit_row_with_the_actor(sf):
    viewer_like = Actor(role="orchestrator", name="token:def")  # the store records whatever role it is given
    writes = [
        (OverrideAction.PIN, {"prefill": 2, "decode": 2}, OPERATOR),
        (OverrideAction.PIN, {"prefill": 3, "decode": 2}, OPERATOR),
        (OverrideAction.BOUNDS, {"max_prefill": 4}, viewer_like),
        (OverrideAction.PAUSE, {}, OPERATOR),
        (OverrideAction.RESUME, {}, OPERATOR),
    ]
    ids = []
    for n, (action, params, actor) in enumerate(writes, start=1):
        ids.append(override(sf, action, params, at=n, actor=actor))
        assert audit_count(sf) == n
    with sf() as s, s.begin():
        ostore.end_override(s, override_id=ids[0 + 2], actor=OPERATOR, now=t(10))  # end the bounds
    assert audit_count(sf) == len(writes) + 1
    with sf() as s, s.begin():
        ostore.end_override(s, override_id=ids[2], actor=OPERATOR, now=t(11))  # already ended: no audit
    assert audit_count(sf) == len(writes) + 1

    with sf() as s:
        rows = list(reversed(ostore.list_audit(s, deployment="demo")))
    assert [(a.action, a.actor_role, a.actor, a.details["override_id"]) for a in rows] == [
        ("override.pin", "operator", "token:abc", ids[0]),
        ("override.pin", "operator", "token:abc", ids[1]),
        ("override.bounds", "orchestrator", "token:def", ids[2]),
        ("override.pause", "operator", "token:abc", ids[3]),
        ("override.resume", "operator", "token:abc", ids[4]),
        ("override.delete", "operator", "token:abc", ids[2]),
    ]
    assert rows[1].details["ended_overrides"] == [ids[0]]
    assert rows[4].details["ended_overrides"] == [ids[3]]
    assert [a.at for a in rows] == [t(1), t(2), t(3), t(4), t(5), t(10)]


def test_end_unknown_override_raises_not_found(sf):
    with pytest.raises(NotFoundError), sf() as s, s.begin():
        ostore.end_override(s, override_id=99, actor=OPERATOR, now=T0)


# --- worker lease -------------------------------------------------------------------------------


def lease(sf, holder, at, ttl_s=30.0, deployment="demo"):
    with sf() as s, s.begin():
        return tstore.acquire_lease(s, deployment=deployment, holder=holder, now=t(at), ttl_s=ttl_s)


def test_lease_holder_keeps_it_until_it_expires(sf):
    assert lease(sf, "A", 0) is True
    assert lease(sf, "B", 10) is False
    assert lease(sf, "A", 20) is True  # renew: now valid until 50
    assert lease(sf, "B", 40) is False
    assert lease(sf, "B", 49) is False
    with sf() as s:
        assert tstore.lease_holder(s, "demo") == "A"
    assert lease(sf, "B", 51) is True
    assert lease(sf, "A", 52) is False
    with sf() as s:
        assert tstore.lease_holder(s, "demo") == "B"
    # leases are per deployment
    assert lease(sf, "A", 52, deployment="other") is True


def test_released_lease_can_be_taken_at_once(sf):
    assert lease(sf, "A", 0) is True
    with sf() as s, s.begin():
        tstore.release_lease(s, deployment="demo", holder="B")  # not the holder: no effect
    assert lease(sf, "B", 1) is False
    with sf() as s, s.begin():
        tstore.release_lease(s, deployment="demo", holder="A")
    assert lease(sf, "B", 1) is True


# --- tick diagnostics -----------------------------------------------------------------------------


@pytest.fixture
def ticks(sf) -> list[int]:
    """Ten ticks of demo at T0, T0+10 s, ... and one of other in between."""
    ids = []
    with sf() as s, s.begin():
        for n in range(10):
            ids.append(tstore.add_tick(s, deployment="demo", at=t(10 * n), record={"n": n}).id)
            if n == 4:
                tstore.add_tick(s, deployment="other", at=t(10 * n), record={"n": "other"})
    return ids


def list_ticks(sf, **kwargs):
    args = {"deployment": "demo", "since": None, "until": None, "before": None, "limit": 100} | kwargs
    with sf() as s:
        return [tk.record["n"] for tk in tstore.list_ticks(s, **args)]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        pytest.param({}, list(range(10)), id="all"),
        pytest.param({"deployment": None}, [0, 1, 2, 3, 4, "other", 5, 6, 7, 8, 9], id="all-deployments"),
        pytest.param({"deployment": "other"}, ["other"], id="other-deployment"),
        pytest.param({"since": t(30)}, [3, 4, 5, 6, 7, 8, 9], id="since-inclusive"),
        pytest.param({"until": t(30)}, [0, 1, 2], id="until-exclusive"),
        pytest.param({"since": t(25), "until": t(55)}, [3, 4, 5], id="since-until"),
        pytest.param({"since": t(1000)}, [], id="since-after-all"),
        pytest.param({"limit": 3}, [7, 8, 9], id="limit-keeps-the-newest"),
    ],
)
def test_list_ticks_filters(sf, ticks, filters, expected):
    assert list_ticks(sf, **filters) == expected


def test_list_ticks_pages_back_from_the_newest(sf, ticks):
    pages, before = [], None
    while True:
        with sf() as s:
            rows = tstore.list_ticks(s, deployment="demo", since=t(10), until=None, before=before, limit=4)
        if not rows:
            break
        pages.append([r.record["n"] for r in rows])
        before = rows[0].id
    assert pages == [[6, 7, 8, 9], [2, 3, 4, 5], [1]]


def test_last_tick(sf, ticks):
    with sf() as s:
        assert tstore.last_tick(s, "demo").record == {"n": 9}
        assert tstore.last_tick(s, "other").record == {"n": "other"}
        assert tstore.last_tick(s, "nope") is None
