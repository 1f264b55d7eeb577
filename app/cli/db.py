"""`planner db upgrade`: migrate the database."""

from __future__ import annotations

import argparse

from app.cli.common import log, prepare_database, start_up_failure
from app.config import ConfigError, Settings


def cmd_db_upgrade(settings: Settings, args: argparse.Namespace) -> int:
    from app.serving import StartupError

    try:
        prepare_database(settings, args.revision)
    except ConfigError:
        raise
    except Exception as exc:
        log.debug("upgrade failed", exc_info=True)
        raise StartupError(start_up_failure(settings, exc)) from None
    print(f"database at {args.revision}: {_redacted(settings.database_url)}")
    return 0


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    db = sub.add_parser("db", help="database maintenance: `db upgrade` migrates")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_sub.add_parser("upgrade", help="apply migrations (PLANNER_DATABASE_URL)")
    upgrade.add_argument("revision", nargs="?", default="head")
    upgrade.set_defaults(func=cmd_db_upgrade)
