"""The app factory. Settings, engines and workers are built here and in the lifespan, never at
import time, so tests and several processes can each have their own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.routing import APIRoute

from app import __version__
from app.api.convert import encode_decision
from app.api.errors import install_error_handlers
from app.api.routes import decisions, diagnostics, health, overrides
from app.api.routes import deployments as deployment_routes
from app.config import DeploymentsFile, Settings, load_deployments
from app.connectors.virtual import DecisionHub, PgDecisionListener
from app.metrics import PlannerMetrics
from app.store.db import is_postgres, make_engine, make_session_factory
from app.store.decisions import ensure_deployments
from app.workers.clock import Clock, SystemClock
from app.workers.loop import DeploymentWorker, process_identity

log = logging.getLogger(__name__)


def _operation_id(route: APIRoute) -> str:
    # Stable ids for the committed openapi.json: the route's explicit name, nothing generated.
    return route.name


def create_app(
    settings: Settings,
    *,
    deployments: DeploymentsFile | None = None,
    clock: Clock | None = None,
    run_workers: bool = True,
) -> FastAPI:
    deployments = deployments if deployments is not None else load_deployments(settings.config)
    metrics = PlannerMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.database_url)
        session_factory = make_session_factory(engine)
        names = [d.name for d in deployments.deployments]
        with session_factory() as session, session.begin():
            ensure_deployments(session, names)
        hub = DecisionHub(session_factory, metrics, encode=encode_decision)
        hub.bind(asyncio.get_running_loop())
        listener = None
        if is_postgres(engine):
            listener = PgDecisionListener(settings.database_url, hub, session_factory, names, metrics)
            listener.start()
        holder = process_identity()
        workers = {
            d.name: DeploymentWorker(
                config=d,
                session_factory=session_factory,
                hub=hub,
                metrics=metrics,
                clock=app.state.clock,
                holder=holder,
            )
            for d in deployments.deployments
        }
        app.state.engine = engine
        app.state.session_factory = session_factory
        app.state.hub = hub
        app.state.listener = listener
        app.state.workers = workers
        if run_workers:
            for worker in workers.values():
                worker.start()
        log.info("planner %s serving %d deployment(s): %s", __version__, len(names), ", ".join(names))
        try:
            yield
        finally:
            for worker in workers.values():
                await worker.stop()
            if listener is not None:
                await asyncio.to_thread(listener.stop)
            engine.dispose()

    app = FastAPI(
        title="planner",
        version=__version__,
        summary="SLA-driven autoscaling for disaggregated LLM inference",
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
    )
    app.state.settings = settings
    app.state.deployments = deployments
    app.state.tokens = settings.tokens()
    app.state.clock = clock or SystemClock()
    app.state.metrics = metrics
    install_error_handlers(app)
    for module in (health, deployment_routes, decisions, diagnostics, overrides):
        app.include_router(module.router)
    return app
