"""`planner serve`: the HTTP API and one worker per deployment."""

from __future__ import annotations

import argparse

from app.cli.common import log, prepare_database, start_up_failure
from app.config import ConfigError, Settings, load_deployments


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    from app.main import create_app
    from app.serving import StartupError, listen, serve

    deployments = load_deployments(settings.config)
    settings.check_auth_exposure()
    try:
        # Profiles and warm-up traces load here: a broken file stops start-up before the
        # database is touched.
        app = create_app(settings, deployments=deployments)
        prepare_database(settings, "head" if settings.apply_migrations else None)
        sock = listen(settings.host, settings.port)
    except (ConfigError, StartupError):
        raise
    except Exception as exc:
        log.debug("start-up failed", exc_info=True)
        raise StartupError(start_up_failure(settings, exc)) from None
    host, port = sock.getsockname()[:2]
    log.info("listening on http://%s:%d", host if ":" not in host else f"[{host}]", port)
    serve(
        app,
        sock,
        log_level=settings.log_level,
        describe=lambda exc: start_up_failure(settings, exc),
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sub.add_parser(
        "serve",
        help="run the API and the per-deployment workers",
        description="Run the HTTP API and one worker per deployment; settings come from the "
        "PLANNER_* variables (docs/configuration.md).",
    ).set_defaults(func=cmd_serve)
