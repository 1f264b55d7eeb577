"""The decision protocol of the virtual connector as pure rules: `judge` and `ack_overdue`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from app.core.protocol import ProtocolOutcome, Verdict, ack_overdue, judge
from app.core.types import DecisionSource, DecisionStatus, DecisionView, Replicas

T0_S = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC).timestamp()
TIMEOUT_S = 1800.0
OLD: Replicas = {"prefill": 2, "decode": 4}
NEW: Replicas = {"prefill": 3, "decode": 5}

S = DecisionStatus
SRC = DecisionSource


def decision(
    status: DecisionStatus, *, replicas: Replicas = OLD, age_s: float = 60.0, id: int = 7
) -> DecisionView:
    """Decision `id`, created `age_s` seconds before T0_S."""
    return DecisionView(
        id=id,
        replicas=dict(replicas),
        source=SRC.THROUGHPUT,
        status=status,
        created_s=T0_S - age_s,
    )


@dataclass(frozen=True)
class JudgeCase:
    name: str
    why: str
    latest: DecisionView | None
    target: Replicas
    source: DecisionSource
    expected: ProtocolOutcome


JUDGE_CASES = [
    JudgeCase(
        "no_latest_decision",
        "the first decision of a deployment is always created",
        None,
        NEW,
        SRC.THROUGHPUT,
        ProtocolOutcome(Verdict.CREATE, "no decision awaits acknowledgement"),
    ),
    JudgeCase(
        "no_latest_decision_override",
        "an override on a fresh deployment is created too",
        None,
        NEW,
        SRC.OVERRIDE,
        ProtocolOutcome(Verdict.CREATE, "no decision awaits acknowledgement"),
    ),
    JudgeCase(
        "unchanged_vs_pending",
        "the pending decision already asks for this target",
        decision(S.PENDING),
        OLD,
        SRC.THROUGHPUT,
        ProtocolOutcome(Verdict.UNCHANGED, "target equals decision 7 (pending)"),
    ),
    JudgeCase(
        "unchanged_vs_succeeded",
        "the cluster already runs this target",
        decision(S.SUCCEEDED, age_s=99_999),
        OLD,
        SRC.LOAD,
        ProtocolOutcome(Verdict.UNCHANGED, "target equals decision 7 (succeeded)"),
    ),
    JudgeCase(
        "unchanged_override_vs_pending",
        "an override equal to the pending target adds nothing",
        decision(S.PENDING),
        OLD,
        SRC.OVERRIDE,
        ProtocolOutcome(Verdict.UNCHANGED, "target equals decision 7 (pending)"),
    ),
    JudgeCase(
        "same_target_after_failed",
        "a failed decision is not in force: asking again is new",
        decision(S.FAILED),
        OLD,
        SRC.THROUGHPUT,
        ProtocolOutcome(Verdict.CREATE, "no decision awaits acknowledgement"),
    ),
    JudgeCase(
        "same_target_after_expired",
        "an expired decision was never applied: reissue it",
        decision(S.EXPIRED),
        OLD,
        SRC.THROUGHPUT,
        ProtocolOutcome(Verdict.CREATE, "no decision awaits acknowledgement"),
    ),
    JudgeCase(
        "same_target_after_superseded",
        "a superseded decision is not in force",
        decision(S.SUPERSEDED),
        OLD,
        SRC.LOAD,
        ProtocolOutcome(Verdict.CREATE, "no decision awaits acknowledgement"),
    ),
    JudgeCase(
        "new_target_after_succeeded",
        "nothing awaits acknowledgement, so a change is issued",
        decision(S.SUCCEEDED),
        NEW,
        SRC.THROUGHPUT,
        ProtocolOutcome(Verdict.CREATE, "no decision awaits acknowledgement"),
    ),
    JudgeCase(
        "new_target_after_failed",
        "a failed decision does not hold the next one",
        decision(S.FAILED),
        NEW,
        SRC.LOAD,
        ProtocolOutcome(Verdict.CREATE, "no decision awaits acknowledgement"),
    ),
    JudgeCase(
        "automatic_while_pending_young",
        "no new automatic decision while the latest is unacknowledged",
        decision(S.PENDING, age_s=60),
        NEW,
        SRC.THROUGHPUT,
        ProtocolOutcome(Verdict.AWAITING_ACK, "decision 7 unacknowledged for 60 s (timeout 1800 s)"),
    ),
    JudgeCase(
        "load_while_pending_just_created",
        "age zero is young",
        decision(S.PENDING, age_s=0, id=12),
        NEW,
        SRC.LOAD,
        ProtocolOutcome(Verdict.AWAITING_ACK, "decision 12 unacknowledged for 0 s (timeout 1800 s)"),
    ),
    JudgeCase(
        "automatic_while_pending_just_below_timeout",
        "one millisecond before the timeout still waits",
        decision(S.PENDING, age_s=TIMEOUT_S - 0.001),
        NEW,
        SRC.THROUGHPUT,
        ProtocolOutcome(Verdict.AWAITING_ACK, "decision 7 unacknowledged for 1800 s (timeout 1800 s)"),
    ),
    JudgeCase(
        "automatic_pending_exactly_at_timeout",
        "at ack_timeout_s the old decision is expired",
        decision(S.PENDING, age_s=TIMEOUT_S),
        NEW,
        SRC.THROUGHPUT,
        ProtocolOutcome(
            Verdict.CREATE,
            "decision 7 unacknowledged for over 1800 s: expired",
            S.EXPIRED,
        ),
    ),
    JudgeCase(
        "automatic_pending_over_timeout",
        "long past the timeout the old decision is expired",
        decision(S.PENDING, age_s=TIMEOUT_S * 3),
        NEW,
        SRC.LOAD,
        ProtocolOutcome(
            Verdict.CREATE,
            "decision 7 unacknowledged for over 1800 s: expired",
            S.EXPIRED,
        ),
    ),
    JudgeCase(
        "override_while_pending_young",
        "an operator override supersedes an unacknowledged decision at once",
        decision(S.PENDING, age_s=1),
        NEW,
        SRC.OVERRIDE,
        ProtocolOutcome(
            Verdict.CREATE,
            "override supersedes unacknowledged decision 7",
            S.SUPERSEDED,
        ),
    ),
    JudgeCase(
        "override_while_pending_overdue",
        "an override supersedes; it does not wait for the expiry rule",
        decision(S.PENDING, age_s=TIMEOUT_S * 2),
        NEW,
        SRC.OVERRIDE,
        ProtocolOutcome(
            Verdict.CREATE,
            "override supersedes unacknowledged decision 7",
            S.SUPERSEDED,
        ),
    ),
    JudgeCase(
        "override_after_succeeded",
        "nothing to supersede when the latest was acknowledged",
        decision(S.SUCCEEDED),
        NEW,
        SRC.OVERRIDE,
        ProtocolOutcome(Verdict.CREATE, "no decision awaits acknowledgement"),
    ),
    JudgeCase(
        "agg_mode_unchanged",
        "workers-only targets compare the same way",
        decision(S.SUCCEEDED, replicas={"workers": 4}),
        {"workers": 4},
        SRC.THROUGHPUT,
        ProtocolOutcome(Verdict.UNCHANGED, "target equals decision 7 (succeeded)"),
    ),
    JudgeCase(
        "one_role_differs",
        "a change in one role alone is a new target",
        decision(S.PENDING),
        {"prefill": 2, "decode": 5},
        SRC.THROUGHPUT,
        ProtocolOutcome(Verdict.AWAITING_ACK, "decision 7 unacknowledged for 60 s (timeout 1800 s)"),
    ),
]


@pytest.mark.parametrize("case", JUDGE_CASES, ids=lambda c: c.name)
def test_judge(case: JudgeCase) -> None:
    outcome = judge(
        latest=case.latest, target=case.target, source=case.source, now_s=T0_S, ack_timeout_s=TIMEOUT_S
    )
    assert outcome == case.expected, case.why


@dataclass(frozen=True)
class ShadowCase:
    name: str
    why: str
    latest: DecisionView | None
    target: Replicas
    shadow: bool
    expected: ProtocolOutcome


SHADOW_CASES = [
    ShadowCase(
        "shadow_same_target",
        "in shadow mode the last shadow decision is what a target is compared with: the same one "
        "records nothing new",
        decision(S.SHADOW),
        OLD,
        True,
        ProtocolOutcome(Verdict.UNCHANGED, "target equals decision 7 (shadow)"),
    ),
    ShadowCase(
        "shadow_new_target",
        "a shadow decision awaits nobody: a new target follows it at once, and it stays as it was",
        decision(S.SHADOW),
        NEW,
        True,
        ProtocolOutcome(Verdict.CREATE, "no decision awaits acknowledgement"),
    ),
    ShadowCase(
        "control_after_shadow",
        "switched to control, a shadow decision ordered nothing that runs: the same target is a new "
        "decision, which the orchestrator or the connector then applies",
        decision(S.SHADOW),
        OLD,
        False,
        ProtocolOutcome(Verdict.CREATE, "no decision awaits acknowledgement"),
    ),
]


@pytest.mark.parametrize("case", SHADOW_CASES, ids=lambda c: c.name)
def test_judge_in_shadow_mode(case: ShadowCase) -> None:
    outcome = judge(
        latest=case.latest,
        target=case.target,
        source=SRC.SLA,
        now_s=T0_S,
        ack_timeout_s=TIMEOUT_S,
        await_ack=not case.shadow,
        shadow=case.shadow,
    )
    assert outcome == case.expected, case.why


def test_judge_does_not_mutate_its_inputs() -> None:
    latest = decision(S.PENDING)
    target = dict(NEW)
    judge(latest=latest, target=target, source=SRC.OVERRIDE, now_s=T0_S, ack_timeout_s=TIMEOUT_S)
    assert (latest.status, latest.replicas, target) == (S.PENDING, OLD, NEW)


@dataclass(frozen=True)
class OverdueCase:
    name: str
    why: str
    latest: DecisionView | None
    timeout_s: float
    expected: bool


OVERDUE_CASES = [
    OverdueCase("no_decision", "nothing to wait for", None, TIMEOUT_S, False),
    OverdueCase("pending_young", "well within the timeout", decision(S.PENDING, age_s=60), TIMEOUT_S, False),
    OverdueCase(
        "pending_just_below",
        "a millisecond short of the timeout",
        decision(S.PENDING, age_s=TIMEOUT_S - 0.001),
        TIMEOUT_S,
        False,
    ),
    OverdueCase(
        "pending_exactly_at",
        "the timeout is inclusive",
        decision(S.PENDING, age_s=TIMEOUT_S),
        TIMEOUT_S,
        True,
    ),
    OverdueCase(
        "pending_over", "past the timeout", decision(S.PENDING, age_s=TIMEOUT_S + 1), TIMEOUT_S, True
    ),
    OverdueCase(
        "pending_short_timeout", "the timeout given is used", decision(S.PENDING, age_s=10), 5.0, True
    ),
    OverdueCase(
        "succeeded_old",
        "an acknowledged decision is never overdue",
        decision(S.SUCCEEDED, age_s=TIMEOUT_S * 10),
        TIMEOUT_S,
        False,
    ),
    OverdueCase(
        "failed_old", "acknowledged as failed", decision(S.FAILED, age_s=TIMEOUT_S * 10), TIMEOUT_S, False
    ),
    OverdueCase(
        "expired_old", "already expired", decision(S.EXPIRED, age_s=TIMEOUT_S * 10), TIMEOUT_S, False
    ),
    OverdueCase(
        "superseded_old",
        "already superseded",
        decision(S.SUPERSEDED, age_s=TIMEOUT_S * 10),
        TIMEOUT_S,
        False,
    ),
]


@pytest.mark.parametrize("case", OVERDUE_CASES, ids=lambda c: c.name)
def test_ack_overdue(case: OverdueCase) -> None:
    assert ack_overdue(case.latest, T0_S, case.timeout_s) is case.expected, case.why
