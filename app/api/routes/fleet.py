"""The fleet under one GPU budget: budgets, grants, cuts and the last moves (docs/fleet.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.api.auth import Viewer
from app.api.deps import DeploymentsDep, SessionDep
from app.api.errors import problem_responses
from app.api.fleet_view import fleet_out
from app.api.schemas import FleetOut
from app.core.errors import NotFoundError

router = APIRouter(prefix="/fleet", tags=["fleet"])


@router.get(
    "",
    name="get_fleet",
    response_model=FleetOut,
    responses=problem_responses(401, 403, 404, 503),
)
def get_fleet(request: Request, session: SessionDep, deployments: DeploymentsDep, _: Viewer) -> FleetOut:
    """The budget per GPU type, the GPUs granted and used, each deployment's wish, grant,
    reason and who cut it, and the last GPU moves. 404 when the deployments file has no
    `fleet:` section."""
    if deployments.fleet is None:
        raise NotFoundError("fleet: the deployments file has no fleet: section", field="fleet")
    return fleet_out(session, deployments, getattr(request.app.state, "fleet", None))
