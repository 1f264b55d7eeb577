"""Liveness, readiness and the Prometheus exposition (all public)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.api.schemas import Health, Readiness
from app.store.db import ping

router = APIRouter(tags=["health"])


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
        database = f"unreachable: {type(exc).__name__}: {exc}"
    problems: dict[str, list[str]] = {}
    listener = state.listener
    for name, worker in state.workers.items():
        reasons = list(worker.startup_problems)
        if worker.source_error:
            reasons.append(f"traffic source failing: {worker.source_error}")
        if not worker.running:
            reasons.append("worker loop is not running")
        if worker.last_error:
            reasons.append(f"last tick failed: {worker.last_error}")
        if listener is not None and not listener.connected.is_set():
            reasons.append(f"decision listener is not connected ({listener.last_error or 'connecting'})")
        problems[name] = reasons
    ready = database == "ok" and not any(problems.values())
    body = Readiness(ready=ready, database=database, deployments=problems)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get(
    "/metrics", name="metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}}
)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
