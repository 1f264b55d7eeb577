"""Dependency aliases shared by the routes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from app.config import DeploymentConfig, DeploymentsFile
from app.connectors.virtual import DecisionHub
from app.core.errors import InvalidInputError, NotFoundError


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.session_factory() as session:
        yield session


def get_now(request: Request) -> datetime:
    return request.app.state.clock.now()


def get_deployments(request: Request) -> DeploymentsFile:
    return request.app.state.deployments


def get_hub(request: Request) -> DecisionHub:
    return request.app.state.hub


SessionDep = Annotated[Session, Depends(get_session)]
NowDep = Annotated[datetime, Depends(get_now)]
DeploymentsDep = Annotated[DeploymentsFile, Depends(get_deployments)]
HubDep = Annotated[DecisionHub, Depends(get_hub)]


def deployment_or_raise(
    deployments: DeploymentsFile, name: str, *, field: str = "deployment"
) -> DeploymentConfig:
    config = deployments.get(name)
    if config is None:
        known = ", ".join(d.name for d in deployments.deployments)
        raise NotFoundError(f"{field}: deployment {name!r} is not configured (known: {known})", field=field)
    return config


def deployment_for_decision(deployments: DeploymentsFile, name: str | None) -> DeploymentConfig:
    """Decision ids are per deployment; the name may be left out only when there is one."""
    if name is not None:
        return deployment_or_raise(deployments, name)
    if len(deployments.deployments) == 1:
        return deployments.deployments[0]
    raise InvalidInputError(
        "deployment", "required: decision ids are per deployment and several are configured"
    )
