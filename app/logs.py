"""The service's log output: one record is one line, whatever its fields contain.

Log lines carry text that comes from outside (an override's reason, a connector's error, a URL), so
a record could otherwise forge lines of its own: a newline starts what looks like a new record, an
ANSI escape recolours or erases the terminal. Every formatter here escapes the C0 and C1 control
characters (and DEL, and the Unicode line and paragraph separators, which some log viewers and
`str.splitlines` treat as line breaks) in the rendered message, in the record's context fields and
in exception text, so `\\n` shows as the two characters backslash and n.

Two formats (`PLANNER_LOG_FORMAT`): `text`, the default, for people; `json`, one JSON object per
line (`time`, `level`, `logger`, `message`, and `deployment`, `decision_id`, `tick_id` when the
logging call passed them with `extra=`), for log pipelines. A traceback in text format keeps its
lines, each indented, so that a line starting at column 0 is always the start of a record.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

LogFormat = Literal["text", "json"]

# The fields a logging call may attach with `extra=` that the JSON format emits as their own keys.
CONTEXT_FIELDS = ("deployment", "decision_id", "tick_id")

# Marks the handler configure_logging installed, so a second call replaces it.
_OURS = "_planner_handler"

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

# C0 controls, DEL, C1 controls, and U+2028 / U+2029 (line and paragraph separators).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """`text` with every control character written as a visible escape (`\\n`, `\\x1b`, ...).
    Printable text, backslashes included, is left as it is: the point is that nothing in a field
    can end the line or steer the terminal, not a reversible encoding."""
    return _CONTROLS.sub(_escape_one, text)


def _indented(text: str) -> str:
    """Multi-line text (a traceback) under its record: each line escaped and indented."""
    return "\n".join("    " + escape_controls(line) for line in text.splitlines())


class SafeTextFormatter(logging.Formatter):
    """The text format, with control characters escaped in the message (arguments included, they
    are part of the rendered message) and tracebacks indented under their record."""

    def __init__(self, fmt: str = TEXT_FORMAT) -> None:
        super().__init__(fmt)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        # `record.message` is the rendered message; the other fields of the format (logger name,
        # level) are ours, but a logger name can come from a library, so the whole line is escaped.
        return escape_controls(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return _indented(super().formatStack(stack_info))


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line. String values are escaped like the text format's
    (JSON would keep a newline on one line anyway, but a consumer printing `message` to a terminal
    must not receive raw escapes either)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": escape_controls(record.name),
            "message": escape_controls(record.getMessage()),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = escape_controls(value) if isinstance(value, str) else value
        if record.exc_info:
            entry["exception"] = escape_controls(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack"] = escape_controls(self.formatStack(record.stack_info))
        # default=str: a context value that is not JSON (a UUID) must not lose the record.
        return json.dumps(entry, ensure_ascii=False, default=str)


def make_formatter(log_format: LogFormat) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else SafeTextFormatter()


def configure_logging(level: str, log_format: LogFormat = "text", *, stream: TextIO | None = None) -> None:
    """The process's logging: one handler on the root logger, on stderr, with the chosen format.

    Every logger of the service propagates to it, uvicorn's included: `planner serve` runs uvicorn
    without a logging configuration of its own (`log_config=None`), so uvicorn installs no
    handler that would bypass the escaping. Calling this again replaces the handler it added."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(make_formatter(log_format))
    setattr(handler, _OURS, True)
    root = logging.getLogger()
    for existing in [h for h in root.handlers if getattr(h, _OURS, False)]:
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"):
        # uvicorn's own configuration would give these loggers their own handlers; here they keep
        # none and propagate to the root's.
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True
    # Warnings (deprecations from a library) are records too, in the same format.
    logging.captureWarnings(True)
    # Alembic announces every plugin it loads at INFO; only the migration steps are news.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    # httpx logs every request at INFO: a scrape every tick would bury the decisions. A failed
    # scrape is logged by the source that made it, with the deployment's name.
    logging.getLogger("httpx").setLevel(logging.WARNING)
