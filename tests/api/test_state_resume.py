"""A restarted planner, or one taking over a deployment's lease, resumes what the last leader
learned: the state is saved with every stored tick and restored when the lease is taken."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest

from app.store import planner_state as state_store
from app.workers.gather import Gathered
from tests.support import REPO_ROOT, demo_config
from tests.unit.test_planner import _input

pytestmark = pytest.mark.anyio

H200 = str(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8")


def _config(**scaling) -> dict:
    return demo_config(
        profile=H200,
        sla={"ttft_ms": 1000, "itl_ms": 30},
        prefill={"min_replicas": 1, "max_replicas": 32},
        decode={"min_replicas": 1, "max_replicas": 32},
        scaling={"algorithm": "sla", "interval_s": 5.0, **scaling},
    )


async def _tick(api, i: int):
    inp = _input(i)
    gathered = Gathered(traffic=inp.traffic, fpm=dict(inp.fpm), ready=dict(inp.ready))
    return await asyncio.to_thread(api.app.state.workers["demo"].tick, api.clock.now(), gathered)


async def test_a_new_leader_resumes_the_learned_state(make_api, caplog) -> None:
    first = await make_api(_config())
    for i in range(20):
        await _tick(first, i)
        first.clock.advance(5)
    learned = first.app.state.workers["demo"].planner.state.sla
    assert learned.scale and len(learned.history) == 20 - 12
    with first.app.state.session_factory() as session:
        saved = state_store.load_state(session, deployment="demo")
    assert saved is not None and saved.saved_at == first.clock.now() - timedelta(seconds=5)

    # A second planner process on the same database, after the first one's lease expired.
    second = await make_api(_config(), start=first.clock.now() + timedelta(seconds=60))
    worker = second.app.state.workers["demo"]
    with caplog.at_level(logging.INFO, logger="app.workers.loop"):
        assert await _tick(second, 20) is not None
    assert "resumed the learned state saved at" in caplog.text
    resumed = worker.planner.state.sla
    assert set(resumed.scale) == set(learned.scale) == {"prefill", "decode"}
    assert resumed.lead_s == learned.lead_s and resumed.first_s == learned.first_s
    assert list(resumed.history)[: len(learned.history)] == list(learned.history)
    assert len(resumed.history) == len(learned.history) + 1


async def test_a_changed_deployments_file_starts_afresh(make_api, caplog) -> None:
    first = await make_api(_config())
    for i in range(3):
        await _tick(first, i)
        first.clock.advance(5)
    second = await make_api(_config(forecast_cap=3.0), start=first.clock.now() + timedelta(seconds=60))
    with caplog.at_level(logging.INFO, logger="app.workers.loop"):
        await _tick(second, 3)
    assert "not resumed: saved under other settings" in caplog.text
    assert second.app.state.workers["demo"].planner.state.sla.first_s == second.clock.now().timestamp()
