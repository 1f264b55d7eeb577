"""`planner replay --from-store` on a store the demo wrote: `planner demo --exit-at-end --store`
runs the real service against the simulated cluster for 15 simulated minutes, then the replay
rebuilds that traffic from the store and replays it.

What it must show: the `recorded` policy bills the stored decisions' engine-hours (counted here
from the raw decision rows) within 2%; `planner` with the stored settings comes within
PLANNER_GAP points of the demo's SLO attainment; the store is byte-identical afterwards; and every
bad input is one line, exit 2, nothing written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import pytest

from app.store.db import downgrade
from tests.support import REPO_ROOT, free_port

DEMO_S = 900
DEMO_TIMEOUT_S = 600
# How far the replayed `planner` may land from the demo's attainment. Measured (docs/
# replay-from-store.md, "How close it comes"): within 1.31 points in twelve runs, as often above as
# below; the planner itself moves 1.7 points on the same traffic with its ticks a second earlier or
# later. A replay or a demo gone wrong lands far off: with its first tick read as silence the demo
# met 71-76%, its replay 98%.
PLANNER_GAP = 0.02


@dataclass(frozen=True)
class DemoStore:
    path: Path
    slo_attainment: float  # the demo's own summary

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"


def planner(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> DemoStore:
    path = tmp_path_factory.mktemp("demo") / "demo.db"
    run = planner(
        "demo",
        "--exit-at-end",
        "--duration-s",
        str(DEMO_S),
        "--speed",
        # The slower the demo's clock, the closer its ticks' windows match the simulated arrivals
        # (docs/replay-from-store.md, "How close it comes").
        "5",
        "--port",
        str(free_port()),
        "--store",
        str(path),
        timeout_s=DEMO_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    final = json.loads(run.stdout.strip().splitlines()[-1])
    assert final["reason"] == "duration", final
    return DemoStore(path, final["summary"]["slo_attainment"])


def snapshot(folder: Path) -> dict[str, str | None]:
    """Every file of the store's folder and its content's hash: a replay may add nothing there
    (no -wal, -shm or lock file) and change nothing. An -shm beside a write-ahead log is SQLite's
    shared index of it, which every reader updates (app/store/history.py `open_read_only`): it is
    named, not hashed. A log is left when the demo's service ended with a connection still open."""
    return {
        p.name: None if p.name.endswith("-shm") else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
    }


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def stored_engine_hours(path: Path) -> float:
    """The engine-hours the stored decisions ordered over the replay's window, from the raw rows:
    the window runs from the first tick's interval start to the last tick; before its first
    decision the deployment ran that decision's counts (the demo's first tick decides at once)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        ticks = [
            (_at(at), json.loads(r)) for at, r in conn.execute("SELECT at, record FROM ticks ORDER BY id")
        ]
        decisions = [
            (_at(at), p, d)
            for at, p, d in conn.execute(
                "SELECT created_at, num_prefill, num_decode FROM decisions ORDER BY decision_id"
            )
        ]
    with_traffic = [
        (at, r["traffic"]["observed"]) for at, r in ticks if (r.get("traffic") or {}).get("observed")
    ]
    start = with_traffic[0][0] - with_traffic[0][1]["duration_s"]
    end = with_traffic[-1][0]
    total = 0.0
    counts = decisions[0][1] + decisions[0][2]
    at = start
    for made, p, d in decisions:
        if made > end:
            break
        made = max(made, start)
        total += counts * (made - at)
        counts, at = p + d, made
    total += counts * (end - at)
    return total / 3600.0


@pytest.mark.timeout(DEMO_TIMEOUT_S + 300)
def test_replay_from_the_demo_store_matches_what_ran(demo_store: DemoStore, tmp_path: Path) -> None:
    before = snapshot(demo_store.path.parent)
    out = tmp_path / "out"
    run = planner("replay", "--from-store", demo_store.url, "--deployment", "replay", "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    assert snapshot(demo_store.path.parent) == before, "the replay changed the store"
    comparison = json.loads((out / "comparison.json").read_text())
    rows = comparison["policies"]
    assert set(rows) == {"planner", "recorded", "peak", "static", "oracle"}
    for name in rows:
        assert (out / name / "summary.json").is_file() and (out / name / "report.html").is_file()
    hours = stored_engine_hours(demo_store.path)
    assert comparison["stored"]["engine_hours"] == pytest.approx(hours, rel=1e-6)
    recorded = rows["recorded"]["window_engine_hours"]
    assert abs(recorded - hours) <= 0.02 * hours, (recorded, hours)
    # `planner` replays the stored settings on traffic rebuilt from per-tick aggregates.
    assert abs(rows["planner"]["slo_attainment"] - demo_store.slo_attainment) <= PLANNER_GAP, (
        rows["planner"]["slo_attainment"],
        demo_store.slo_attainment,
    )
    # The summary line per policy, and the stored decisions' line.
    for name in rows:
        assert f"{name}: SLO attainment " in run.stdout
    assert "stored decisions: " in run.stdout


class BadCase(NamedTuple):
    name: str
    args: list[str]  # {url}: the demo store's URL; {old}: a copy at the previous schema revision
    message: str  # a fragment of the one line
    why: str


BAD_CASES = [
    BadCase(
        "unknown_deployment",
        ["--from-store", "{url}", "--deployment", "nope"],
        "--deployment: no deployment 'nope' in the store (have: replay)",
        "the store's deployments are named, so a typo is seen at once",
    ),
    BadCase(
        "window_without_traffic",
        ["--from-store", "{url}", "--since", "2001-01-01T00:00:00Z", "--until", "2001-01-02T00:00:00Z"],
        "--since/--until: no traffic stored for 'replay' between 2001-01-01T00:00:00+00:00",
        "a window after the demo's ticks: the line says where the stored ticks are",
    ),
    BadCase(
        "older_schema",
        ["--from-store", "{old}"],
        "the schema is at revision 0005_decision_removals; replay needs revision 0006_deployment_config",
        "a store from before the configuration was stored says which revision it needs",
    ),
    BadCase(
        "unreachable_postgres",
        ["--from-store", "postgresql://planner:secret@127.0.0.1:1/planner"],
        "--from-store: postgresql://planner:***@127.0.0.1:1/planner: cannot open the store",
        "a server that does not answer, its password masked",
    ),
    BadCase(
        "not_a_database_url",
        ["--from-store", "mysql://db/planner"],
        "--from-store: the URL must start with sqlite:/// or postgresql://",
        "only the store's two backends",
    ),
    BadCase(
        "missing_sqlite_file",
        ["--from-store", "sqlite:///{dir}/nope.db"],
        "nope.db: no such database file",
        "read-only never creates a database where none was",
    ),
    BadCase(
        "since_after_until",
        ["--from-store", "{url}", "--since", "2000-01-01T00:10:00", "--until", "2000-01-01T00:05:00"],
        "--since: 2000-01-01T00:10:00+00:00 is after --until 2000-01-01T00:05:00+00:00",
        "an empty window is a mistake, not an empty replay (no timezone: UTC)",
    ),
    BadCase(
        "not_a_time",
        ["--from-store", "{url}", "--since", "yesterday"],
        "argument --since: not an ISO-8601 time: 'yesterday'",
        "the format is named with an example",
    ),
    BadCase(
        "rate_scale_refused",
        ["--from-store", "{url}", "--rate-scale", "3"],
        "--rate-scale: not with --from-store (the stored traffic replays as it came)",
        "the stored traffic is what ran; a flag that would change it is refused, not ignored",
    ),
    BadCase(
        "trace_and_store",
        ["--from-store", "{url}", "--workload", "steady"],
        "argument --workload: not allowed with argument --from-store",
        "one traffic source at a time",
    ),
]


@pytest.mark.timeout(DEMO_TIMEOUT_S + 300)
@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.name)
def test_bad_input_is_one_line_and_writes_nothing(
    demo_store: DemoStore, tmp_path: Path, case: BadCase
) -> None:
    old = tmp_path / "old" / "old.db"
    old.parent.mkdir()
    shutil.copy(demo_store.path, old)
    downgrade(f"sqlite:///{old}", "0005_decision_removals")
    stores = {demo_store.path.parent: snapshot(demo_store.path.parent), old.parent: snapshot(old.parent)}
    out = tmp_path / "out"
    args = [a.format(url=demo_store.url, old=f"sqlite:///{old}", dir=tmp_path / "missing") for a in case.args]
    run = planner("replay", *args, "--out", str(out), timeout_s=120)
    assert run.returncode == 2, (case.why, run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("planner: error: "), (case.why, run.stderr)
    assert case.message in lines[0], (case.why, lines[0])
    assert run.stdout == ""
    assert not out.exists(), case.why
    for folder, files in stores.items():
        assert snapshot(folder) == files, f"{case.name}: the store changed"
