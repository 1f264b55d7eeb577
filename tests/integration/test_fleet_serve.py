"""The fleet step in a real `planner serve` process: three deployments, each scraping its own
stand-in frontend whose traffic ramps up, wish more GPUs than the fleet's budget holds. Over
real HTTP: GET /fleet, GET /deployments and /metrics show the cut deployment with the reason
and who cut it; every tick's decision stays within the grant in force; the grants of every
fleet step add up to no more than the budget (PostgreSQL, as in production)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_dashboard_browser import CHROMIUM, chromium
from tests.support import (
    ORCH,
    REPO_ROOT,
    TOKENS,
    VIEWER,
    PlannerProcess,
    PostgresDatabases,
    demo_config,
    expect,
    logs,
    start_or_fail,
    write_config,
)
from tests.support_frontend import RampingFrontend

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]

H200 = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")
NAMES = ("chat", "code", "batch")
PRIORITY = {"chat": 3, "code": 2, "batch": 1}
BUDGET_GPUS = 8
TICK_S = 1.0


def fleet_file(urls: dict[str, str]) -> dict[str, Any]:
    deployments = [
        demo_config(
            name=name,
            connector={"type": "virtual", "ack_timeout_s": 1800},
            profile=H200,
            sla={"ttft_ms": 500, "itl_ms": 50},
            prefill={"min_replicas": 1, "max_replicas": 64},
            decode={"min_replicas": 1, "max_replicas": 64},
            scaling={
                "algorithm": "sla",
                "interval_s": TICK_S,
                "trend": False,
            },
            sources={"frontend_url": urls[name]},
        )["deployments"][0]
        for name in NAMES
    ]
    return {
        "deployments": deployments,
        "fleet": {
            "budget_gpus": {"h200": BUDGET_GPUS},
            "interval_s": TICK_S,
            "deployments": {n: {"priority": PRIORITY[n], "guaranteed_gpus": 2} for n in NAMES},
        },
    }


@pytest.fixture
def database(pg_dbs: PostgresDatabases) -> Iterator[str]:
    url = pg_dbs.fresh()
    yield url
    pg_dbs.drop(url)


class FleetPanel(HTMLParser):
    """The dashboard's fleet section: whether it is shown, and per deployment row its data-cut
    flag and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.shown = False
        self.ticks = 0  # the body's data-ticks: ticks the page holds, all deployments
        self.rows: dict[str, tuple[str | None, str]] = {}
        self._in_fleet = False
        self._row: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.ticks = int(a.get("data-ticks") or 0)
        if tag == "section" and a.get("id") == "fleet":
            self._in_fleet, self.shown = True, "hidden" not in a
        if tag == "tr" and self._in_fleet and a.get("data-deployment"):
            self._row = a["data-deployment"]
            self.rows[self._row] = (a.get("data-cut"), "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._in_fleet = False
        if tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._row is not None:
            cut, text = self.rows[self._row]
            self.rows[self._row] = (cut, text + " " + data)


class Acker:
    """An orchestrator for one deployment: applies every decision at once (acknowledges it with
    the replicas it asked for), as the example orchestrator would."""

    def __init__(self, base_url: str, name: str) -> None:
        self.base_url, self.name = base_url, name
        self.acked: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        after = 0
        with httpx.Client(base_url=self.base_url, headers=ORCH, timeout=30) as client:
            while not self._stop.is_set():
                try:
                    r = client.get(
                        "/decisions/wait", params={"deployment": self.name, "after": after, "timeout_s": 1}
                    )
                    if r.status_code != 200:
                        continue
                    d = r.json()
                    observed = {
                        k: d[f"num_{k}"] for k in ("prefill", "decode") if d.get(f"num_{k}") is not None
                    }
                    client.post(
                        f"/decisions/{d['id']}/complete",
                        params={"deployment": self.name},
                        json={"status": "succeeded", "observed": observed},
                    )
                    after = d["id"]
                    self.acked.append(after)
                except httpx.HTTPError:
                    time.sleep(0.2)

    def __enter__(self) -> Acker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def diagnostics(client: httpx.Client, name: str, proc: PlannerProcess) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"deployment": name, "limit": 1000}
        if cursor is not None:
            params["cursor"] = cursor
        page = expect(client.get("/diagnostics", params=params), 200, proc)
        items.extend(page["items"])
        cursor = page.get("next_cursor")
        if cursor is None:
            return items


