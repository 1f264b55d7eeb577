"""One tick assembly: `planner serve`'s worker and the embedding (`planner replay`) run the same core
`Planner.on_tick`, so the same observations give the same decisions and the same diagnostics.

The observations are a simulated cluster's (the replay's world, driven by the embedding on a slice
of the bundled Azure trace), recorded tick by tick; the worker then gets exactly those, through
its own tick and store (SQLite here, PostgreSQL too under .ci/run), with the orchestrator's
acknowledgement arriving when the ready counts reach a decision, as the embedding's protocol
assumes. Every decision and every core field of every tick record must be equal.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from app.core.diagnostics import TickDiagnostics
from app.core.types import DecisionStatus
from app.embedding import EmbeddedPlanner, TickInput
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
from app.sim.replay.run import build_world, load_requests, make_policy, run_policy
from app.store import decisions as decision_store
from app.store.models import Tick
from app.workers.gather import Gathered
from tests.support import REPO_ROOT

pytestmark = pytest.mark.anyio

TRACE = REPO_ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
# The core's part of a tick record; `at`, `fpm` and `traffic` are each shell's own account.
CORE_FIELDS = (
    "version",
    "at_s",
    "deployment",
    "latest_decision_id",
    "latest_decision_status",
    "overrides",
    "bounds",
    "stages",
    "target",
    "throughput",
    "load",
    "sla",
    "verdict",
    "decision_id",
)


@dataclass(frozen=True)
class Recorded:
    inp: TickInput
    diagnostics: dict[str, Any]
    target: dict[str, int] | None


def _replay_slice(start_s: float, duration_s: float) -> tuple[Any, list[Recorded]]:
    """The replay's planner over the trace's first `duration_s`, with every tick's input and
    output; the embedder's clock starts at `start_s`, the worker's Unix time."""
    config = with_overrides(load_replay_config(DEFAULT_REPLAY_CONFIG), rate_scale=10)
    requests = [r for r in load_requests(config, TRACE) if r.arrival_s < duration_s]
    world = build_world(config, requests)
    policy = make_policy("planner", world)
    embedded: EmbeddedPlanner = policy.planner  # type: ignore[attr-defined]
    recorded: list[Recorded] = []
    inner = embedded.on_tick

    def on_tick(inp: TickInput):  # type: ignore[no-untyped-def]
        # The embedder's seconds from the worker's origin: both planners see the same times.
        moved = TickInput(start_s + inp.now_s, inp.traffic, inp.ready, inp.expected, inp.fpm)
        out = inner(moved)
        recorded.append(Recorded(moved, out.diagnostics, out.target))
        return replace(out, next_tick_s=out.next_tick_s - start_s)

    embedded.on_tick = on_tick  # type: ignore[method-assign]
    embedded.start_s = 0.0
    run_policy(world, policy, trace_name="slice")
    return config, recorded


def _worker_config(config: Any) -> dict[str, Any]:
    deployment = config.deployment.model_dump(mode="json")
    deployment["profile"] = str(config.resolve(config.deployment.profile))
    return {"deployments": [deployment]}


async def test_the_worker_and_the_embedding_decide_the_same_from_the_same_observations(make_api) -> None:
    start = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    config, recorded = await asyncio.to_thread(_replay_slice, start.timestamp(), 900.0)
    decided = [r for r in recorded if r.target is not None]
    assert len(recorded) > 150 and len(decided) >= 3, "the slice must exercise several decisions"

    api = await make_api(_worker_config(config), start=start)
    worker = api.app.state.workers[config.deployment.name]
    sf = api.app.state.session_factory
    name = config.deployment.name
    for r in recorded:
        now = datetime.fromtimestamp(r.inp.now_s, UTC)
        with sf() as session, session.begin():
            latest = decision_store.latest_decision(session, name)
            if (
                latest is not None
                and latest.status == DecisionStatus.PENDING
                and all(r.inp.ready.get(role) == n for role, n in decision_store.replicas_of(latest).items())
            ):
                decision_store.complete_decision(
                    session,
                    deployment=name,
                    decision_id=latest.decision_id,
                    status=DecisionStatus.SUCCEEDED,
                    observed=dict(r.inp.ready),
                    message="ready",
                    actor_role="orchestrator",
                    now=now,
                )
        gathered = Gathered(traffic=r.inp.traffic, fpm=dict(r.inp.fpm), ready=dict(r.inp.ready))
        report = await asyncio.to_thread(worker.tick, now, gathered)
        assert report is not None
        created = decision_store.replicas_of(report.decision) if report.decision is not None else None
        assert created == r.target, f"at {r.inp.now_s - start.timestamp():.0f} s"
        with sf() as session:
            stored = session.get(Tick, report.tick_id).record
        service = TickDiagnostics.read(stored).as_json()
        embedding = TickDiagnostics.read(r.diagnostics).as_json()
        for key in CORE_FIELDS:
            assert service[key] == embedding[key], f"{key} at {r.inp.now_s - start.timestamp():.0f} s"
