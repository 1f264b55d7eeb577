"""Correction factors and the throughput step (reference §1.2, §10.2 A and B)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.core.perf.interpolation import DecodePoint, PerfModel
from app.core.seed.replicas import plan_replicas
from app.core.seed.throughput import (
    ThroughputInput,
    ThroughputReason,
    ThroughputSettings,
    correction_factors,
    throughput_step,
)
from app.core.types import TrafficForecast, TrafficObservation
from app.sources.profile_files import load_profile

H200 = Path(__file__).resolve().parents[2] / "data" / "profiles" / "h200-llama3.1-8b-fp8"


class _Prefill:
    def __init__(self, ttft_ms: float, thpt: float) -> None:
        self._ttft, self._thpt = ttft_ms, thpt

    def ttft_ms(self, isl_tokens: float) -> float:
        return self._ttft

    def thpt_per_gpu(self, isl_tokens: float) -> float:
        return self._thpt


class _Decode:
    """ITL grows linearly with concurrency: 10 ms + 0.1 ms per request in flight."""

    def __init__(self, thpt: float) -> None:
        self._thpt = thpt
        self.asked: list[tuple[float, float]] = []

    def itl_ms(self, concurrency: float, context_tokens: float) -> float:
        self.asked.append((concurrency, context_tokens))
        return 10.0 + 0.1 * concurrency

    def best_throughput_per_gpu(self, itl_ms: float, context_tokens: float) -> DecodePoint:
        return DecodePoint(thpt_per_gpu=self._thpt, itl_ms=0.01, kv_usage=0.5)


def fixed_model(*, ttft_ms: float = 80.0, prefill_thpt: float = 40_000.0, decode_thpt: float = 10_000.0):
    """The reference's mocked interpolators (§10.2 A): fixed numbers, so the formulas are exact."""
    model = PerfModel.__new__(PerfModel)
    object.__setattr__(model, "prefill", _Prefill(ttft_ms, prefill_thpt))
    object.__setattr__(model, "decode", _Decode(decode_thpt))
    object.__setattr__(model, "source", "fixed")
    return model


def obs(
    num_req=10.0, isl=3000.0, osl=150.0, ttft_ms=80.0, itl_ms=10.0, duration_s=60.0, request_duration_s=6.0
):
    return TrafficObservation(duration_s, num_req, isl, osl, ttft_ms, itl_ms, request_duration_s)


SETTINGS = ThroughputSettings(
    interval_s=60, itl_target_ms=10, correction=True, gpus_per_engine={"prefill": 1, "decode": 1}
)


@dataclass(frozen=True)
class FactorCase:
    name: str
    why: str
    observation: TrafficObservation | None
    decode_engines: int | None
    prefill: float | None
    decode: float | None


FACTOR_CASES = [
    FactorCase("on_profile", "observed equals the profile: both factors 1", obs(itl_ms=10.1), 1, 1.0, 1.0),
    # concurrency = 10 req / 1 engine * 6 s / 60 s = 1 -> expected ITL 10.1 ms
    FactorCase(
        "slower_than_profile",
        "TTFT 160 vs 80, ITL 20.2 vs 10.1: both 2",
        obs(ttft_ms=160, itl_ms=20.2),
        1,
        2.0,
        2.0,
    ),
    FactorCase(
        "two_engines_halve_concurrency",
        "concurrency 0.5 -> expected ITL 10.05",
        obs(itl_ms=10.05),
        2,
        1.0,
        1.0,
    ),
    FactorCase(
        "no_decode_engines", "without a decode count there is no decode factor", obs(), None, 1.0, None
    ),
    FactorCase(
        "no_request_duration",
        "Little's law needs the request duration",
        obs(request_duration_s=None),
        1,
        1.0,
        None,
    ),
    FactorCase("idle_interval", "no traffic: no factors", obs(num_req=0.0), 1, None, None),
    FactorCase("nothing_observed", "no observation: no factors", None, 1, None, None),
    FactorCase(
        "incomplete", "a missing ITL makes the observation incomplete", obs(itl_ms=None), 1, None, None
    ),
]


