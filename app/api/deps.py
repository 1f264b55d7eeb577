"""Dependency aliases shared by the routes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from app.config import DeploymentConfig, DeploymentsFile
from app.connectors.virtual import DecisionHub
from app.core.errors import InvalidInputError, NotFoundError

# The dependencies below do no I/O, so they are `async def`: FastAPI runs a plain `def`
# dependency in the thread pool, and those hand-offs were a third of a `GET /decisions` page's
# CPU time (bench/api.py).


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A Session for the request. Opening one does no I/O (it connects on first use); closing
    one that did connect ends its transaction and returns the connection, which can wait for
    the database, so that runs in the thread pool."""
    session = request.app.state.session_factory()
    try:
        yield session
    finally:
        if session.in_transaction():
            await run_in_threadpool(session.close)
        else:
            session.close()


async def get_engine(request: Request) -> Engine:
    return request.app.state.engine


async def get_now(request: Request) -> datetime:
    return request.app.state.clock.now()


async def get_deployments(request: Request) -> DeploymentsFile:
    return request.app.state.deployments


async def get_hub(request: Request) -> DecisionHub:
    return request.app.state.hub


SessionDep = Annotated[Session, Depends(get_session)]
# For a hot sync route that reads on a plain connection it opens and closes itself, in its own
# thread (SessionDep closes its session after the route, in a second thread-pool hand-off).
EngineDep = Annotated[Engine, Depends(get_engine)]
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
