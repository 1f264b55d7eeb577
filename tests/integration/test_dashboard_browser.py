"""The dashboard, the diagnostics report and /docs as a browser shows them: headless Chromium
(Debian's `chromium` package) against a running `planner demo` with SLA ticks, after their
scripts ran. Skipped only where Chromium is not installed (CI installs it: .ci/run)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_demo import SPEED, DemoProcess, cleanup, start_demo, write_step_trace  # noqa: F401
from tests.support import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)")

# As the machine's probe runs it: no sandbox (root), and none of Chromium's own network traffic.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
# Charts the dashboard draws for an SLA deployment, each of which must have data here.
CHARTS = ("rate", "replicas", "ttft", "itl", "wishes", "headroom", "scale", "lead")


def chromium(tmp_path: Path, url: str, *args: str, budget_ms: int = 20_000) -> str:
    """Chromium's stdout for `url` (with --dump-dom: the DOM after the page's scripts ran for
    `budget_ms` of virtual time)."""
    profile = tmp_path / f"chromium-profile-{time.monotonic_ns()}"
    done = subprocess.run(
        [
            CHROMIUM,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={budget_ms}",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


class Charts(HTMLParser):
    """The dashboard's chart divs (data-chart, data-points, data-empty), whether plotly drew an
    SVG in each, the decision rows and the body's data-state."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, dict[str, Any]] = {}
        self.body: dict[str, str | None] = {}
        self.decision_rows = 0
        self._open: list[str | None] = []  # the chart each open div belongs to

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag == "tr" and a.get("data-decision"):
            self.decision_rows += 1
        if tag == "svg" and "main-svg" in (a.get("class") or "") and self._open and self._open[-1]:
            self.charts[self._open[-1]]["svg"] = True
        if tag != "div":
            return
        name = a.get("data-chart")
        if name:
            self.charts[name] = {
                "points": int(a.get("data-points") or 0),
                "empty": a.get("data-empty"),
                "svg": False,
            }
        self._open.append(name or (self._open[-1] if self._open else None))

    def handle_endtag(self, tag: str) -> None:
        if tag == "div" and self._open:
            self._open.pop()


