"""Start-up waits for the traffic source (no fixed sleep) and /readyz says why; a source that
answers garbage mid-run gives no decision and a reason; predictors warm from a trace file."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from app.config import ConfigError, DeploymentsFile
from app.planner_setup import build_planner
from app.workers.loop import STARTUP_RETRY_S
from tests.support import REPO_ROOT, demo_config
from tests.support_frontend import Canned, StandInServer

pytestmark = pytest.mark.anyio

H200 = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")
MOONCAKE = REPO_ROOT / "data" / "traces" / "mooncake_trace_arxiv_first1000.jsonl"
HTML = Canned(status=200, body=b"<html><body>Sign in</body></html>", content_type="text/html")
EMPTY_VECTOR = Canned(
    body=json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode(),
    content_type="application/json",
)


async def eventually(condition: Callable[[], bool], what: str) -> None:
    for _ in range(500):  # a bounded wait, not a timing assertion
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


async def ticks(api) -> list[dict]:
    return (await api.client.get("/diagnostics", params={"deployment": "demo"})).json()["items"]


async def test_start_up_waits_for_the_source_and_readyz_says_why(make_api) -> None:
    with StandInServer() as prometheus:
        prometheus.answer = HTML
        config = demo_config(profile=H200, sources={"prometheus": {"url": prometheus.url}})
        api = await make_api(config)
        worker = api.app.state.workers["demo"]
        worker.start()
        try:
            await eventually(lambda: worker.startup_problems != [], "the first start-up check")
            (problem,) = worker.startup_problems
            assert problem.startswith("traffic source not answering: prometheus:"), problem
            ready = (await api.client.get("/readyz")).json()
            assert problem in ready["deployments"]["demo"]
            assert await ticks(api) == []  # nothing ticks before the source answers

            # Prometheus answers properly: at the next retry the loop starts and ticks.
            prometheus.answer = EMPTY_VECTOR
            api.clock.advance(STARTUP_RETRY_S)
            await eventually(lambda: worker.last_tick_at is not None, "the first tick")
            assert worker.startup_problems == []
            (tick,) = await ticks(api)
            throughput = tick["record"]["throughput"]
            # No series matched: the count is unknown, which is not zero traffic.
            assert (throughput["reason"], throughput["detail"]) == (
                "no_traffic_data",
                "request count unknown for this interval",
            )

            # Garbage mid-run: no decision, the reason in the record and in /readyz.
            prometheus.answer = HTML
            api.clock.advance(worker.interval_s)
            await eventually(lambda: len(worker.source_error or "") > 0, "the failing observation")
            await eventually(lambda: worker.last_tick_at == api.clock.now(), "the second tick")
            second = (await ticks(api))[-1]["record"]["throughput"]
            assert second["reason"] == "no_traffic_data"
            assert second["detail"].startswith("prometheus:") and "html" in second["detail"].lower(), second
            ready = (await api.client.get("/readyz")).json()
            assert f"traffic source failing: {worker.source_error}" in ready["deployments"]["demo"]
            assert (await api.client.get("/decisions")).json()["items"] == []
        finally:
            await worker.stop()


def _deployment(**throughput: object):
    config = demo_config(profile=H200, throughput={"interval_s": 60, **throughput})
    return DeploymentsFile.model_validate(config).deployments[0]


def test_predictors_warm_from_a_trace_file() -> None:
    planner = build_planner(_deployment(warmup_trace=str(MOONCAKE)), base_dir=Path("/"))
    predictor = planner.state.predictor
    assert predictor is not None
    # Independently: the Mooncake slice spans 0..177 s, so 60 s buckets give 3 intervals with requests.
    stamps = [json.loads(line)["timestamp"] / 1000 for line in MOONCAKE.read_text().splitlines()]
    buckets = {int((t - min(stamps)) // 60) for t in stamps}
    assert predictor.history_len == len(buckets) == 3
    forecast = predictor.forecast()
    last = [t for t in stamps if (t - min(stamps)) // 60 == max(buckets)]
    assert forecast is not None and forecast.num_req == len(last)  # constant: the last interval


def test_a_broken_warmup_trace_stops_start_up_naming_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "trace.jsonl"
    broken.write_text('{"timestamp": 0, "input_length": "many", "output_length": 5}\n')
    with pytest.raises(ConfigError) as raised:
        build_planner(_deployment(warmup_trace=str(broken)), base_dir=tmp_path)
    message = str(raised.value)
    assert message.startswith("deployment 'demo': throughput.warmup_trace: ")
    assert str(broken) in message and "input_length" in message


def test_a_broken_profile_stops_start_up_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        build_planner(
            DeploymentsFile.model_validate(demo_config(profile=str(tmp_path / "nope"))).deployments[0],
            base_dir=tmp_path,
        )
    assert str(raised.value).startswith("deployment 'demo': profile: ")
