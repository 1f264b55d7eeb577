"""Cost figures agree across the replay summary, `/diagnostics/cost` and `/metrics` on the same
ticks: a replay of the planner (through app/embedding.py, as `planner replay` runs it) writes its
summary.json; its tick records, which carry the cost account the service keeps, are stored as
the service stores ticks; a real `planner serve` on that store takes the deployment's lease,
resumes the account from the last stored tick and answers over HTTP."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml

from app.config import REPO_ROOT
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
from app.sim.replay.outputs import summarize, write_outputs
from app.sim.replay.run import build_world, load_requests, make_policy, run_policy
from app.store import ticks as tick_store
from app.store.db import make_engine, make_session_factory
from tests.support import TOKENS, VIEWER, PlannerProcess, log_tail, start_or_fail, write_config

MOONCAKE = REPO_ROOT / "data" / "traces" / "mooncake_trace_arxiv_first1000.jsonl"
PRICE = 2.5  # not 1, so that a cost that is only GPU-hours would show


def read_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def replay_ticks(tmp_path: Path) -> tuple[dict, list[dict], Path]:
    """summary.json of a planner replay at PRICE, and its tick records."""
    config_path = tmp_path / "replay.yaml"
    raw = read_yaml(DEFAULT_REPLAY_CONFIG)
    raw["deployments"][0]["cost_per_gpu_hour"] = PRICE
    raw["deployments"][0]["profile"] = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")
    write_config(config_path, raw)
    config = with_overrides(
        load_replay_config(config_path, None), rate_scale=3, startup_delay_s=30, ttft_ms=2000
    )
    requests = load_requests(config, MOONCAKE)
    world = build_world(config, requests)
    policy = make_policy("planner", world)
    result = run_policy(world, policy, trace_name=MOONCAKE.name)
    out = tmp_path / "out"
    out.mkdir()
    write_outputs(result, out, summary=summarize(result, truth=world.truth))
    return json.loads((out / "summary.json").read_text()), policy.ticks, config_path


def metric_values(text: str, name: str) -> dict[str, float]:
    """{labels: value} of one metric in a Prometheus exposition."""
    out = {}
    for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE):
        out[m.group(1)] = float(m.group(2))
    return out


@pytest.mark.timeout(300)
def test_replay_summary_diagnostics_and_metrics_agree_on_the_same_ticks(tmp_path: Path, sqlite_dbs) -> None:
    summary, ticks, config_path = replay_ticks(tmp_path)
    assert len(ticks) > 20
    # The replay bills its engines by the simulator's rule, its cost at the price.
    assert summary["cost_per_gpu_hour"] == PRICE
    assert sum(summary["gpu_hours_by_role"].values()) == pytest.approx(summary["gpu_hours"], rel=1e-9)
    assert summary["cost"] == pytest.approx(PRICE * summary["gpu_hours"], rel=1e-9)

    # The ticks, stored as the service stores them.
    url = sqlite_dbs.fresh()
    engine = make_engine(url)
    with make_session_factory(engine)() as session, session.begin():
        for record in ticks:
            tick_store.add_tick(
                session, deployment="replay", at=datetime.fromisoformat(record["at"]), record=record
            )
    engine.dispose()
    first, last = (datetime.fromisoformat(ticks[i]["at"]) for i in (0, -1))

    # `planner serve` on that store: no traffic source, no inventory, no FPM, so its own ticks
    # bill nothing (an unknown count is not billed), and the gap since 2000 is unobserved.
    serve_config = write_config(
        tmp_path / "serve.yaml", {"deployments": read_yaml(config_path)["deployments"]}
    )
    proc = start_or_fail(PlannerProcess(url, serve_config, tokens=TOKENS, log_path=tmp_path / "serve.log"))
    try:
        with httpx.Client(base_url=proc.base_url, headers=VIEWER, timeout=30) as client:
            window = {
                "deployment": "replay",
                "since": first.isoformat(),
                "until": (last + timedelta(seconds=1)).isoformat(),
            }
            cost = client.get("/diagnostics/cost", params=window)
            assert cost.status_code == 200, cost.text + log_tail(proc)
            report = cost.json()
            stored = client.get("/diagnostics", params={**window, "limit": 1}).json()["items"][-1]
            totals = stored["record"]["cost"]["totals"]
            # The leader resumed the account of the last stored tick (its lease check comes first).
            for _ in range(100):
                text = client.get("/metrics").text
                hours = metric_values(text, "dynamo_planner_gpu_hours_total")
                if hours:
                    break
                time.sleep(0.1)
            spent = metric_values(text, "dynamo_planner_cost_total")
    finally:
        proc.stop()

    assert report["ticks"] == len(ticks)
    assert report["cost_per_gpu_hour"] == PRICE
    # /diagnostics/cost over all the ticks, the last tick's account and /metrics: one figure.
    for role in ("prefill", "decode"):
        assert report["gpu_hours"][role] == pytest.approx(totals["gpu_s"][role] / 3600, rel=1e-9)
        assert hours[f'deployment="replay",role="{role}"'] == pytest.approx(
            report["gpu_hours"][role], rel=1e-9
        )
    assert report["cost"] == pytest.approx(totals["cost"], rel=1e-9)
    assert spent['deployment="replay"'] == pytest.approx(report["cost"], rel=1e-9)
    assert report["cost"] == pytest.approx(PRICE * report["gpu_hours_total"], rel=1e-9)

    # ... and the replay's. The account bills from the first tick to the last at each tick's
    # counts; the simulator from t = 0 to the last request's end at every change: they differ by
    # the run's first and last seconds and by changes between ticks (2.6% here), not by a rule.
    assert report["cost"] == pytest.approx(summary["cost"], rel=0.05)
    for role in ("prefill", "decode"):
        assert report["gpu_hours"][role] == pytest.approx(summary["gpu_hours_by_role"][role], rel=0.05)
    # The figures the report adds: the history's peak held, idle engines seen in FPM.
    assert report["static_cost"] > report["cost"] > 0
    assert report["idle_share"] is not None and 0 < report["idle_share"] < 1
