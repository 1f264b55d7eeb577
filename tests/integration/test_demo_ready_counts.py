"""What runs, as the planner knows it, in the demo's world over its real protocols: the
orchestrator reports the engines ready as they change (progress reports while a decision is
applied, counts on every acknowledgement), and every tick's ready counts are the simulator's as
the orchestrator saw them within one tick before it, also while SLA scaling supersedes decisions
before their engines are up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.workers.clock import SIM_EPOCH
from tests.integration.test_demo import DemoProcess, cleanup, start_demo  # noqa: F401  (fixture)
from tests.support import free_port

SPEED = 5.0  # a 5 s tick is a second of wall time: room for a loaded machine's latency
TICK_S = 5.0  # examples/replay.yaml's scaling.interval_s
# The orchestrator polls the simulator every 20 ms of wall time (0.1 simulated s), a report
# reaches the store some milliseconds later, and a tick gathers a little after its time on a
# loaded machine: 2 simulated seconds (400 ms of wall time) either side.
SLACK_S = 2.0


def write_trace(path: Path) -> Path:
    """Mooncake JSONL: 1 request/s for 60 s, 4 requests/s until 90 s, 9/s until 200 s, then 1/s
    until 300 s (ISL 8000, OSL 50): prefill scales up, then down. The second step comes 30 s after
    the first, within the 120 s start-up of the engines the first one ordered: the order for it
    supersedes theirs whatever the ticks' phase against the steps."""
    lines, t_s = [], 0.0
    while t_s < 300.0:
        lines.append(json.dumps({"timestamp": round(t_s * 1000), "input_length": 8000, "output_length": 50}))
        t_s += 1.0 / 9.0 if 90.0 <= t_s < 200.0 else 1.0 / 4.0 if 60.0 <= t_s < 90.0 else 1.0
    path.write_text("\n".join(lines) + "\n")
    return path


def ticks(planner: httpx.Client) -> list[dict[str, Any]]:
    """Every tick record of the demo's deployment, oldest first."""
    records: list[dict[str, Any]] = []
    params: dict[str, Any] = {"deployment": "replay", "limit": 1000}
    while True:
        page = planner.get("/diagnostics", params=params).json()
        records = [item["record"] for item in page["items"]] + records
        if page.get("next_cursor") is None:
            return records
        params["cursor"] = page["next_cursor"]


def seen_between(reports: list[list[Any]], start_s: float, end_s: float) -> list[dict[str, int]]:
    """The ready counts the orchestrator saw at some time in [start_s, end_s]: the last report
    before start_s and every one within."""
    seen = [counts for t_s, counts in reports if start_s <= t_s <= end_s]
    before = [counts for t_s, counts in reports if t_s < start_s]
    return ([before[-1]] if before else []) + seen


@pytest.mark.timeout(300)
def test_every_tick_counts_the_engines_the_simulator_runs(tmp_path: Path, cleanup: list[DemoProcess]) -> None:  # noqa: F811
    trace = write_trace(tmp_path / "step.jsonl")
    port = free_port()
    demo = start_demo(
        tmp_path, "--trace", str(trace), "--speed", str(SPEED), "--rate-scale", "1", "--port", str(port)
    )  # ~60 s of wall time
    cleanup.append(demo)
    status_url = demo.url("demo status (JSON)")
    planner_url = demo.url("planner API docs").removesuffix("/docs")
    demo.wait_for(lambda ln: ln.startswith("end of the trace"), "the end of the trace", 240)
    with httpx.Client(base_url=planner_url, timeout=10) as planner:
        records = ticks(planner)
        reports = httpx.get(status_url, timeout=10).json()["ready_reports"]
        decisions = planner.get("/decisions", params={"deployment": "replay"}).json()["items"]
    assert demo.interrupt() == 0, demo.output()

    assert len(reports) >= 3, reports
    statuses = [(d["id"], d["status"], d["num_prefill"], d["num_decode"]) for d in decisions]
    assert any(d["status"] == "superseded" for d in decisions), ("the run must supersede decisions", statuses)
    assert max(d["num_prefill"] for d in decisions) >= 2, decisions
    first_report_s = reports[0][0]
    checked = 0
    for record in records:
        tick_s = record["at_s"] - SIM_EPOCH.timestamp()
        if tick_s < first_report_s + SLACK_S or record["sla"] is None:
            continue
        ready = record["sla"]["ready"]
        allowed = seen_between(reports, tick_s - TICK_S - SLACK_S, tick_s + SLACK_S)
        assert ready in allowed, (tick_s, ready, allowed, record["ready_source"])
        assert record["ready_source"].startswith(("progress report", "acknowledgement")), record
        checked += 1
    assert checked >= 20, checked
