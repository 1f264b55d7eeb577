"""Shadow mode end to end over real HTTP: a real `planner serve` in shadow mode beside an
incumbent autoscaler that sets the replicas its own way, on SQLite and PostgreSQL.

- Kubernetes: the API stand-in (tests/k8s_standin.py) holds the DGD; the test plays an HPA and
  changes its services' replicas (and, as the operator would once the pods serve, their status).
- Virtual: the test plays an orchestrator that runs its own counts and reports them with
  progress reports; its attempt to acknowledge a shadow decision is refused.

The planner decides as usual (SLA scaling on the bundled H200 profile, traffic from a stand-in
frontend serving a real trace). In both, nothing reaches the cluster: the stand-in records no
PATCH, no decision is acknowledged. The shadow report's agreement shares and engine-, GPU-hours
and cost are then counted again by the test from the same tick records, read through the API
(`/diagnostics` and `/decisions`): the incumbent's counts from what each tick read as ready, the
planner's from the decision in force after each tick, none from the shadow section itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_kubernetes_connector import (
    FRONTEND,
    NS,
    TOKEN,
    connector_settings,
    dgd_object,
    worker,
)
from tests.k8s_standin import DGD, KubeStandIn
from tests.support import (
    ORCH,
    REPO_ROOT,
    TOKENS,
    VIEWER,
    PlannerProcess,
    demo_config,
    expect,
    log_tail,
    poll,
    start_or_fail,
    write_config,
)
from tests.support_frontend import MODEL, FrontendExporter, load_trace

H200 = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")
PRICE = 2.5
INTERVAL_S = 0.5
TICKS_PER_PHASE = 6
ROLES = ("prefill", "decode")
MAX_BILLED_GAP_S = 900.0  # the cost account's, which the report bills by (docs/operations.md)


class Traffic:
    """The frontend's requests: a slice of the trace every 0.2 s, in a thread, until stopped."""

    def __init__(self, frontend: FrontendExporter) -> None:
        self.frontend = frontend
        self.requests = load_trace(limit=1000)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        at = 0
        while not self._stop.wait(0.2):
            batch = [self.requests[(at + i) % len(self.requests)] for i in range(2)]
            at += 2
            self.frontend.serve_requests(batch)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def shadow_file(tmp_path: Path, connector: dict[str, Any], frontend: FrontendExporter) -> Path:
    """`demo` in shadow mode, and `ctl`, a deployment in control mode beside it."""
    config = demo_config(
        connector=connector,
        profile=H200,
        model_name=MODEL.lower(),
        cost_per_gpu_hour=PRICE,
        decode={"gpus_per_engine": 2, "min_replicas": 1, "max_replicas": 8},
        scaling={"algorithm": "sla", "interval_s": INTERVAL_S},
        sources={"frontend_url": frontend.url},
    )
    config["deployments"].append(demo_config(name="ctl")["deployments"][0])
    return write_config(tmp_path / "planner.yaml", config)


@pytest.fixture
def frontend() -> Iterator[FrontendExporter]:
    with FrontendExporter() as exporter, Traffic(exporter):
        yield exporter


@pytest.fixture
def serve(db_url: str, tmp_path: Path) -> Iterator[Callable[[Path], PlannerProcess]]:
    procs: list[PlannerProcess] = []

    def start(config: Path) -> PlannerProcess:
        proc = PlannerProcess(db_url, config, tokens=TOKENS, log_path=tmp_path / "planner.log")
        procs.append(proc)
        return start_or_fail(proc)

    yield start
    for proc in procs:
        proc.stop()


# --- reading back ----------------------------------------------------------------------------------


def tick_count(client: httpx.Client) -> int:
    items = client.get("/diagnostics", params={"deployment": "demo", "limit": 1}).json()["items"]
    return items[-1]["id"] if items else 0


def wait_ticks(client: httpx.Client, proc: PlannerProcess, ticks: int = TICKS_PER_PHASE) -> None:
    start = tick_count(client)
    poll(lambda: tick_count(client) >= start + ticks, f"{ticks} more ticks", proc, steps=2000)


def latest_decision(client: httpx.Client) -> dict[str, Any] | None:
    r = client.get("/decisions/wait", headers=ORCH, params={"deployment": "demo", "timeout_s": 0})
    return r.json() if r.status_code == 200 else None


def decisions(client: httpx.Client) -> list[dict[str, Any]]:
    page = client.get("/decisions", params={"deployment": "demo", "limit": 1000}).json()
    assert page["next_cursor"] is None
    return page["items"]


