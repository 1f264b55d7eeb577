"""A real `planner serve`: text from outside (an override's reason) cannot forge log lines.

An operator's reason with a newline and ANSI escapes was written raw, and showed as a separate
ERROR line in red. Now it is one line with the escapes visible, in both log formats, and with
`PLANNER_LOG_FORMAT=json` every line of stderr is a JSON object.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import OPER, TOKENS, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
MARKER = "reason-7f3a"
FORGED = "2026-01-01 00:00:00,000 ERROR   planner: database corrupted, call +1-555-0100"
REASON = f"{MARKER} maintenance\n{FORGED}\r\x1b[31mred\x1b[0m\x9b2J tail\u2028end"


def start(tmp_path: Path, log_format: str) -> tuple[subprocess.Popen[bytes], Path, int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
    env.update(
        {
            "PLANNER_DATABASE_URL": f"sqlite:///{tmp_path / 'planner.db'}",
            "PLANNER_CONFIG": str(REPO_ROOT / "examples" / "planner.yaml"),
            "PLANNER_HOST": "127.0.0.1",
            "PLANNER_PORT": str(port),
            "PLANNER_API_TOKENS": TOKENS,
            "PLANNER_LOG_LEVEL": "INFO",
            "PLANNER_LOG_FORMAT": log_format,
        }
    )
    stderr_path = tmp_path / "stderr.log"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve"],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    return proc, stderr_path, port


@pytest.fixture(params=["text", "json"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path, int]]:
    proc, stderr_path, port = start(tmp_path, request.param)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, stderr_path.read_text(errors="replace")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            pytest.fail(f"planner serve did not answer: {stderr_path.read_text(errors='replace')}")
        yield request.param, stderr_path, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def lines_with(path: Path, text: str) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if text in line]


def test_a_forged_reason_is_one_line_with_its_escapes_visible(served: tuple[str, Path, int]) -> None:
    log_format, stderr_path, port = served
    body = {"deployment": "demo", "action": "pin", "num_prefill": 2, "num_decode": 2, "reason": REASON}
    r = httpx.post(f"http://127.0.0.1:{port}/override", json=body, headers=OPER, timeout=10)
    assert r.status_code == 201, r.text
    decision_id = r.json()["decision"]["id"]
    for _ in range(200):  # the lines come as the pin is announced and the first tick runs
        if lines_with(stderr_path, MARKER) and lines_with(stderr_path, "[demo] tick "):
            break
        time.sleep(0.05)

    raw = stderr_path.read_bytes()
    assert b"\x1b" not in raw and "\x9b".encode() not in raw, "a raw escape reached the log"
    text = raw.decode("utf-8")
    assert "\r" not in text and "\u2028" not in text
    lines = text.splitlines()
    assert not [line for line in lines if line.startswith("2026-01-01")], "a forged line starts a record"
    [line] = lines_with(stderr_path, MARKER)  # exactly one line for the decision and its reason
    assert FORGED in line

    if log_format == "text":
        assert "\\n2026-01-01" in line and "\\r\\x1b[31mred\\x1b[0m\\x9b2J tail\\u2028end" in line
        assert " ERROR " not in line.split(MARKER)[0]  # the record's own level, before the reason
        return
    records = [json.loads(line) for line in lines if line.strip()]  # every line is JSON
    assert {"time", "level", "logger", "message"} <= set(records[0])
    [record] = [r for r in records if MARKER in r["message"]]
    assert record["level"] == "INFO"
    assert record["deployment"] == "demo"
    assert record["decision_id"] == decision_id
    assert "\\n2026-01-01" in record["message"] and "\\x1b[31m" in record["message"]
    ticks = [r for r in records if r["message"].startswith("[demo] tick ")]
    assert ticks and all(r["deployment"] == "demo" and isinstance(r["tick_id"], int) for r in ticks)
