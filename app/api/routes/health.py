"""Liveness, readiness and the Prometheus exposition (all public)."""

from __future__ import annotations

import logging
import re

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import DBAPIError

from app.api.schemas import Health, Readiness
from app.store.db import ping

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"])

_MAX_REASON_CHARS = 200
# SQLAlchemy appends the statement, its parameters and a link to every database error message.
_SQLALCHEMY_TAIL = re.compile(r"\s*(\[SQL:|\[parameters:|\(Background on this error at:).*", re.DOTALL)


def short_reason(text: str) -> str:
    """A failure as /readyz (public) shows it: the first line, without the SQL statement and
    parameters SQLAlchemy appends; the full error is in the planner's log."""
    text = _SQLALCHEMY_TAIL.sub("", text).strip()
    first = text.splitlines()[0].strip() if text else "unknown error"
    return first if len(first) <= _MAX_REASON_CHARS else first[: _MAX_REASON_CHARS - 3] + "..."


def _database_reason(exc: Exception) -> str:
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return short_reason(f"{type(cause).__name__}: {cause}")


@router.get("/healthz", name="healthz", response_model=Health)
def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    name="readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready; per-deployment reasons"}},
)
def readyz(request: Request) -> JSONResponse:
    state = request.app.state
    try:
        ping(state.engine)
        database = "ok"
    except Exception as exc:  # any failure to answer means not ready
        database = f"unreachable: {_database_reason(exc)}"
        if getattr(state, "readyz_database", None) != database:  # once per outage, not per probe
            log.warning("readiness: the database does not answer: %s", exc)
    state.readyz_database = database
    problems: dict[str, list[str]] = {}
    listener = state.listener
    fleet = getattr(state, "fleet", None)
    for name, worker in state.workers.items():
        reasons = list(worker.startup_problems)
        if worker.source_error:
            reasons.append(f"traffic source failing: {worker.source_error}")
        if not worker.running:
            reasons.append("worker loop is not running")
        if worker.last_error:
            reasons.append(f"last tick failed: {worker.last_error}")
        if worker.signal_health.unavailable:
            reasons.append(f"signals unavailable: {', '.join(sorted(worker.signal_health.unavailable))}")
        if listener is not None and not listener.connected.is_set():
            reasons.append(f"decision listener is not connected ({listener.last_error or 'connecting'})")
        # Every deployment of the fleet ticks within the grants the fleet loop stores.
        if fleet is not None and worker.running and not fleet.running:
            reasons.append("fleet loop is not running")
        if fleet is not None and fleet.last_error:
            reasons.append(f"last fleet step failed: {fleet.last_error}")
        problems[name] = [short_reason(r) for r in reasons]
    ready = database == "ok" and not any(problems.values())
    body = Readiness(ready=ready, database=database, deployments=problems)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get(
    "/metrics", name="metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}}
)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