def report_and_records(client: httpx.Client, proc: PlannerProcess) -> tuple[dict, list[dict], list[dict]]:
    """The report over the last day, then the ticks it covered (up to its last tick: later
    ticks may have been stored since) and every decision."""
    report = expect(client.get("/deployments/demo/shadow", params={"window_s": 86400}), 200, proc)
    until = datetime.fromisoformat(report["last_tick"]) + timedelta(microseconds=1)
    params = {"deployment": "demo", "since": report["since"], "until": until.isoformat(), "limit": 1000}
    ticks = expect(client.get("/diagnostics", params=params), 200, proc)
    assert ticks["next_cursor"] is None
    return report, ticks["items"], decisions(client)


def counts_of(decision: dict[str, Any]) -> dict[str, int]:
    return {role: decision[f"num_{role}"] for role in ROLES}


def check_report_by_hand(report: dict, ticks: list[dict], made: list[dict], gpus: dict[str, int]) -> None:
    """Count agreements and engine-hours from the raw records and compare with the report."""
    by_id = {d["id"]: counts_of(d) for d in made}
    rows = []
    for tick in ticks:
        record = tick["record"]
        # What ran: what the tick read as ready (unknown when nothing reported).
        ran = record["sla"]["ready"] if record["ready_source"] is not None else None
        # What the planner would have ordered: the decision in force after the tick.
        in_force = record["decision_id"] or record["latest_decision_id"]
        ordered = by_id.get(in_force) if in_force else None
        rows.append((datetime.fromisoformat(tick["at"]).timestamp(), ran, ordered))
    assert report["ticks"] == len(rows) > 3 * TICKS_PER_PHASE

    compared = [(ran, ordered) for _, ran, ordered in rows if ran is not None and ordered is not None]
    exact = sum(1 for ran, ordered in compared if ran == ordered)
    within = sum(1 for ran, ordered in compared if all(abs(ran[r] - ordered[r]) <= 1 for r in ROLES))
    assert report["compared"] == len(compared) > 0
    assert report["agreement_exact"] == pytest.approx(exact / len(compared))
    assert report["agreement_within_one"] == pytest.approx(within / len(compared))
    # The incumbent ran 0 engines for a while, below the planner's minimum of 1: not every tick agrees.
    assert exact < len(compared)

    for side, index in (("incumbent", 1), ("planner", 2)):
        engine_s = {r: 0.0 for r in ROLES}
        for before, after in pairwise(rows):
            counts, dt = before[index], after[0] - before[0]
            if counts is not None and 0 < dt <= MAX_BILLED_GAP_S:
                for role in ROLES:
                    engine_s[role] += counts[role] * dt
        hours = {r: s / 3600 for r, s in engine_s.items()}
        out = report[side]
        for role in ROLES:
            assert out["engine_hours"].get(role, 0.0) == pytest.approx(hours[role], rel=1e-9, abs=1e-12)
            assert out["gpu_hours"].get(role, 0.0) == pytest.approx(
                hours[role] * gpus[role], rel=1e-9, abs=1e-12
            )
        gpu_hours = sum(hours[r] * gpus[r] for r in ROLES)
        assert out["cost"] == pytest.approx(PRICE * gpu_hours, rel=1e-9)
        # The mean of the predictions the ticks recorded (the planner's model: each is checked
        # in tests/unit/test_shadow.py); the caveat goes with them.
        for role in ROLES:
            values = [
                row[f"attainment_{side}"]
                for t in ticks
                if (row := t["record"]["shadow"]["roles"][role])[f"attainment_{side}"] is not None
            ]
            mean = out["mean_predicted_attainment"][role]
            assert mean == (pytest.approx(sum(values) / len(values)) if values else None)
    assert "not a measurement" in report["caveat"]


def check_bad_requests(client: httpx.Client, proc: PlannerProcess) -> None:
    for window in ("0", "86401", "soon", "-5"):
        r = client.get("/deployments/demo/shadow", params={"window_s": window})
        assert r.status_code == 422, r.text
        assert "window_s" in r.text
    r = client.get("/deployments/nope/shadow")
    assert r.status_code == 404 and "nope" in r.json()["detail"]
    r = client.get("/deployments/ctl/shadow")
    assert r.status_code == 409, r.text
    assert "does not run in shadow mode" in r.json()["detail"]


# --- the incumbents ---------------------------------------------------------------------------------


def dgd_at(prefill: int, decode: int) -> dict[str, Any]:
    """The DGD with its services set to these replicas, all of them available."""
    services = {
        "Frontend": dict(FRONTEND),
        "PrefillWorker": worker("prefill", prefill, resources={"limits": {"gpu": "1"}}),
        "DecodeWorker": worker("decode", decode, resources={"limits": {"gpu": "2"}}),
    }
    status = {
        "PrefillWorker": {"availableReplicas": prefill, "readyReplicas": prefill},
        "DecodeWorker": {"availableReplicas": decode, "readyReplicas": decode},
    }
    return dgd_object(services, service_status=status)


