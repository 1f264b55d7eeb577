"""The planner's tick with the seed's modes: load decides on load ticks, throughput sets its floor."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.perf.interpolation import PerfModel
from app.core.planner import Planner, PlannerSettings, TickInput
from app.core.seed.load_models import LoadModels
from app.core.seed.load_types import LoadSettings
from app.core.seed.predictors import TrafficPredictor
from app.core.seed.replicas import plan_replicas
from app.core.seed.throughput import ThroughputSettings
from app.core.types import DecisionSource, RoleBounds, TrafficObservation
from app.sources.profile_files import load_profile
from tests.unit.test_load_scaling import DECODE, FAST_PREFILL, NOW_S, decode_tick, prefill_tick

H200 = Path(__file__).resolve().parents[2] / "data" / "profiles" / "h200-llama3.1-8b-fp8"
BOUNDS = {"prefill": RoleBounds(1, 20), "decode": RoleBounds(1, 20)}


@pytest.fixture(scope="module")
def model() -> PerfModel:
    return PerfModel.from_profile(load_profile(H200))


def _planner(model: PerfModel, *, throughput: bool, load: bool, ttft_ms: float = 100.0) -> Planner:
    """Both modes' first tick is at the planner's first tick (as in the service)."""
    models = None
    if load:
        models = LoadModels("disagg")
        models.observe_many({"prefill": FAST_PREFILL, "decode": DECODE})
    settings = PlannerSettings(
        deployment="d",
        roles=("prefill", "decode"),
        bounds=BOUNDS,
        gpus_per_engine={"prefill": 1, "decode": 1},
        tick_interval_s=5.0,
        throughput=(
            ThroughputSettings(interval_s=60, itl_target_ms=50, correction=False, gpus_per_engine={})
            if throughput
            else None
        ),
        load=(
            LoadSettings(
                mode="disagg",
                ttft_target_ms=ttft_ms,
                itl_target_ms=100.0,
                bounds=BOUNDS,
                max_num_batched_tokens=2048,
            )
            if load
            else None
        ),
        load_interval_s=5.0 if load else None,
    )
    predictor = TrafficPredictor("constant", {}) if throughput else None
    return Planner(settings, model=model, predictor=predictor, load_models=models)


def _input(prefill_fpm=None, decode_fpm=None, *, num_req: float | None = None) -> TickInput:
    fpm = {"prefill": prefill_fpm or {}, "decode": decode_fpm or {}}
    traffic = None
    if num_req is not None:
        traffic = TrafficObservation(
            duration_s=60, num_req=num_req, isl=3000, osl=150, ttft_ms=100, itl_ms=20
        )
    return TickInput(
        now_s=NOW_S,
        traffic=traffic,
        fpm=fpm,
        fpm_new={role: list(records.values()) for role, records in fpm.items()},
        ready={"prefill": 2, "decode": 2},
    )


def test_a_load_tick_decides_by_load(model) -> None:
    # Prefill queues far over a 100 ms TTFT on both engines: one more prefill engine; decode at
    # 8000 KV tokens each could not absorb a removed engine (§10.2 C5): it stays.
    effects = _planner(model, throughput=False, load=True).on_tick(
        _input(prefill_tick(2, 30_000), decode_tick(2, 8000))
    )
    assert effects.target == {"prefill": 3, "decode": 2}
    assert effects.source == DecisionSource.LOAD
    assert effects.diagnostics.load.reason == "scale_up"
    assert effects.diagnostics.throughput is None


def test_with_both_modes_throughput_sets_the_floor_and_load_decides_above_it(model) -> None:
    expected = plan_replicas(
        model=model, num_req=6000, interval_s=60, isl_tokens=3000, osl_tokens=150, itl_target_ms=50
    )
    assert expected.num_prefill > 3  # the case: the floor is above what load alone would keep
    planner = _planner(model, throughput=True, load=True, ttft_ms=1000)
    effects = planner.on_tick(_input(prefill_tick(2, 0), decode_tick(2, 1500), num_req=6000))
    floor = {"prefill": expected.num_prefill, "decode": expected.num_decode}
    assert effects.diagnostics.throughput.reason == "set_lower_bound"
    assert effects.state.floor == floor
    assert effects.diagnostics.load.throughput_floor == floor
    assert effects.target["prefill"] == expected.num_prefill
    assert effects.source == DecisionSource.LOAD


def test_a_throughput_tick_without_load_data_sets_the_floor_and_load_decides_nothing(model) -> None:
    planner = _planner(model, throughput=True, load=True)
    effects = planner.on_tick(_input(num_req=6000))
    assert effects.target is None
    assert effects.state.floor is not None
    assert effects.diagnostics.throughput.reason == "set_lower_bound"
    assert effects.diagnostics.load.reason == "no_fpm_data"


def test_throughput_alone_still_decides(model) -> None:
    effects = _planner(model, throughput=True, load=False).on_tick(_input(num_req=6000))
    assert effects.source == DecisionSource.THROUGHPUT
    assert effects.target is not None
    assert effects.state.floor is None
    assert effects.diagnostics.throughput.reason == "scale"


def test_the_floor_stays_for_the_load_ticks_in_between(model) -> None:
    """Throughput runs every 60 s, load every 5 s: the floor of the last throughput step holds."""
    planner = _planner(model, throughput=True, load=True, ttft_ms=1000)
    first = planner.on_tick(_input(num_req=6000))
    planner.commit(first)
    assert first.next_tick.at_s == NOW_S + 5 and first.next_tick.needs.traffic_window_s is None
    later = TickInput(
        now_s=NOW_S + 5,
        fpm={"prefill": prefill_tick(2, 0), "decode": decode_tick(2, 1500)},
        ready={"prefill": 2, "decode": 2},
    )
    effects = planner.on_tick(later)
    assert effects.diagnostics.throughput is None
    assert effects.diagnostics.load.throughput_floor == first.state.floor
