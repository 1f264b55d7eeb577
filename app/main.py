"""The app factory. Settings, engines and workers are built here and in the lifespan, never at
import time, so tests and several processes can each have their own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI
from fastapi.routing import APIRoute

from app import __version__
from app.api.body_limit import BodyLimitMiddleware
from app.api.convert import ResponseCache, encode_decision
from app.api.errors import install_error_handlers
from app.api.openapi import add_problem_schema
from app.api.routes import dashboard, decisions, diagnostics, docs, health, overrides, plan
from app.api.routes import deployments as deployment_routes
from app.api.routes import fleet as fleet_routes
from app.api.routes import settings as settings_routes
from app.api.shutdown import chain_shutdown_signals
from app.config import ConfigError, DeploymentsFile, Settings, load_deployments
from app.connectors.virtual import DecisionHub, PgDecisionListener
from app.planner_setup import build_planner
from app.reports.metrics import PlannerMetrics
from app.store.db import is_postgres, make_engine, make_session_factory
from app.store.decisions import ensure_deployments
from app.store.fleet import ensure_fleet
from app.store.history import save_configs
from app.store.write_versions import WriteVersions
from app.workers.clock import Clock, ScaledClock, SharedClock, SystemClock
from app.workers.fleet import FleetWorker
from app.workers.loop import DeploymentWorker, process_identity
from app.workers.resources import make_connector, make_fpm_subscribers, make_source
from app.workers.retention import TrafficPruner

log = logging.getLogger(__name__)


def _operation_id(route: APIRoute) -> str:
    # Stable ids for the committed openapi.json: the route's explicit name, nothing generated.
    return route.name


def _refuse_variants(deployments: DeploymentsFile) -> None:
    """Hardware variants are replayed but the service does not run them yet: refusing the file
    beats granting every engine as the first variant while the operator believes otherwise."""
    fleet = deployments.fleet
    for name, entry in fleet.deployments.items() if fleet is not None else ():
        if len(entry.variants) > 1:
            raise ConfigError(
                f"fleet.deployments.{name}.variants: hardware variants are replayed (planner replay)"
                " but not run by planner serve yet; list only the deployment's own hardware"
            )


def create_app(
    settings: Settings,
    *,
    deployments: DeploymentsFile | None = None,
    clock: Clock | None = None,
    run_workers: bool = True,
) -> FastAPI:
    if deployments is None:
        deployments = load_deployments(settings.config)
    _refuse_variants(deployments)
    # Relative paths in the deployments file (profiles, traces) are relative to the file.
    base_dir = Path(settings.config).resolve().parent if Path(settings.config).is_file() else Path.cwd()
    metrics = PlannerMetrics()
    # Profiles and warm-up traces load here, so a broken file stops start-up with one line.
    planners = {d.name: build_planner(d, base_dir=base_dir) for d in deployments.deployments}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.database_url)
        session_factory = make_session_factory(engine)
        names = [d.name for d in deployments.deployments]
        with session_factory() as session, session.begin():
            ensure_deployments(session, names)
            # What `planner replay --from-store` replays as the settings that ran.
            save_configs(
                session,
                {d.name: d.with_absolute_paths(base_dir) for d in deployments.deployments},
                app.state.clock.now(),
            )
            if deployments.fleet is not None:
                ensure_fleet(session)
        hub = DecisionHub(
            session_factory,
            metrics,
            encode=encode_decision,
            max_held=settings.max_held_longpolls,
            max_held_per_caller=settings.max_held_longpolls_per_caller,
        )
        hub.bind(asyncio.get_running_loop())
        # Held long-polls end with a 503 when the stop signal arrives, not when the server has
        # waited out its graceful-shutdown timeout (app/api/shutdown.py).
        unchain_signals = chain_shutdown_signals(asyncio.get_running_loop(), hub.drain)
        listener = None
        if is_postgres(engine):
            versions: WriteVersions = app.state.decision_versions
            versions.follow_commits(session_factory)
            listener = PgDecisionListener(
                settings.database_url, hub, session_factory, names, metrics, versions=versions
            )
            listener.start()
        holder = process_identity()
        http = httpx.AsyncClient(timeout=httpx.Timeout(10.0))
        clock = app.state.clock
        scaled_monotonic = clock.scaled_monotonic if isinstance(clock, ScaledClock | SharedClock) else None
        workers = {
            d.name: DeploymentWorker(
                config=d,
                session_factory=session_factory,
                hub=hub,
                metrics=metrics,
                clock=app.state.clock,
                holder=holder,
                planner=planners[d.name],
                source=make_source(d, http, monotonic=scaled_monotonic),
                connector=make_connector(d),
                fpm=make_fpm_subscribers(d, monotonic=scaled_monotonic),
                lease_ttl_s=settings.lease_ttl_s,
                lease_renew_s=settings.lease_renew_s,
                in_fleet=deployments.fleet is not None,
            )
            for d in deployments.deployments
        }
        fleet = None
        if deployments.fleet is not None:
            fleet = FleetWorker(
                deployments=deployments,
                session_factory=session_factory,
                metrics=metrics,
                clock=app.state.clock,
                holder=holder,
                gpus_per_engine=lambda name: workers[name].gpus_per_engine,
                lease_ttl_s=settings.lease_ttl_s,
                lease_renew_s=settings.lease_renew_s,
            )
        for name, worker in workers.items():
            hub.subscribe(name, worker.on_decision_stored)
        app.state.engine = engine
        app.state.session_factory = session_factory
        app.state.hub = hub
        app.state.listener = listener
        app.state.workers = workers
        app.state.fleet = fleet
        pruner = TrafficPruner(
            session_factory=session_factory,
            clock=app.state.clock,
            retention_days=settings.traffic_retention_days,
        )
        app.state.pruner = pruner
        if run_workers:
            pruner.start()
            # The fleet first: its first step grants before the workers' first ticks.
            if fleet is not None:
                fleet.start()
            for worker in workers.values():
                worker.start()
        log.info("planner %s serving %d deployment(s): %s", __version__, len(names), ", ".join(names))
        try:
            yield
        finally:
            unchain_signals()
            hub.drain()
            if fleet is not None:
                await fleet.stop()
            for worker in workers.values():
                await worker.stop()
            await pruner.stop()
            if listener is not None:
                await asyncio.to_thread(listener.stop)
            await http.aclose()
            engine.dispose()

    app = FastAPI(
        title="planner",
        version=__version__,
        summary="SLA-driven autoscaling for disaggregated LLM inference",
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        docs_url=None,  # served offline by app/api/routes/docs.py
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.deployments = deployments
    app.state.tokens = settings.tokens()
    if clock is None and settings.clock_file:
        clock = SharedClock(settings.clock_file)
        log.warning("the clock is simulated: %s", clock.describe()["detail"])
    if clock is None and settings.time_scale != 1:
        # Accelerated time for `planner demo` and tests: intervals and timeouts in scaled seconds.
        log.warning("time runs %g times faster than the wall clock (PLANNER_TIME_SCALE)", settings.time_scale)
        clock = ScaledClock(settings.time_scale)
    app.state.clock = clock or SystemClock()
    app.state.metrics = metrics
    app.state.decision_pages = ResponseCache()
    # Live only on PostgreSQL, while its LISTEN connection is up (app/store/write_versions.py).
    app.state.decision_versions = WriteVersions()
    app.state.profile_roots = [Path(p).resolve() for p in settings.profile_roots.split(",") if p.strip()] + [
        (base_dir / d.profile).resolve() for d in deployments.deployments if d.profile
    ]
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    for module in (
        health,
        deployment_routes,
        settings_routes,
        decisions,
        diagnostics,
        overrides,
        plan,
        fleet_routes,
        docs,
        dashboard,
    ):
        app.include_router(module.router)
    add_problem_schema(app)
    return app