def wait_for_sla_ticks(
    planner_url: str, demo: DemoProcess, want: int, timeout_s: float
) -> list[dict[str, Any]]:
    """The demo's stored ticks once `want` of them have SLA demand and one made a decision."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=planner_url, timeout=10) as client:
        while True:
            items = client.get("/diagnostics", params={"deployment": "replay", "limit": 1000}).json()["items"]
            sla = [t for t in items if (t["record"].get("sla") or {}).get("demand")]
            completed = [t for t in sla if (t["record"]["traffic"]["observed"] or {}).get("itl_ms")]
            if len(sla) >= want and len(completed) >= want // 2 and any(t["decision_id"] for t in items):
                return items
            assert time.monotonic() < deadline, f"only {len(sla)} SLA ticks\n{demo.output()}"
            time.sleep(1.0)


@pytest.mark.timeout(300)
def test_dashboard_report_and_docs_render_in_chromium(tmp_path: Path, cleanup: list[DemoProcess]) -> None:  # noqa: F811
    trace = write_step_trace(tmp_path / "step.jsonl")
    demo = start_demo(
        tmp_path,
        "--trace",
        str(trace),
        "--speed",
        str(SPEED),
        "--rate-scale",
        "1",
        "--port",
        str(free_port()),
    )
    cleanup.append(demo)
    dashboard = demo.url("live dashboard")
    planner_url = dashboard.removesuffix("/dashboard")
    wait_for_sla_ticks(planner_url, demo, want=20, timeout_s=120)

    # The dashboard: every chart drawn by plotly, with data, and the decisions with their reasons.
    dom = chromium(tmp_path, dashboard, "--dump-dom")
    page = Charts()
    page.feed(dom)
    assert page.body.get("data-state") == "ready", dom[:3000]
    assert int(page.body.get("data-ticks") or 0) >= 20, page.body
    assert set(page.charts) == set(CHARTS), page.charts
    for name in CHARTS:
        chart = page.charts[name]
        assert chart["svg"], f"plotly drew no {name} chart"
        assert chart["points"] > 0, f"the {name} chart has no data ({chart['empty']})"
        assert not chart["empty"], chart
    assert page.decision_rows >= 1
    assert "proposal: sla" in dom  # the reasons of the decisions
    assert "times: simulated (planner demo): 2000-01-01T00:00:00+00:00 is simulated second 0" in dom
    # The cost of the ticks shown, from /diagnostics/cost (the demo's price is the default 1).
    shown = re.search(
        r'data-cost="([0-9.e+-]+)"[^>]*>cost over the ticks shown: ([0-9.]+) at 1 per GPU-hour', dom
    )
    assert shown, dom[:3000]
    assert float(shown.group(1)) > 0
    assert "GPU-hours: prefill" in dom and "saving" in dom

    # What a person sees: a screenshot of the whole page.
    shot = tmp_path / "dashboard.png"
    chromium(tmp_path, dashboard, f"--screenshot={shot}", "--window-size=1400,2000")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000  # charts, not a blank page

    # The stored-ticks report of the same SLA ticks: its panels drawn, the SLA ones included.
    report = chromium(
        tmp_path, f"{planner_url}/diagnostics/report?deployment=replay", "--dump-dom", budget_ms=10_000
    )
    assert "main-svg" in report
    for title in ("Request rate (req/s)", "SLA scaling: forecast headroom", "SLA scaling decisions"):
        assert title in report, title
    assert "no data: load scaling did not run in these ticks" in report

    # /docs offline: Swagger UI from the service itself rendered the API's operations.
    docs = chromium(tmp_path, f"{planner_url}/docs", "--dump-dom", budget_ms=10_000)
    operations = re.findall(r'class="opblock opblock-(?:get|post|delete)', docs)
    assert len(operations) >= 10, docs[:3000]
    assert "/decisions/wait" in docs


@pytest.mark.timeout(240)
def test_dashboard_shows_a_shadow_deployment_beside_its_incumbent(tmp_path: Path, sqlite_dbs) -> None:
    """A shadow deployment (virtual, an orchestrator reporting its own counts): the dashboard draws
    the incumbent's and the planner's counts over time and says how often they agree."""
    from tests.integration.test_shadow_e2e import Traffic, latest_decision, shadow_file, wait_ticks
    from tests.support import ORCH, TOKENS, VIEWER, PlannerProcess, expect, poll, start_or_fail
    from tests.support_frontend import FrontendExporter

    with FrontendExporter() as frontend, Traffic(frontend):
        config = shadow_file(tmp_path, {"type": "virtual", "mode": "shadow"}, frontend)
        proc = start_or_fail(
            PlannerProcess(sqlite_dbs.fresh(), config, tokens=TOKENS, log_path=tmp_path / "planner.log")
        )
        try:
            with httpx.Client(base_url=proc.base_url, headers=VIEWER, timeout=30) as client:
                poll(lambda: latest_decision(client) is not None, "a shadow decision", proc, steps=2000)
                decision = latest_decision(client)
                assert decision is not None
                expect(
                    client.post(
                        f"/decisions/{decision['id']}/progress",
                        headers=ORCH,
                        params={"deployment": "demo"},
                        json={"observed": {"prefill": 1, "decode": 1}},
                    ),
                    200,
                    proc,
                )
                wait_ticks(client, proc)
            dom = chromium(tmp_path, f"{proc.base_url}/dashboard#token=viewer-token-1", "--dump-dom")
        finally:
            proc.stop()
    page = Charts()
    page.feed(dom)
    assert page.body.get("data-state") == "ready", dom[:3000]
    # The shadow chart only for the shadow deployment (the control one beside it has none).
    assert dom.count('data-chart="shadow"') == 1
    assert dom.count('data-deployment="ctl"') == 1
    shadow = page.charts["shadow"]
    assert shadow["svg"] and shadow["points"] > 0 and not shadow["empty"], shadow
    agreement = re.search(r'data-agreement="([0-9.]+)"[^>]*>shadow mode over the last 3600 s', dom)
    assert agreement, dom[:3000]
    assert 0.0 <= float(agreement.group(1)) <= 1.0
    assert "within one engine" in dom and "not a measurement" in dom
    assert "shadow mode: nothing is written" in dom
