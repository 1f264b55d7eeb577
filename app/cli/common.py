"""What the commands share: one-line failures, argparse types with their bounds, start-up."""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import UTC, datetime

from app.config import ConfigError, Settings
from app.logs import escape_controls

log = logging.getLogger("planner")


def fail(message: str, code: int = 2) -> int:
    # The message may quote a file's content or a URL: it stays one line, escapes visible.
    print(f"planner: error: {escape_controls(message)}", file=sys.stderr)
    return code


def start_up_failure(settings: Settings, exc: Exception) -> str:
    """One line for whatever stopped `serve` or `db upgrade` from starting."""
    from app.store.startup import describe_database_error

    described = describe_database_error(exc, settings.database_url)
    if described is not None:
        return described
    if isinstance(exc, ConfigError):
        return str(exc)
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"start-up failed: {exc.strerror or exc}{where}"
    return f"start-up failed: {type(exc).__name__}: {exc} (PLANNER_LOG_LEVEL=DEBUG shows where)"


def prepare_database(settings: Settings, revision: str | None) -> None:
    """Check the database in seconds, then migrate it (`revision`; None: do not migrate)."""
    from app.store.db import upgrade
    from app.store.startup import check_database

    check_database(settings.database_url, migrate=revision is not None)
    if revision is not None:
        upgrade(settings.database_url, revision)


# Sane upper bounds of the flags: far beyond any real deployment, and low enough that the
# arithmetic downstream (replica counts, trace expansion) stays finite and fits in memory.
MAX_RPS = 1e6  # requests/s
MAX_TOKENS = 1e7  # tokens of one request (ISL, OSL)
MAX_LATENCY_MS = 3.6e6  # an hour: a TTFT or ITL target beyond it is a unit mistake
MAX_GPUS_PER_ENGINE = 1024
MAX_REPLICAS = 100_000
MAX_RATE_SCALE = 1000.0  # K requests per trace request: the expanded trace is held in memory
MAX_SCALE = 1000.0  # --truth-scale, --speed
MAX_DELAY_S = 86_400.0  # a day


def number(  # type: ignore[no-untyped-def]
    *, minimum: float, inclusive: bool, integer: bool = False, maximum: float | None = None
):
    """An argparse type: a finite number above (or at) `minimum` and at most `maximum`, with a
    message naming the rule."""
    import math

    rule = f"{'>=' if inclusive else '>'} {minimum:g}"
    if maximum is not None:
        rule += f" and <= {maximum:g}"
    kind = "an integer" if integer else "a number"

    def parse(text: str) -> float | int:
        try:
            value: float | int = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {kind} {rule}, got {text!r}") from None
        if (
            not math.isfinite(value)
            or value < minimum
            or (value == minimum and not inclusive)
            or (maximum is not None and value > maximum)
        ):
            raise argparse.ArgumentTypeError(f"must be {kind} {rule}, got {text!r}")
        return value

    return parse


def modes(text: str) -> tuple[str, ...]:
    """An argparse type: `load,throughput`, `load` or `throughput`."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    if not modes or set(modes) - {"load", "throughput"} or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"expected load,throughput | load | throughput, got {text!r}")
    return modes


MODES_HELP = (
    "the seed algorithm's modes for this run: load,throughput | load | throughput (default: the file's); "
    "replay: with --policy seed; demo: runs the seed instead of SLA scaling"
)


def one_line_error(message: str) -> None:
    # argparse's own errors print the usage first; here a bad flag is one line naming it.
    print(f"planner: error: {message}", file=sys.stderr)
    raise SystemExit(2)


TIME_HELP = (
    "ISO-8601 time, e.g. 2026-12-01T08:00:00Z; without a timezone it is read as UTC (the store keeps UTC)"
)


def parse_time(text: str) -> datetime:
    """An argparse type: an ISO-8601 timestamp, UTC when it names no timezone."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO-8601 time: {text!r} (e.g. 2026-12-01T08:00:00Z)"
        ) from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
