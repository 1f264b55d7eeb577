"""The `planner` command line: serve, db upgrade, openapi.

A bad setting or deployments file ends the command with one line naming the field and a
non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from app.config import REPO_ROOT, ConfigError, Settings, load_deployments, load_settings

OPENAPI_PATH = REPO_ROOT / "openapi" / "openapi.json"

log = logging.getLogger("planner")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Alembic announces every plugin it loads at INFO; only the migration steps are news.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def _fail(message: str, code: int = 2) -> int:
    print(f"planner: error: {message}", file=sys.stderr)
    return code


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app
    from app.store.db import upgrade

    deployments = load_deployments(settings.config)
    settings.check_auth_exposure()
    if settings.apply_migrations:
        upgrade(settings.database_url)
    app = create_app(settings, deployments=deployments)
    log.info("listening on http://%s:%d", settings.host, settings.port)
    uvicorn.run(
        app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(), access_log=False
    )
    return 0


def cmd_db_upgrade(settings: Settings, args: argparse.Namespace) -> int:
    from app.store.db import upgrade

    upgrade(settings.database_url, args.revision)
    print(f"database at {args.revision}: {_redacted(settings.database_url)}")
    return 0


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def openapi_document(settings: Settings) -> str:
    from app.config import DeploymentsFile
    from app.main import create_app

    # The schema does not depend on which deployments are configured.
    placeholder = DeploymentsFile.model_validate(
        {"deployments": [{"name": "x", "connector": {"type": "none"}, "sla": {"ttft_ms": 1, "itl_ms": 1}}]}
    )
    app = create_app(settings, deployments=placeholder, run_workers=False)
    return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"


def cmd_openapi(settings: Settings, args: argparse.Namespace) -> int:
    path = Path(args.output)
    document = openapi_document(settings)
    if args.check:
        current = path.read_text() if path.exists() else ""
        if current != document:
            return _fail(f"{path} is out of date with the app; run `planner openapi` and commit it", 1)
        print(f"{path} matches the app")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document)
    print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="planner", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("serve", help="run the API and the per-deployment workers").set_defaults(func=cmd_serve)

    db = sub.add_parser("db", help="database maintenance")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_sub.add_parser("upgrade", help="apply migrations (PLANNER_DATABASE_URL)")
    upgrade.add_argument("revision", nargs="?", default="head")
    upgrade.set_defaults(func=cmd_db_upgrade)

    openapi = sub.add_parser("openapi", help="write or check the committed openapi/openapi.json")
    openapi.add_argument("--check", action="store_true", help="fail if the committed file differs")
    openapi.add_argument("--output", default=str(OPENAPI_PATH))
    openapi.set_defaults(func=cmd_openapi)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
        _setup_logging(settings.log_level)
        return args.func(settings, args)
    except ConfigError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from sqlalchemy.exc import OperationalError

        if isinstance(exc, OperationalError):
            first_line = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc.orig)
            return _fail(f"PLANNER_DATABASE_URL: cannot reach the database: {first_line}", 1)
        raise


if __name__ == "__main__":
    sys.exit(main())