@pytest.mark.parametrize("case", FACTOR_CASES, ids=lambda c: c.name)
def test_correction_factors(case: FactorCase) -> None:
    factors = correction_factors(fixed_model(), case.observation, decode_engines=case.decode_engines)
    assert factors.prefill == (pytest.approx(case.prefill) if case.prefill is not None else None), case.why
    assert factors.decode == (pytest.approx(case.decode) if case.decode is not None else None), case.why


def test_decode_factor_asks_the_profile_at_littles_law_concurrency_and_mid_context() -> None:
    model = fixed_model()
    correction_factors(model, obs(num_req=30, isl=1000, osl=200, request_duration_s=4), decode_engines=2)
    assert model.decode.asked == [(30 / 2 * 4 / 60, 1000 + 200 / 2)]


def step(
    inp_obs,
    forecast,
    *,
    correction=True,
    model=None,
    error=None,
    decode_engines=1,
    roles=("prefill", "decode"),
):
    settings = ThroughputSettings(60, 10, correction, {"prefill": 1, "decode": 1})
    inp = ThroughputInput(
        inp_obs, error, forecast, model if model is not None else fixed_model(), None, decode_engines
    )
    return throughput_step(inp, settings, roles)


@dataclass(frozen=True)
class StepCase:
    name: str
    why: str
    observation: TrafficObservation | None
    error: str | None
    forecast: TrafficForecast | None
    correction: bool
    reason: ThroughputReason
    replicas: dict[str, int] | None


STEP_CASES = [
    StepCase(
        "ref_a1",
        "§10.2 A1: 10 req, ISL 3000, OSL 150 -> 1 prefill, 1 decode",
        obs(itl_ms=10.1),
        None,
        TrafficForecast(10, 3000, 150),
        True,
        ThroughputReason.SCALE,
        {"prefill": 1, "decode": 1},
    ),
    StepCase(
        "ref_a2_decode",
        "§10.2 A2 shape: 500 req, OSL 150, decode 10 000 -> D = ceil(1250/10000) = 1",
        obs(itl_ms=10.1),
        None,
        TrafficForecast(500, 3000, 150),
        True,
        ThroughputReason.SCALE,
        {"prefill": 1, "decode": 1},
    ),
    StepCase(
        "big_load",
        "5000 req: P = ceil(5000*3000/60/40000) = 7, D = ceil(5000*150/60/10000) = 2",
        obs(itl_ms=10.1),
        None,
        TrafficForecast(5000, 3000, 150),
        True,
        ThroughputReason.SCALE,
        {"prefill": 7, "decode": 2},
    ),
    StepCase(
        "prefill_factor_above_one_ignored",
        "§10.2 A5: TTFT 2.5x the profile changes nothing",
        obs(ttft_ms=200, itl_ms=10.1),
        None,
        TrafficForecast(5000, 3000, 150),
        True,
        ThroughputReason.SCALE,
        {"prefill": 7, "decode": 2},
    ),
    StepCase(
        "prefill_factor_below_one_shrinks",
        "TTFT half the profile halves prefill demand: ceil(6.25*0.5) = 4",
        obs(ttft_ms=40, itl_ms=10.1),
        None,
        TrafficForecast(5000, 3000, 150),
        True,
        ThroughputReason.SCALE,
        {"prefill": 4, "decode": 2},
    ),
    StepCase(
        "correction_off",
        "correction: false ignores the observed TTFT",
        obs(ttft_ms=40, itl_ms=10.1),
        None,
        TrafficForecast(5000, 3000, 150),
        False,
        ThroughputReason.SCALE,
        {"prefill": 7, "decode": 2},
    ),
    StepCase(
        "source_down",
        "Prometheus down: no decision, the source's reason",
        None,
        "prometheus: connection refused",
        TrafficForecast(10, 3000, 150),
        True,
        ThroughputReason.NO_TRAFFIC_DATA,
        None,
    ),
    StepCase(
        "count_unknown",
        "a known ISL with an unknown count is not zero traffic",
        TrafficObservation(60, None, 3000, 150),
        None,
        TrafficForecast(10, 3000, 150),
        True,
        ThroughputReason.NO_TRAFFIC_DATA,
        None,
    ),
    StepCase(
        "no_forecast_yet",
        "nothing observed yet",
        obs(num_req=0.0),
        None,
        None,
        True,
        ThroughputReason.NO_TRAFFIC_DATA,
        None,
    ),
    StepCase(
        "bad_forecast",
        "a NaN forecast is a prediction failure",
        obs(itl_ms=10.1),
        None,
        TrafficForecast(math.nan, 3000, 150),
        True,
        ThroughputReason.PREDICT_FAILED,
        None,
    ),
]


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda c: c.name)
def test_throughput_step(case: StepCase) -> None:
    result = step(case.observation, case.forecast, correction=case.correction, error=case.error)
    assert (result.reason, result.replicas) == (case.reason, case.replicas), case.why
    if case.error:
        assert result.detail == case.error


