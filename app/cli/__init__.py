"""The `planner` command line: serve, db upgrade, openapi, plan, replay, demo.

A bad setting, deployments file or flag, and any start-up failure of `serve` and `db upgrade` (the
database, the port), ends the command with one line `planner: error: ...` naming the field, the
file or the URL, and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse

from app.cli import db, demo, openapi, plan, replay, serve
from app.cli.common import fail
from app.config import ConfigError, load_settings
from app.logs import configure_logging

# `planner --help` lists them in this order.
COMMANDS = (serve, db, openapi, plan, replay, demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="planner", description=__doc__.splitlines()[0])
    # One line per command in `planner --help` (a help text longer than about 54 characters
    # would wrap on an 80-column terminal).
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the command the arguments chose (`db upgrade`'s for `db upgrade`)."""
    for dest in ("command", "db_command"):
        commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, dest, None)
        if not commands or name is None:
            break
        parser = commands[0].choices[name]
    return parser


def main(argv: list[str] | None = None) -> int:
    from app.serving import StartupError

    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # Named by the command they were given to, with its usage, not the top level's.
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        settings = load_settings()
        configure_logging(settings.log_level, settings.log_format)
        return args.func(settings, args)
    except (ConfigError, StartupError) as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return 130
