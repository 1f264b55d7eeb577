"""The core planner owns its learned state: a tick changes nothing until it is committed, so a tick
whose result was not stored can be retried and gives the same result; the state survives an
export and a restore; the input is never changed."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from app.config import DeploymentsFile
from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics
from app.core.planner import Planner, TickInput
from app.core.types import ActiveOverrides, DecisionSource, DecisionStatus, DecisionView, TrafficObservation
from app.planner_setup import build_planner
from tests.support import demo_config

H200 = Path(__file__).resolve().parents[2] / "data" / "profiles" / "h200-llama3.1-8b-fp8"
T0_S = 1_795_953_600.0
TICK_S = 5.0


def _planner(algorithm: str = "sla") -> Planner:
    raw = demo_config(
        profile=str(H200),
        sla={"ttft_ms": 1000, "itl_ms": 30},
        prefill={"min_replicas": 1, "max_replicas": 32},
        decode={"min_replicas": 1, "max_replicas": 32},
        scaling={"algorithm": algorithm, "interval_s": TICK_S},
        throughput={"enabled": True, "interval_s": 60, "predictor": {"type": "kalman"}},
        load={"enabled": True, "interval_s": TICK_S, "min_observations": 3},
    )
    return build_planner(DeploymentsFile.model_validate(raw).deployments[0], base_dir=Path("."))


def _input(i: int, *, latest: DecisionView | None = None) -> TickInput:
    """Tick `i`: traffic rising with i, one forward pass per engine that took 1.3x the profile."""
    rate = 20.0 + 4.0 * i
    traffic = TrafficObservation(
        duration_s=TICK_S,
        num_req=rate * TICK_S,
        isl=3000.0,
        osl=150.0,
        ttft_ms=300.0,
        itl_ms=20.0,
        request_duration_s=4.0,
        isl_buckets=((2048.0, rate * 2), (4096.0, rate * 2), (float("inf"), rate)),
    )
    prefill = ForwardPassMetrics(
        "p0",
        0,
        0.4 + 0.001 * i,
        ScheduledRequestMetrics(num_prefill_requests=2, sum_prefill_tokens=6000 + i),
        QueuedRequestMetrics(num_prefill_requests=3, sum_prefill_tokens=9000),
    )
    decode = ForwardPassMetrics(
        "d0",
        0,
        0.02 + 0.0001 * i,
        ScheduledRequestMetrics(num_decode_requests=64, sum_decode_kv_tokens=64 * 3100 + i),
    )
    return TickInput(
        now_s=T0_S + i * TICK_S,
        overrides=ActiveOverrides(bounds_id=2, bounds={"decode": {"max": 30}}),
        latest_decision=latest,
        traffic=traffic,
        fpm={"prefill": {("p0", 0): prefill}, "decode": {("d0", 0): decode}},
        fpm_new={"prefill": [prefill], "decode": [decode]},
        ready={"prefill": 1, "decode": 1},
    )


def _run(planner: Planner, ticks: range) -> list:
    effects = []
    for i in ticks:
        e = planner.on_tick(_input(i))
        planner.commit(e)
        effects.append(e)
    return effects


@pytest.mark.parametrize("algorithm", ["sla", "seed"])
def test_on_tick_does_not_change_its_input(algorithm: str) -> None:
    planner = _planner(algorithm)
    _run(planner, range(5))
    latest = DecisionView(7, {"prefill": 2, "decode": 3}, DecisionSource.SLA, DecisionStatus.PENDING, T0_S)
    inp = _input(5, latest=latest)
    before = copy.deepcopy(inp)
    planner.on_tick(inp)
    assert inp == before


@pytest.mark.parametrize("algorithm", ["sla", "seed"])
def test_a_tick_not_committed_changes_nothing_and_a_retry_gives_the_same_result(algorithm: str) -> None:
    planner = _planner(algorithm)
    _run(planner, range(30))  # long enough for SLA scaling to learn a scale, a lead and a headroom
    saved = planner.export_state()
    first = planner.on_tick(_input(30))
    assert planner.export_state() == saved, "an uncommitted tick changed the planner"
    retry = planner.on_tick(_input(30))
    assert (retry.target, retry.source, retry.stages) == (first.target, first.source, first.stages)
    assert retry.diagnostics == first.diagnostics
    planner.commit(retry)
    # The retried tick counted once: the planner goes on exactly as one that ticked once.
    once = _planner(algorithm)
    _run(once, range(31))
    assert planner.export_state() == once.export_state()
    assert planner.on_tick(_input(31)).diagnostics == once.on_tick(_input(31)).diagnostics


def test_the_sla_path_learns_what_the_retry_test_relies_on() -> None:
    """The case above must exercise learned state: a measured scale and the history."""
    planner = _planner("sla")
    effects = _run(planner, range(30))
    state = planner.state.sla
    assert state.scale["prefill"] != 1.0 and state.scale["decode"] != 1.0
    assert len(state.history) == 30 - int(60 / TICK_S)  # a full trend window before the first
    assert effects[-1].diagnostics.sla.demand.request_rate_s > 100


def test_the_seed_path_trains_once_per_committed_tick() -> None:
    planner = _planner("seed")
    _run(planner, range(3))
    models = planner.state.load_models
    assert models is not None
    counts = {role: m.num_observations for role, m in models.regressions.items()}
    planner.on_tick(_input(3))  # not committed
    assert {role: m.num_observations for role, m in planner.state.load_models.regressions.items()} == counts


@pytest.mark.parametrize("algorithm", ["sla", "seed"])
def test_export_and_restore_resume_the_learning(algorithm: str) -> None:
    planner = _planner(algorithm)
    _run(planner, range(25))
    restored = _planner(algorithm)
    restored.restore_state(planner.export_state())
    for i in range(25, 30):
        a, b = planner.on_tick(_input(i)), restored.on_tick(_input(i))
        assert (a.target, a.diagnostics) == (b.target, b.diagnostics)
        planner.commit(a)
        restored.commit(b)


def test_restore_refuses_another_deployments_state_or_garbage() -> None:
    planner = _planner()
    other = build_planner(
        DeploymentsFile.model_validate(demo_config(name="other", profile=str(H200))).deployments[0],
        base_dir=Path("."),
    )
    with pytest.raises(ValueError, match="deployment 'other'"):
        planner.restore_state(other.export_state())
    with pytest.raises(ValueError, match="not a planner state export"):
        planner.restore_state(b"not pickle")
    retuned = build_planner(
        DeploymentsFile.model_validate(
            demo_config(profile=str(H200), scaling={"algorithm": "sla", "interval_s": 10.0})
        ).deployments[0],
        base_dir=Path("."),
    )
    with pytest.raises(ValueError, match="other settings"):
        planner.restore_state(retuned.export_state())


@dataclass(frozen=True)
class InventoryCase:
    name: str
    why: str
    latest: DecisionView | None
    ready: dict[str, int] | None
    fpm: bool
    decides: bool


INVENTORY_CASES = [
    InventoryCase(
        "never_decided_nothing_reports",
        "a new deployment that nothing reports on runs nothing the planner knows of: its first decision "
        "orders what the demand needs (a virtual connector's orchestrator waits for that decision)",
        latest=None,
        ready=None,
        fpm=False,
        decides=True,
    ),
    InventoryCase(
        "decided_before_but_unacknowledged_and_expired",
        "once the planner has ordered, what runs depends on whether that order was carried out: an "
        "expired order says nothing, so no target until something reports",
        latest=DecisionView(4, {"prefill": 3, "decode": 3}, DecisionSource.SLA, DecisionStatus.EXPIRED, T0_S),
        ready=None,
        fpm=False,
        decides=False,
    ),
    InventoryCase(
        "decided_before_and_engines_report",
        "engines publishing forward passes in every role are an inventory of their own",
        latest=DecisionView(4, {"prefill": 3, "decode": 3}, DecisionSource.SLA, DecisionStatus.EXPIRED, T0_S),
        ready=None,
        fpm=True,
        decides=True,
    ),
]


@pytest.mark.parametrize("case", INVENTORY_CASES, ids=lambda c: c.name)
def test_sla_scaling_decides_only_when_it_knows_what_runs(case: InventoryCase) -> None:
    planner = _planner("sla")
    inp = _input(0, latest=case.latest)
    inp = replace(inp, ready=case.ready, overrides=ActiveOverrides())
    if not case.fpm:
        inp = replace(inp, fpm={}, fpm_new={})
    effects = planner.on_tick(inp)
    sla = effects.diagnostics.sla
    assert (sla.reason != "no_inventory") is case.decides, (case.why, sla.reason, sla.detail)
    assert (effects.target is not None) is case.decides, case.why