def test_serve_runs_the_fleet_step_and_shows_who_is_cut(database: str, tmp_path: Path) -> None:
    frontends = {n: RampingFrontend(start_rps=20, growth=0.05) for n in NAMES}
    for f in frontends.values():
        f.__enter__()
    proc = None
    try:
        config = write_config(tmp_path / "fleet.yaml", fleet_file({n: f.url for n, f in frontends.items()}))
        proc = start_or_fail(
            PlannerProcess(database, config, tokens=TOKENS, log_path=tmp_path / "planner.log")
        )
        snapshots: list[dict[str, Any]] = []
        ackers = {n: Acker(proc.base_url, n).__enter__() for n in NAMES}
        with httpx.Client(base_url=proc.base_url, headers=VIEWER, timeout=10) as client:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                fleet = expect(client.get("/fleet"), 200, proc)
                snapshots.append(fleet)
                members = {m["deployment"]: m for m in fleet["members"]}
                if members.get("batch", {}).get("cut") and any(
                    c["by"] == "chat" for c in members["batch"]["cut_by"]
                ):
                    break
                time.sleep(0.5)
            else:
                raise AssertionError(f"batch was never cut by chat: {snapshots[-1]}\n" + logs(proc))

            # GET /fleet: the budget, the cut deployment, its reason and who cut it.
            [budget] = fleet["budgets"]
            assert budget["gpu_type"] == "h200" and budget["budget_gpus"] == BUDGET_GPUS
            assert fleet["leader"] is True
            assert sum(m["wish_gpus"] for m in members.values()) > BUDGET_GPUS
            batch = members["batch"]
            assert {r["reason"] for r in batch["roles"].values() if r["cut"]} == {"cut_budget"}
            chat_cut = next(c for c in batch["cut_by"] if c["by"] == "chat")
            assert chat_cut["why"] == "higher priority (3 > 1)"
            for snapshot in snapshots:
                for b in snapshot["budgets"]:
                    assert b["granted_gpus"] <= b["budget_gpus"], snapshot

            # GET /deployments: the same grant and reasons per deployment.
            listed = {d["name"]: d for d in expect(client.get("/deployments"), 200, proc)}
            assert listed["batch"]["fleet"]["cut"] is True
            assert listed["batch"]["fleet"]["deployment"] == "batch"
            assert any(c["by"] == "chat" for c in listed["batch"]["fleet"]["cut_by"])

            # /metrics: the budget, and batch's cut flag on a role that is cut.
            text = client.get("/metrics").text
            assert f'dynamo_planner_fleet_budget_gpus{{gpu_type="h200"}} {float(BUDGET_GPUS)}' in text
            cut_role = next(r for r, g in batch["roles"].items() if g["cut"])
            assert f'dynamo_planner_fleet_cut{{deployment="batch",role="{cut_role}"}} 1.0' in text
            assert 'dynamo_planner_fleet_granted_gpus{deployment="chat",role="prefill"}' in text
            assert 'dynamo_planner_fleet_wish_engines{deployment="batch",role="prefill"}' in text

            # A tick the budget held down says so. Whether a decision follows such a tick depends
            # on timing (a decision is made only when the target changes), so the ticks are read;
            # a decision made at one carries the tick's note (tests/api/test_fleet_api.py checks
            # that deterministically).
            def budget_notes() -> list[str]:
                return [
                    row["record"]["fleet"]["note"]
                    for row in diagnostics(client, "batch", proc)
                    if row["record"]["fleet"] and row["record"]["fleet"]["binding"]
                ]

            def held_by_chat(notes: list[str]) -> bool:
                return any("cut_budget" in n and "chat: higher priority (3 > 1)" in n for n in notes)

            deadline = time.monotonic() + 60
            while not held_by_chat(notes := budget_notes()) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert held_by_chat(notes), f"no tick of batch was held down by the budget: {notes}\n" + logs(
                proc
            )

            # Every tick ran under a grant, decided within it; the grants of each fleet step
            # (the ticks name the step by its time) add up to no more than the budget.
            per_step: dict[str, dict[str, int]] = defaultdict(dict)
            decided = 0
            rows_of = {name: diagnostics(client, name, proc) for name in NAMES}
            reasons_of = {  # read after the ticks, so every decision a tick names is here
                name: {
                    d["id"]: d["reasons"]
                    for d in expect(
                        client.get("/decisions", params={"deployment": name, "limit": 1000}), 200, proc
                    )["items"]
                }
                for name in NAMES
            }
            for name in NAMES:
                for row in rows_of[name]:
                    fleet_rec, target = row["record"]["fleet"], row["record"]["target"]
                    if fleet_rec is None:
                        continue  # a tick before the first fleet step stored its grants
                    per_step[fleet_rec["granted_at"]][name] = fleet_rec["granted_gpus"]
                    if row["decision_id"] is not None:
                        decided += 1
                        for role, n in target.items():
                            assert n <= fleet_rec["roles"][role]["granted"], (name, row["record"])
                        if fleet_rec["note"]:
                            reasons = reasons_of[name][row["decision_id"]]
                            assert f"fleet: {fleet_rec['note']}" in reasons, (name, row["record"], reasons)
            assert decided >= 1
            assert per_step and all(sum(g.values()) <= BUDGET_GPUS for g in per_step.values()), per_step

        # The dashboard's fleet panel, as headless Chromium shows it (where it is installed).
        if CHROMIUM is not None:
            token = VIEWER["Authorization"].removeprefix("Bearer ")
            dom = chromium(tmp_path, f"{proc.base_url}/dashboard#token={token}", "--dump-dom")
            panel = FleetPanel()
            panel.feed(dom)
            assert panel.shown, dom[:3000]
            assert panel.rows.keys() == set(NAMES), panel.rows
            cut, text = panel.rows["batch"]
            assert cut == "1" and "cut_budget" in text and "chat: higher priority (3 > 1)" in text, text
            # Each tick drawn once: no more ticks on the page than were stored by now (the page
            # polls several times within its time budget, each poll reading only newer ticks).
            with httpx.Client(base_url=proc.base_url, headers=VIEWER, timeout=10) as client:
                stored = sum(len(diagnostics(client, name, proc)) for name in NAMES)
            assert 0 < panel.ticks <= stored, (panel.ticks, stored)
    finally:
        for acker in locals().get("ackers", {}).values():
            acker.__exit__(None, None, None)
        if proc is not None:
            proc.stop()
        for f in frontends.values():
            f.__exit__(None, None, None)
