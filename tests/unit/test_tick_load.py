"""The tick chain with load scaling: load decides on load ticks, throughput sets its floor."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.interpolation import PerfModel
from app.core.load import LoadInput, LoadModels, LoadSettings, LoadTick
from app.core.replicas import plan_replicas
from app.core.throughput import ThroughputInput, ThroughputSettings
from app.core.tick import on_tick
from app.core.types import (
    ActiveOverrides,
    DecisionSource,
    RoleBounds,
    TickSnapshot,
    TrafficForecast,
    TrafficObservation,
)
from app.sources.profile_files import load_profile
from tests.unit.test_load_scaling import DECODE, FAST_PREFILL, NOW, decode_tick, prefill_tick

H200 = Path(__file__).resolve().parents[2] / "data" / "profiles" / "h200-llama3.1-8b-fp8"
BOUNDS = {"prefill": RoleBounds(1, 20), "decode": RoleBounds(1, 20)}


@pytest.fixture(scope="module")
def model() -> PerfModel:
    return PerfModel.from_profile(load_profile(H200))


def _load(prefill_fpm, decode_fpm, ready, *, ttft_ms=100.0, itl_ms=100.0) -> LoadTick:
    models = LoadModels("disagg")
    models.observe_many({"prefill": FAST_PREFILL, "decode": DECODE})
    models.observe_many({"prefill": prefill_fpm.values(), "decode": decode_fpm.values()})
    settings = LoadSettings(
        mode="disagg",
        ttft_target_ms=ttft_ms,
        itl_target_ms=itl_ms,
        bounds=BOUNDS,
        max_num_batched_tokens=2048,
    )
    return LoadTick(
        models, LoadInput(fpm={"prefill": prefill_fpm, "decode": decode_fpm}, ready=ready, now=NOW), settings
    )


def _throughput(model: PerfModel, num_req: float) -> tuple[ThroughputInput, ThroughputSettings]:
    obs = TrafficObservation(duration_s=60, num_req=num_req, isl=3000, osl=150, ttft_ms=100, itl_ms=20)
    forecast = TrafficForecast(num_req=num_req, isl=3000, osl=150)
    inp = ThroughputInput(observation=obs, observation_error=None, forecast=forecast, model=model)
    settings = ThroughputSettings(interval_s=60, itl_target_ms=50, correction=False, gpus_per_engine={})
    return inp, settings


def _snapshot(**kwargs) -> TickSnapshot:
    return TickSnapshot(
        deployment="d",
        roles=("prefill", "decode"),
        config_bounds=BOUNDS,
        overrides=ActiveOverrides(),
        latest_decision=None,
        **kwargs,
    )


def test_a_load_tick_decides_by_load(model) -> None:
    # Prefill queues far over a 100 ms TTFT on both engines: one more prefill engine; decode at
    # 8000 KV tokens each could not absorb a removed engine (§10.2 C5): it stays.
    load = _load(prefill_tick(2, 30_000), decode_tick(2, 8000), {"prefill": 2, "decode": 2})
    result = on_tick(_snapshot(load=load, load_enabled=True), NOW)
    assert result.target == {"prefill": 3, "decode": 2}
    assert result.source == DecisionSource.LOAD
    assert result.diagnostics["load"]["reason"] == "scale_up"
    assert result.diagnostics["throughput"] is None


def test_with_both_modes_throughput_sets_the_floor_and_load_decides_above_it(model) -> None:
    inp, settings = _throughput(model, 6000)
    expected = plan_replicas(
        model=model, num_req=6000, interval_s=60, isl_tokens=3000, osl_tokens=150, itl_target_ms=50
    )
    assert expected.num_prefill > 3  # the case: the floor is above what load alone would keep
    load = _load(prefill_tick(2, 0), decode_tick(2, 1500), {"prefill": 2, "decode": 2}, ttft_ms=1000)
    result = on_tick(
        _snapshot(throughput=inp, throughput_settings=settings, load=load, load_enabled=True), NOW
    )
    assert result.diagnostics["throughput"]["reason"] == "set_lower_bound"
    assert result.throughput_floor == {"prefill": expected.num_prefill, "decode": expected.num_decode}
    assert result.diagnostics["load"]["throughput_floor"] == result.throughput_floor
    assert result.target["prefill"] == expected.num_prefill
    assert result.source == DecisionSource.LOAD


def test_a_throughput_tick_without_load_sets_the_floor_and_decides_nothing(model) -> None:
    inp, settings = _throughput(model, 6000)
    result = on_tick(_snapshot(throughput=inp, throughput_settings=settings, load_enabled=True), NOW)
    assert result.target is None
    assert result.throughput_floor is not None
    assert result.diagnostics["throughput"]["reason"] == "set_lower_bound"


def test_throughput_alone_still_decides(model) -> None:
    inp, settings = _throughput(model, 6000)
    result = on_tick(_snapshot(throughput=inp, throughput_settings=settings), NOW)
    assert result.source == DecisionSource.THROUGHPUT
    assert result.target is not None
    assert result.throughput_floor is None
    assert result.diagnostics["throughput"]["reason"] == "scale"
