"""The decision core stays pure: no framework, database, network or asyncio imports, no clock reads.

`app/core` gets `now` from its caller; everything it decides is a function of its inputs, so the
same snapshot replays to the same decision (tests, offline replay, audits)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CORE_DIR = REPO_ROOT / "app" / "core"

FORBIDDEN_MODULES = {
    "fastapi",
    "starlette",
    "sqlalchemy",
    "httpx",
    "zmq",
    "kubernetes",
    "asyncio",
    "psycopg",
    "uvicorn",
    "alembic",
    "prometheus_client",
}
# Fully qualified; aliases (`import time as t`, `from datetime import datetime as dt`) are resolved.
FORBIDDEN_CALLS = {
    "time.time",
    "time.time_ns",
    "time.monotonic",
    "time.monotonic_ns",
    "time.perf_counter",
    "datetime.datetime.now",
    "datetime.datetime.utcnow",
    "datetime.datetime.today",
    "datetime.date.today",
}


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def violations(source: str, filename: str) -> list[str]:
    """`file:line: what` for every forbidden import or clock read in `source`."""
    tree = ast.parse(source, filename=filename)
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name -> fully qualified name

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    found.append(f"{filename}:{node.lineno}: imports {alias.name}")
                local = alias.asname or alias.name.split(".")[0]
                aliases[local] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"{filename}:{node.lineno}: imports from {node.module}")
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name is None:
                continue
            head, _, rest = name.partition(".")
            qualified = aliases.get(head, head) + (f".{rest}" if rest else "")
            if qualified in FORBIDDEN_CALLS:
                found.append(f"{filename}:{node.lineno}: calls {qualified}() (take `now` as an argument)")
    return found


def core_modules() -> list[Path]:
    return sorted(CORE_DIR.rglob("*.py"))


def test_core_has_modules() -> None:
    # Guards the test itself: an empty glob would pass everything.
    assert {p.name for p in core_modules()} >= {
        "__init__.py",
        "protocol.py",
        "planner.py",
        "chain.py",
        "types.py",
    }


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_core_module_is_pure(path: Path) -> None:
    problems = violations(path.read_text(), str(path.relative_to(REPO_ROOT)))
    assert problems == [], "the core must stay pure:\n" + "\n".join(problems)


@dataclass(frozen=True)
class CheckerCase:
    name: str
    why: str
    source: str
    expected: list[str]


CHECKER_CASES = [
    CheckerCase(
        "clean",
        "plain data and typing are fine",
        "from dataclasses import dataclass\nfrom datetime import datetime, timedelta\n"
        "x = datetime(2026, 1, 1) + timedelta(seconds=1)\n",
        [],
    ),
    CheckerCase(
        "import_sqlalchemy",
        "database access belongs to app/store",
        "import os\nimport sqlalchemy.orm\n",
        ["m.py:2: imports sqlalchemy.orm"],
    ),
    CheckerCase(
        "from_fastapi",
        "HTTP belongs to app/api",
        "from fastapi import HTTPException\n",
        ["m.py:1: imports from fastapi"],
    ),
    CheckerCase(
        "import_asyncio_in_function",
        "a lazy import counts too",
        "def f():\n    import asyncio\n    return asyncio\n",
        ["m.py:2: imports asyncio"],
    ),
    CheckerCase(
        "datetime_now",
        "the core may not read the clock",
        "from datetime import UTC, datetime\n\ndef f():\n    return datetime.now(UTC)\n",
        ["m.py:4: calls datetime.datetime.now() (take `now` as an argument)"],
    ),
    CheckerCase(
        "module_datetime_utcnow",
        "through the module too",
        "import datetime\nx = datetime.datetime.utcnow()\n",
        ["m.py:2: calls datetime.datetime.utcnow() (take `now` as an argument)"],
    ),
    CheckerCase(
        "aliased_date_today",
        "aliases are resolved",
        "from datetime import date as d\nx = d.today()\n",
        ["m.py:2: calls datetime.date.today() (take `now` as an argument)"],
    ),
    CheckerCase(
        "time_time",
        "wall clock",
        "import time\nx = time.time()\n",
        ["m.py:2: calls time.time() (take `now` as an argument)"],
    ),
    CheckerCase(
        "from_time_monotonic",
        "a bare imported name",
        "from time import monotonic\nx = monotonic()\n",
        ["m.py:2: calls time.monotonic() (take `now` as an argument)"],
    ),
    CheckerCase(
        "unrelated_now_method",
        "a method called now on another object is not the clock",
        "def f(snapshot):\n    return snapshot.now()\n",
        [],
    ),
]


@pytest.mark.parametrize("case", CHECKER_CASES, ids=lambda c: c.name)
def test_checker(case: CheckerCase) -> None:
    assert violations(case.source, "m.py") == case.expected, case.why