def test_diagnostics_record_observed_predicted_factors_and_raw_replicas() -> None:
    result = step(obs(ttft_ms=40, itl_ms=20.2), TrafficForecast(5000, 3000, 150))
    d = result.diagnostics
    assert d["observed"]["ttft_ms"] == 40
    assert d["predicted"] == {"num_req": 5000, "isl": 3000, "osl": 150, "notes": []}
    assert d["correction"]["prefill"] == pytest.approx(0.5)
    assert d["correction"]["decode"] == pytest.approx(2.0)
    assert d["interpolated"]["prefill_thpt_per_gpu"] == 40_000
    assert d["raw_replicas"] == {"prefill": 4, "decode": 2}


def test_no_profile_means_model_not_ready() -> None:
    settings = ThroughputSettings(60, 10, True, {"prefill": 1, "decode": 1})
    inp = ThroughputInput(obs(), None, TrafficForecast(10, 3000, 150), None, "no profile configured", 1)
    result = throughput_step(inp, settings, ("prefill", "decode"))
    assert (result.reason, result.replicas, result.detail) == (
        ThroughputReason.MODEL_NOT_READY,
        None,
        "no profile configured",
    )


def test_agg_mode_is_not_scaled_by_throughput() -> None:
    result = step(obs(), TrafficForecast(10, 3000, 150), roles=("workers",))
    assert (result.reason, result.replicas) == (ThroughputReason.MODEL_NOT_READY, None)


def test_single_role_modes_get_only_their_role() -> None:
    assert step(obs(itl_ms=10.1), TrafficForecast(5000, 3000, 150), roles=("prefill",)).replicas == {
        "prefill": 7
    }
    assert step(obs(itl_ms=10.1), TrafficForecast(5000, 3000, 150), roles=("decode",)).replicas == {
        "decode": 2
    }


@pytest.fixture(scope="module")
def h200() -> PerfModel:
    return PerfModel.from_profile(load_profile(H200))


def test_reference_b_on_the_h200_profile(h200: PerfModel) -> None:
    """§10.2 B: interval 60 s, ITL 50 ms, correction off; the step equals the formulas over the
    interpolated profile, and more load gives more replicas (and less gives fewer)."""

    def replicas(num_req: float) -> dict[str, int]:
        settings = ThroughputSettings(60, 50, False, {"prefill": 1, "decode": 1})
        inp = ThroughputInput(obs(num_req=num_req), None, TrafficForecast(num_req, 3000, 150), h200, None, 1)
        return throughput_step(inp, settings, ("prefill", "decode")).replicas

    def formula(num_req: float) -> dict[str, int]:
        prefill = max(math.ceil(num_req * 3000 / 60 / h200.prefill.thpt_per_gpu(3000)), 1)
        decode = max(
            math.ceil(num_req * 150 / 60 / h200.decode.best_throughput_per_gpu(50, 3075).thpt_per_gpu), 1
        )
        return {"prefill": prefill, "decode": decode}

    low, high = replicas(10), replicas(5000)
    assert (low, high) == (formula(10), formula(5000))
    assert high["prefill"] > low["prefill"] and high["decode"] > low["decode"]
    plan = plan_replicas(
        model=h200, num_req=5000, interval_s=60, isl_tokens=3000, osl_tokens=150, itl_target_ms=50
    )
    assert high == {"prefill": plan.num_prefill, "decode": plan.num_decode}
