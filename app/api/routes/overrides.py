"""Operator overrides (pin, bounds, pause, resume) and the audit log."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Body, Path, Query, Request

from app.api.auth import Operator, Viewer
from app.api.convert import audit_out, decision_out, override_out
from app.api.deps import DeploymentsDep, NowDep, SessionDep, deployment_or_raise
from app.api.errors import problem_responses
from app.api.schemas import (
    MAX_ID,
    AuditOut,
    BoundsIn,
    OverrideCreated,
    OverrideIn,
    OverrideOut,
    PinIn,
)
from app.config import DeploymentConfig
from app.core.chain import bound_violations, effective_bounds
from app.core.errors import InvalidInputError
from app.core.types import ALL_ROLES, ActiveOverrides, DecisionSource, OverrideAction
from app.store import decisions as decision_store
from app.store import overrides as store
from app.store import settings as settings_store

router = APIRouter(tags=["overrides"])

_ERRORS = problem_responses(401, 403, 404, 422, 503)


def _pin_params(body: PinIn, config: DeploymentConfig, active: ActiveOverrides) -> dict[str, int]:
    params: dict[str, int] = {}
    for role in ALL_ROLES:
        value = getattr(body, f"num_{role}")
        if role in config.roles and value is None:
            raise InvalidInputError(f"body.num_{role}", f"required to pin a {config.mode} deployment")
        if role not in config.roles and value is not None:
            raise InvalidInputError(f"body.num_{role}", f"a {config.mode} deployment has no {role} role")
        if value is not None:
            params[role] = value
    bounds = effective_bounds(config.bounds(), active)
    for role, message in bound_violations(params, bounds):  # type: ignore[arg-type]
        raise InvalidInputError(f"body.num_{role}", f"{message}; change the bounds first to pin outside them")
    return params


def _check_budget(params: dict[str, int], config: DeploymentConfig, gpus_per_engine: dict[str, int]) -> None:
    """The GPU budget caps every decision; a pin beyond it is refused rather than silently cut."""
    if config.gpu_budget is None:
        return
    used = sum(count * gpus_per_engine.get(role, 1) for role, count in params.items())
    if used > config.gpu_budget:
        raise InvalidInputError(
            "body", f"the pin needs {used} GPUs; the deployment's gpu_budget is {config.gpu_budget}"
        )


def _bounds_params(body: BoundsIn, config: DeploymentConfig) -> dict[str, int]:
    params: dict[str, int] = {}
    for role in ALL_ROLES:
        for edge in ("min", "max"):
            value = getattr(body, f"{edge}_{role}")
            if value is None:
                continue
            if role not in config.roles:
                raise InvalidInputError(
                    f"body.{edge}_{role}", f"a {config.mode} deployment has no {role} role"
                )
            params[f"{edge}_{role}"] = value
    if not params:
        names = ", ".join(f"min_{r}, max_{r}" for r in config.roles)
        raise InvalidInputError("body", f"a bounds override needs at least one of {names}")
    for role in config.roles:
        lo = params.get(f"min_{role}", config.role(role).min_replicas)
        hi = params.get(f"max_{role}", config.role(role).max_replicas)
        if lo > hi:
            field = f"body.min_{role}" if f"min_{role}" in params else f"body.max_{role}"
            raise InvalidInputError(field, f"min {lo} would be above max {hi} for {role}")
    return params


@router.post(
    "/override",
    name="create_override",
    status_code=201,
    response_model=OverrideCreated,
    responses={
        **_ERRORS,
        **problem_responses(400, 409, 413, _409="resume of a deployment that is not paused"),
    },
)
def create_override(
    request: Request,
    session: SessionDep,
    deployments: DeploymentsDep,
    now: NowDep,
    actor: Operator,
    body: Annotated[OverrideIn, Body()],
) -> OverrideCreated:
    config = deployment_or_raise(deployments, body.deployment, field="body.deployment")
    config = settings_store.effective(session, config)  # bounds and budget as they run now
    action = OverrideAction(body.action)
    active = store.active_overrides(session, config.name, now)
    if isinstance(body, PinIn):
        params = _pin_params(body, config, active)
        _check_budget(params, config, request.app.state.workers[config.name].gpus_per_engine)
    elif isinstance(body, BoundsIn):
        params = _bounds_params(body, config)
    else:
        params = {}
    expires_at = now + timedelta(seconds=body.expires_in_s) if body.expires_in_s else None

    override = store.create_override(
        session,
        deployment=config.name,
        action=action,
        params=params,
        reason=body.reason,
        expires_at=expires_at,
        actor=actor,
        now=now,
    )
    decision, outcome = None, None
    if action == OverrideAction.PIN:
        latest = decision_store.latest_decision(session, config.name)
        previous = decision_store.replicas_of(latest) if latest is not None else {}
        remove = request.app.state.workers[config.name].removals(previous, params)
        proposal = decision_store.propose_decision(
            session,
            deployment=config.name,
            target=params,  # type: ignore[arg-type]
            source=DecisionSource.OVERRIDE,
            reasons=[f"pin: pinned by override #{override.id} ({actor.name}): {body.reason}"],
            now=now,
            ack_timeout_s=config.connector.ack_timeout_s,
            await_ack=config.awaits_ack,
            override_id=override.id,
            remove=remove,
            shadow=config.shadow,
        )
        decision = proposal.decision
        outcome = f"{proposal.outcome.verdict}: {proposal.outcome.reason}"
    session.commit()
    if decision is not None:
        request.app.state.hub.announce(decision)
    return OverrideCreated(
        **override_out(override, now).model_dump(),
        decision=decision_out(decision) if decision else None,
        decision_outcome=outcome,
    )


@router.get("/override", name="list_overrides", response_model=list[OverrideOut], responses=_ERRORS)
def list_overrides(
    session: SessionDep,
    deployments: DeploymentsDep,
    now: NowDep,
    _: Viewer,
    deployment: Annotated[str | None, Query(max_length=63)] = None,
    include_inactive: Annotated[bool, Query(description="Also list ended and expired overrides")] = False,
) -> list[OverrideOut]:
    if deployment is not None:
        deployment_or_raise(deployments, deployment)
    rows = store.list_overrides(session, deployment=deployment, include_inactive=include_inactive, now=now)
    return [override_out(o, now) for o in rows]


@router.delete("/override/{id}", name="delete_override", response_model=OverrideOut, responses=_ERRORS)
def delete_override(
    session: SessionDep, now: NowDep, actor: Operator, id: Annotated[int, Path(ge=1, le=MAX_ID)]
) -> OverrideOut:
    override = store.end_override(session, override_id=id, actor=actor, now=now)
    session.commit()
    return override_out(override, now)


@router.get("/audit", name="list_audit", response_model=list[AuditOut], responses=_ERRORS)
def list_audit(
    session: SessionDep,
    deployments: DeploymentsDep,
    _: Viewer,
    deployment: Annotated[str | None, Query(max_length=63)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[AuditOut]:
    if deployment is not None:
        deployment_or_raise(deployments, deployment)
    return [audit_out(a) for a in store.list_audit(session, deployment=deployment, limit=limit)]
