"""app/logs.py: every record is one line whatever its fields hold, in both formats."""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass

import pytest

from app.logs import JsonFormatter, SafeTextFormatter, configure_logging, escape_controls


@dataclass(frozen=True)
class EscapeCase:
    name: str
    why: str
    text: str
    expected: str


ESCAPE_CASES = [
    EscapeCase("plain", "printable text is untouched", "pin 3 + 5: 50% off", "pin 3 + 5: 50% off"),
    EscapeCase("newline", "a newline would start a forged record", "a\nb", "a\\nb"),
    EscapeCase("carriage_return", "a CR would overwrite the line on a terminal", "a\rb", "a\\rb"),
    EscapeCase("tab", "a control like any other", "a\tb", "a\\tb"),
    EscapeCase(
        "ansi", "ESC starts a colour or an erase sequence", "\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"
    ),
    EscapeCase("nul_and_del", "C0 at both ends, and DEL", "\x00\x1f\x7f", "\\x00\\x1f\\x7f"),
    EscapeCase("c1", "CSI (0x9b) is ESC [ in one; NEL (0x85) breaks lines", "\x9b\x85", "\\x9b\\x85"),
    EscapeCase(
        "line_separators", "str.splitlines breaks lines there", "a\u2028b\u2029c", "a\\u2028b\\u2029c"
    ),
    EscapeCase("unicode", "other characters stay readable", "überlast 🚀", "überlast 🚀"),
    EscapeCase("backslash", "left as is: nothing forged with a plain backslash", "C:\\new", "C:\\new"),
]


@pytest.mark.parametrize("case", ESCAPE_CASES, ids=lambda c: c.name)
def test_escape_controls(case: EscapeCase) -> None:
    assert escape_controls(case.text) == case.expected, case.why
    assert len(escape_controls(case.text).splitlines()) <= 1


def _record(msg: str, *args: object, exc: BaseException | None = None, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("app.test", logging.INFO, __file__, 1, msg, args, None)
    if exc is not None:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    record.__dict__.update(extra)
    return record


def _raised(message: str) -> BaseException:
    try:
        raise ValueError(message)
    except ValueError as exc:
        return exc


def test_text_escapes_the_message_and_its_arguments() -> None:
    line = SafeTextFormatter().format(
        _record("[%s] reason: %s", "de\nmo", "x\n2026-01-01 ERROR forged\x1b[2J")
    )
    assert "\n" not in line and "\x1b" not in line
    assert line.endswith("app.test: [de\\nmo] reason: x\\n2026-01-01 ERROR forged\\x1b[2J")


def test_text_indents_every_line_of_a_traceback() -> None:
    """A traceback keeps its lines, but none starts at column 0: only records do."""
    text = SafeTextFormatter().format(_record("tick failed", exc=_raised("bad\n2026-01-01 ERROR forged")))
    first, *rest = text.splitlines()
    assert first.endswith("app.test: tick failed")
    assert rest and all(line.startswith("    ") for line in rest), rest
    assert any("ValueError: bad" in line for line in rest)


def test_json_is_one_object_a_line_with_the_context_fields() -> None:
    exc = _raised("bad\nthing")
    record = _record("[%s] decision %d: %s", "demo", 7, "a\nb\x1b[0m", exc=exc)
    record.__dict__.update(deployment="demo", decision_id=7, tick_id=41)
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "INFO" and entry["logger"] == "app.test"
    assert entry["message"] == "[demo] decision 7: a\\nb\\x1b[0m"
    assert (entry["deployment"], entry["decision_id"], entry["tick_id"]) == ("demo", 7, 41)
    assert entry["time"].endswith("+00:00")
    assert "ValueError: bad\\nthing" in entry["exception"]


def test_json_omits_unknown_context() -> None:
    entry = json.loads(JsonFormatter().format(_record("started")))
    assert set(entry) == {"time", "level", "logger", "message"}


def test_configure_logging_replaces_its_handler_and_routes_uvicorn() -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    stream = io.StringIO()
    try:
        configure_logging("INFO", "json", stream=io.StringIO())
        configure_logging("INFO", "json", stream=stream)
        ours = [h for h in root.handlers if h not in before]
        assert len(ours) == 1, "a second call replaces the first handler"
        logging.getLogger("uvicorn.error").info("Started server process [%d]", 1)
        [line] = stream.getvalue().splitlines()
        assert json.loads(line)["logger"] == "uvicorn.error"
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
        logging.captureWarnings(False)