@pytest.mark.timeout(240)
def test_kubernetes_shadow_beside_an_hpa(
    serve: Callable[[Path], PlannerProcess], frontend: FrontendExporter, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    with KubeStandIn(token=TOKEN) as standin:
        standin.put(DGD.plural, NS, dgd_at(2, 2))
        connector = {**connector_settings(standin, token_file), "mode": "shadow"}
        proc = serve(shadow_file(tmp_path, connector, frontend))
        with httpx.Client(base_url=proc.base_url, headers=VIEWER, timeout=30) as client:
            wait_ticks(client, proc)
            # The HPA scales out, then in to nothing, then to what the planner would have ordered.
            for step in ((5, 4), (0, 0), None):
                if step is None:
                    wanted = latest_decision(client)
                    assert wanted is not None, log_tail(proc)
                    step = (wanted["num_prefill"], wanted["num_decode"])
                standin.put(DGD.plural, NS, dgd_at(*step))
                wait_ticks(client, proc)
            report, ticks, made = report_and_records(client, proc)
            check_bad_requests(client, proc)
            metrics = client.get("/metrics").text
        # Nothing was written to the cluster: the stand-in saw reads only.
        assert standin.patches() == []
        assert {r.method for r in standin.requests} == {"GET"}
    assert made and {d["status"] for d in made} == {"shadow"}
    # What ran is the DGD's replicas; every tick recorded them beside the planner's count.
    last = ticks[-1]["record"]["shadow"]["roles"]
    assert {r: last[r]["incumbent"] for r in ROLES} == ticks[-1]["record"]["sla"]["ready"]
    check_report_by_hand(report, ticks, made, gpus={"prefill": 1, "decode": 2})
    assert 'dynamo_planner_shadow_agreement{deployment="demo",kind="exact"}' in metrics
    assert 'dynamo_planner_shadow_engines{deployment="demo",role="prefill",source="incumbent"}' in metrics
    assert 'deployment="ctl"' not in "".join(
        line for line in metrics.splitlines() if line.startswith("dynamo_planner_shadow")
    )


@pytest.mark.timeout(240)
def test_virtual_shadow_beside_an_orchestrator_with_its_own_counts(
    serve: Callable[[Path], PlannerProcess], frontend: FrontendExporter, tmp_path: Path
) -> None:
    proc = serve(shadow_file(tmp_path, {"type": "virtual", "mode": "shadow"}, frontend))
    with httpx.Client(base_url=proc.base_url, headers=VIEWER, timeout=30) as client:
        poll(
            lambda: latest_decision(client) is not None,
            "the planner's first shadow decision",
            proc,
            steps=2000,
        )
        first = latest_decision(client)
        assert first is not None and first["status"] == "shadow"

        # The orchestrator may not acknowledge it: nobody applies a shadow decision, and nothing
        # of the refused acknowledgement is kept.
        ack = client.post(
            f"/decisions/{first['id']}/complete",
            headers=ORCH,
            params={"deployment": "demo"},
            json={"status": "succeeded", "observed": {"prefill": 9, "decode": 9}},
        )
        assert ack.status_code == 409, ack.text
        assert "shadow decision" in ack.json()["detail"] and "progress" in ack.json()["detail"]
        after = client.get(f"/decisions/{first['id']}", params={"deployment": "demo"}).json()
        assert (after["status"], after["observed"], after["completed_at"]) == ("shadow", None, None)

        def runs(prefill: int, decode: int) -> None:
            """The orchestrator reports what it runs (a progress report on the latest decision)."""
            latest = latest_decision(client)
            assert latest is not None
            expect(
                client.post(
                    f"/decisions/{latest['id']}/progress",
                    headers=ORCH,
                    params={"deployment": "demo"},
                    json={"observed": {"prefill": prefill, "decode": decode}},
                ),
                200,
                proc,
            )

        wait_ticks(client, proc)
        for step in ((5, 4), (0, 0), None):
            if step is None:
                wanted = latest_decision(client)
                assert wanted is not None
                step = (wanted["num_prefill"], wanted["num_decode"])
            runs(*step)
            wait_ticks(client, proc)
        report, ticks, made = report_and_records(client, proc)
        check_bad_requests(client, proc)
    # No decision was acknowledged or applied.
    assert {(d["status"], d["observed"], d["completed_at"]) for d in made} == {("shadow", None, None)}
    check_report_by_hand(report, ticks, made, gpus={"prefill": 1, "decode": 2})
