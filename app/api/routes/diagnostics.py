"""Per-tick diagnostics records."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query

from app.api.auth import Viewer
from app.api.convert import tick_out
from app.api.deps import DeploymentsDep, SessionDep, deployment_or_raise
from app.api.schemas import MAX_ID, Problem, TickPage
from app.core.errors import InvalidInputError
from app.store import ticks as store

router = APIRouter(tags=["diagnostics"])


def _utc(field: str, value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise InvalidInputError(field, "needs a time zone, e.g. 2026-11-29T18:00:00Z")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidInputError(field, "is outside the range of representable UTC times") from None


@router.get(
    "/diagnostics",
    name="list_diagnostics",
    response_model=TickPage,
    responses={
        401: {"model": Problem},
        403: {"model": Problem},
        404: {"model": Problem},
        422: {"model": Problem},
    },
)
def list_diagnostics(
    session: SessionDep,
    deployments: DeploymentsDep,
    _: Viewer,
    deployment: Annotated[str | None, Query(max_length=63)] = None,
    since: Annotated[datetime | None, Query(description="Inclusive, ISO 8601 with a time zone")] = None,
    until: Annotated[datetime | None, Query(description="Exclusive, ISO 8601 with a time zone")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[
        int | None, Query(ge=0, le=MAX_ID, description="next_cursor of the previous page")
    ] = None,
) -> TickPage:
    if deployment is not None:
        deployment_or_raise(deployments, deployment)
    since, until = _utc("since", since), _utc("until", until)
    if since is not None and until is not None and until <= since:
        raise InvalidInputError("until", "must be after since")
    rows = store.list_ticks(
        session, deployment=deployment, since=since, until=until, cursor=cursor, limit=limit + 1
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return TickPage(items=[tick_out(t) for t in rows], next_cursor=rows[-1].id if more else None)
