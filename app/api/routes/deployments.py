"""Configured deployments and their current state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from sqlalchemy.orm import Session

from app.api.auth import Viewer
from app.api.convert import decision_out, override_out
from app.api.deps import DeploymentsDep, NowDep, SessionDep, deployment_or_raise
from app.api.errors import problem_responses
from app.api.fleet_view import deployment_fleet
from app.api.schemas import DeploymentOut, RoleSummary, ShadowOut, ShadowSideOut, WorkerState
from app.config import DeploymentConfig
from app.core.errors import ConflictError
from app.reports.shadow import DEFAULT_WINDOW_S, MAX_WINDOW_S, Side, read_shadow_report
from app.store import decisions as decision_store
from app.store import overrides as override_store
from app.store import settings as settings_store

router = APIRouter(prefix="/deployments", tags=["deployments"])


def _summary(request: Request, session: Session, config: DeploymentConfig, now: datetime) -> DeploymentOut:
    config = settings_store.effective(session, config)  # the live settings as the worker runs them
    latest = decision_store.latest_decision(session, config.name)
    observed = decision_store.freshest_observed(session, config.name)
    active = override_store.list_overrides(session, deployment=config.name, include_inactive=False, now=now)
    worker = request.app.state.workers[config.name]
    deployments = request.app.state.deployments
    return DeploymentOut(
        name=config.name,
        mode=config.mode,
        connector=config.connector.type,
        shadow=config.shadow,
        sla={"ttft_ms": config.sla.ttft_ms, "itl_ms": config.sla.itl_ms},
        roles={
            role: RoleSummary(
                gpus_per_engine=config.role(role).gpus_per_engine,
                min_replicas=config.role(role).min_replicas,
                max_replicas=config.role(role).max_replicas,
            )
            for role in config.roles
        },
        ready=observed.replicas if observed else None,
        desired=decision_store.replicas_of(latest) if latest else None,
        last_decision=decision_out(latest) if latest else None,
        active_overrides=[override_out(o, now) for o in active],
        paused=any(o.action == "pause" for o in active),
        worker=WorkerState(
            running=worker.running,
            leader=worker.is_leader,
            lease_checked_at=worker.lease_checked_at,
            interval_s=worker.interval_s,
            last_tick_at=worker.last_tick_at,
            last_error=worker.last_error,
        ),
        fleet=deployment_fleet(session, deployments, config.name),
    )


@router.get(
    "",
    name="list_deployments",
    response_model=list[DeploymentOut],
    responses=problem_responses(401, 403, 503),
)
def list_deployments(
    request: Request, session: SessionDep, deployments: DeploymentsDep, now: NowDep, _: Viewer
) -> list[DeploymentOut]:
    return [_summary(request, session, d, now) for d in deployments.deployments]


@router.get(
    "/{name}",
    name="get_deployment",
    response_model=DeploymentOut,
    responses=problem_responses(401, 403, 404, 422, 503),
)
def get_deployment(
    request: Request,
    session: SessionDep,
    deployments: DeploymentsDep,
    now: NowDep,
    _: Viewer,
    name: Annotated[str, Path(max_length=63)],
) -> DeploymentOut:
    return _summary(request, session, deployment_or_raise(deployments, name, field="name"), now)


def _side(side: Side) -> ShadowSideOut:
    return ShadowSideOut(
        engine_hours=side.engine_hours,
        gpu_hours=side.gpu_hours,
        gpu_hours_total=side.gpu_hours_total,
        cost=side.cost,
        billed_s=side.billed_s,
        mean_predicted_attainment=side.mean_attainment,
    )


@router.get(
    "/{name}/shadow",
    name="get_shadow_report",
    response_model=ShadowOut,
    responses=problem_responses(
        401,
        403,
        404,
        409,
        422,
        503,
        _409="The deployment does not run in shadow mode (connector.mode: shadow): there is no "
        "incumbent to compare with",
    ),
)
def get_shadow_report(
    session: SessionDep,
    deployments: DeploymentsDep,
    now: NowDep,
    _: Viewer,
    name: Annotated[str, Path(max_length=63)],
    window_s: Annotated[
        float,
        Query(
            gt=0,
            le=MAX_WINDOW_S,
            allow_inf_nan=False,
            description="The window before now the report covers (s)",
        ),
    ] = DEFAULT_WINDOW_S,
) -> ShadowOut:
    """Over the window's ticks of a shadow deployment: how often the planner's counts agreed with
    the incumbent autoscaler's (exactly, and within one engine per role), each side's
    engine-hours, GPU-hours and cost, and the mean predicted SLO attainment of each: a prediction
    from the planner's own model, not a measurement."""
    config = deployment_or_raise(deployments, name, field="name")
    if not config.shadow:
        raise ConflictError(
            f"deployment {config.name} does not run in shadow mode (its connector's mode is control, "
            "or it has none): there is no incumbent to compare with; set connector.mode: shadow"
        )
    report = read_shadow_report(session, config.name, config.roles, now, window_s)

    def time(at_s: float | None) -> datetime | None:
        return datetime.fromtimestamp(at_s, UTC) if at_s is not None else None

    return ShadowOut(
        deployment=config.name,
        window_s=window_s,
        since=now - timedelta(seconds=window_s),
        until=now,
        ticks=report.ticks,
        compared=report.compared,
        first_tick=time(report.first_s),
        last_tick=time(report.last_s),
        agreement_exact=report.exact_share,
        agreement_within_one=report.within_one_share,
        incumbent=_side(report.sides["incumbent"]),
        planner=_side(report.sides["planner"]),
        caveat=report.caveat,
        note=report.note,
    )
