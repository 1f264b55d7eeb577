"""Decisions and the orchestrator protocol (Dynamo's virtual connector over HTTP)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query, Request, Response
from sqlalchemy import Connection

from app.api.auth import Orchestrator, Viewer
from app.api.convert import ResponseCache, decision_out, encode_decision_page
from app.api.deps import (
    DeploymentsDep,
    EngineDep,
    HubDep,
    NowDep,
    SessionDep,
    deployment_for_decision,
    deployment_or_raise,
)
from app.api.disconnect import ClientGone, unless_client_leaves
from app.api.errors import problem_responses
from app.api.schemas import MAX_ID, CompleteIn, DecisionOut, DecisionPage, Observed, ProgressIn
from app.config import DeploymentConfig
from app.core.errors import InvalidInputError
from app.core.types import DecisionStatus
from app.store import decisions as store
from app.store.db import run_read

router = APIRouter(prefix="/decisions", tags=["decisions"])

_ERRORS = problem_responses(401, 403, 404, 422, 503)
DecisionId = Annotated[int, Path(ge=1, le=MAX_ID, description="Decision id, per deployment")]
DeploymentQuery = Annotated[
    str | None, Query(max_length=63, description="Required when more than one deployment is configured")
]


@router.get("", name="list_decisions", response_model=DecisionPage, responses=_ERRORS)
def list_decisions(
    request: Request,
    engine: EngineDep,
    deployments: DeploymentsDep,
    _: Viewer,
    deployment: Annotated[str | None, Query(max_length=63)] = None,
    after: Annotated[
        int | None, Query(ge=0, le=MAX_ID, description="Only decisions with a greater id")
    ] = None,
    status: Annotated[DecisionStatus | None, Query()] = None,
    cursor: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> DecisionPage:
    if deployment is not None:
        deployment_or_raise(deployments, deployment)
    # Dashboards poll this page (bench/api.py). While the decisions' version stays the same, the
    # page is the one already written: one primary-key read instead of the page's rows. Both reads
    # run on one plain connection in autocommit (run_read: on PostgreSQL, the version read is one
    # round trip), opened and closed here: no ORM session, and one thread-pool hand-off for the
    # request (SessionDep would close its session in a second one).
    # On PostgreSQL the version is usually known without asking (every write is notified,
    # app/store/write_versions.py): a page already written is then served with no round trip.
    cache: ResponseCache = request.app.state.decision_pages
    query = (deployment, after, status, cursor, limit)
    known = request.app.state.decision_versions.version(deployment)
    if known is not None and (page := cache.get((*query, known))) is not None:
        return Response(page, media_type="application/json")  # type: ignore[return-value]

    def read(conn: Connection) -> bytes:
        # The version is read first: rows read after it are at least as new, so a page is never
        # kept under a version newer than its rows.
        key = (*query, store.decisions_version(conn, deployment))
        page = cache.get(key)
        if page is None:
            rows = store.list_decision_rows(
                conn, deployment=deployment, after=after, status=status, cursor=cursor, limit=limit + 1
            )
            more = len(rows) > limit
            rows = rows[:limit]
            page = encode_decision_page(rows, rows[-1]["pk"] if more else None)
            cache.put(key, page)
        return page

    page = run_read(engine, read)
    # As written: not validated again as a DecisionPage (encode_decision_page follows its schema).
    return Response(page, media_type="application/json")  # type: ignore[return-value]


@router.get(
    "/wait",
    name="wait_for_decision",
    response_model=DecisionOut,
    responses={
        204: {"description": "No newer decision before the timeout"},
        **_ERRORS,
        **problem_responses(
            429,
            503,
            _503="This process is stopping (the held request ends at once), or the database is "
            "unavailable; poll again after Retry-After seconds",
        ),
    },
)
async def wait_for_decision(
    request: Request,
    deployments: DeploymentsDep,
    hub: HubDep,
    actor: Orchestrator,
    deployment: DeploymentQuery = None,
    after: Annotated[int, Query(ge=0, le=MAX_ID, description="Last decision id seen; 0 = none")] = 0,
    timeout_s: Annotated[
        float, Query(ge=0, le=300, allow_inf_nan=False, description="How long to hold the request")
    ] = 30.0,
) -> DecisionOut | Response:
    """The latest decision with an id above `after` at once, else the next one stored within
    `timeout_s` (204 when none is). A held request counts against the bounds on held long-polls
    (PLANNER_MAX_HELD_LONGPOLLS, and _PER_CALLER for one token): beyond them, 429. A client that
    hangs up is let go at once."""
    config = deployment_for_decision(deployments, deployment)
    try:
        body = await unless_client_leaves(
            request.receive, hub.wait(config.name, after, timeout_s, caller=actor.name)
        )
    except ClientGone:
        return Response(status_code=204)  # nobody reads it: the connection is closed
    if body is None:
        return Response(status_code=204)
    return Response(body, media_type="application/json")


@router.get("/{id}", name="get_decision", response_model=DecisionOut, responses=_ERRORS)
def get_decision(
    session: SessionDep,
    deployments: DeploymentsDep,
    _: Viewer,
    id: DecisionId,
    deployment: DeploymentQuery = None,
) -> DecisionOut:
    config = deployment_for_decision(deployments, deployment)
    return decision_out(store.get_decision_or_raise(session, config.name, id))


@router.post(
    "/{id}/complete",
    name="complete_decision",
    response_model=DecisionOut,
    responses={
        **_ERRORS,
        **problem_responses(
            400,
            409,
            413,
            _409="The decision is no longer pending, or was acknowledged with another status or "
            "other observed replicas",
        ),
    },
)
def complete_decision(
    request: Request,
    session: SessionDep,
    deployments: DeploymentsDep,
    now: NowDep,
    actor: Orchestrator,
    id: DecisionId,
    body: Annotated[CompleteIn, Body()],
    deployment: DeploymentQuery = None,
) -> DecisionOut:
    config = deployment_for_decision(deployments, deployment)
    observed = _observed(body.observed, config) if body.observed else None
    metrics = request.app.state.metrics
    try:
        decision = store.complete_decision_or_raise(
            session,
            deployment=config.name,
            decision_id=id,
            status=DecisionStatus(body.status),
            observed=observed,
            message=body.message,
            actor_role=actor.role,
            now=now,
        )
    except Exception:
        metrics.acks.labels(config.name, "rejected").inc()
        raise
    metrics.acks.labels(config.name, "accepted").inc()
    latest = store.latest_decision(session, config.name)
    metrics.pending.labels(config.name).set(1 if latest and latest.status == DecisionStatus.PENDING else 0)
    for role, count in (decision.observed or {}).items():
        metrics.ready[role].labels(config.name).set(count)
    return decision_out(decision)


@router.post(
    "/{id}/progress",
    name="report_progress",
    response_model=DecisionOut,
    responses={**_ERRORS, **problem_responses(400, 413)},
)
def report_progress(
    request: Request,
    session: SessionDep,
    deployments: DeploymentsDep,
    now: NowDep,
    actor: Orchestrator,
    id: DecisionId,
    body: Annotated[ProgressIn, Body()],
    deployment: DeploymentQuery = None,
) -> DecisionOut:
    """What runs while the decision is applied (engines that became ready or left since the
    order), as often as it changes: the planner's next tick counts these engines. The decision
    is unchanged, whatever its status; the acknowledgement still ends it."""
    config = deployment_for_decision(deployments, deployment)
    observed = _observed(body.observed, config)
    if not observed:
        raise InvalidInputError("body.observed", "the engines of at least one role")
    decision = store.report_observed(
        session,
        deployment=config.name,
        decision_id=id,
        observed=observed,
        message=body.message,
        actor_role=actor.role,
        now=now,
    )
    session.commit()
    for role, count in observed.items():
        request.app.state.metrics.ready[role].labels(config.name).set(count)
    return decision_out(decision)


def _observed(observed: Observed, config: DeploymentConfig) -> dict[str, int]:
    """The replicas an orchestrator reports, each of a role the deployment has (422 naming it)."""
    counts = observed.model_dump(exclude_none=True)
    for role in counts:
        if role not in config.roles:
            raise InvalidInputError(f"body.observed.{role}", f"a {config.mode} deployment has no {role} role")
    return counts
