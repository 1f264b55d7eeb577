"""The throughput replica formulas (product.md step 4; reference notes §1.2, scenarios §10.2 A and B)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from app.core.perf.interpolation import DecodePoint, PerfModel
from app.core.seed.replicas import ReplicaPlan, plan_replicas
from app.sources.profile_files import load_profile

REPO_ROOT = Path(__file__).resolve().parents[2]
H200 = PerfModel.from_profile(load_profile(REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"))


@dataclass
class StubModel:
    """The interpolators mocked as in Dynamo's test_replica_calculation.py; records what it is asked."""

    prefill_thpt: float = 40_000.0
    decode_thpt: float = 10_000.0
    decode_itl_ms: float = 0.01
    ttft_ms: float = 80.0
    asked_itl_ms: list[float] = field(default_factory=list)
    asked_context_tokens: list[float] = field(default_factory=list)

    def prefill_thpt_per_gpu(self, isl_tokens: float) -> float:
        return self.prefill_thpt

    def prefill_ttft_ms(self, isl_tokens: float) -> float:
        return self.ttft_ms

    def best_decode_throughput_per_gpu(self, itl_ms: float, context_tokens: float) -> DecodePoint:
        self.asked_itl_ms.append(itl_ms)
        self.asked_context_tokens.append(context_tokens)
        return DecodePoint(self.decode_thpt, self.decode_itl_ms, 0.5)


@dataclass(frozen=True)
class Case:
    name: str
    why: str
    num_req: float
    isl: float
    osl: float
    num_prefill: int
    num_decode: int
    prefill_thpt: float = 40_000.0
    decode_thpt: float = 10_000.0
    prefill_gpus: int = 1
    decode_gpus: int = 1
    min_replicas: int = 1
    prefill_correction: float = 1.0
    decode_correction: float = 1.0
    asked_itl_ms: float = 10.0  # the ITL target the decode search must receive


# Reference scenario A: interval 60 s, ITL target 10 ms, prefill 40 000 tok/s/GPU mocked.
SCENARIO_A = [
    Case("A1-low-load", "ceil(10*3000/60/40000) = ceil(0.0125); ceil(10*150/60/10000)", 10, 3000, 150, 1, 1),
    Case(
        "A2-decode-bound",
        "P = ceil(25000/40000) = 1, D = ceil(1250/1000) = 2",
        500,
        3000,
        150,
        1,
        2,
        decode_thpt=1000,
    ),
    Case("A3-before-budget", "50 req: 2500/40000 and 125/10000 round up to 1 each", 50, 3000, 150, 1, 1),
    Case("A4-min-endpoint", "tiny load, both raised to min_replicas 2", 1, 100, 10, 2, 2, min_replicas=2),
    Case(
        "A5-prefill-factor-above-one",
        "a prefill correction 2.5 is treated as 1 (prefill only ever shrinks)",
        10,
        3000,
        150,
        1,
        1,
        prefill_correction=2.5,
    ),
    Case(
        "A6-decode-factor-zero",
        "a decode correction 0 falls back to the raw ITL target",
        10,
        3000,
        150,
        1,
        1,
        decode_correction=0.0,
    ),
    Case(
        "A6-decode-factor-negative",
        "a decode correction -1 falls back to the raw ITL target",
        10,
        3000,
        150,
        1,
        1,
        decode_correction=-1.0,
    ),
    Case(
        "A7-multi-gpu",
        "ceil(20*3000/60/40000/2) = 1, ceil(20*150/60/5000/4) = 1",
        20,
        3000,
        150,
        1,
        1,
        decode_thpt=5000,
        prefill_gpus=2,
        decode_gpus=4,
    ),
    Case(
        "A8-two-gpus-each",
        "ceil(5000/10000/2) = 1, ceil(250/1000/2) = 1 (the budget stage comes later)",
        100,
        3000,
        150,
        1,
        1,
        prefill_thpt=10_000,
        decode_thpt=1000,
        prefill_gpus=2,
        decode_gpus=2,
    ),
]

MORE = [
    Case(
        "prefill-factor-below-one",
        "0.5 halves the prefill demand: 60000*0.5/40000 = 0.75 -> 1 instead of 2",
        1200,
        3000,
        150,
        1,
        1,
        prefill_correction=0.5,
    ),
    Case(
        "prefill-without-factor", "the same load uncorrected: 60000/40000 = 1.5 -> 2", 1200, 3000, 150, 2, 1
    ),
    Case(
        "prefill-factor-above-one-ignored",
        "2.5 would make 3.75 -> 4 engines; clamped to 1 it stays 60000/40000 = 1.5 -> 2",
        1200,
        3000,
        150,
        2,
        1,
        prefill_correction=2.5,
    ),
    Case(
        "decode-factor-two",
        "observed ITL twice the profile's: search for 10/2 = 5 ms",
        10,
        3000,
        150,
        1,
        1,
        decode_correction=2.0,
        asked_itl_ms=5.0,
    ),
    Case(
        "decode-factor-half",
        "observed ITL half the profile's: search for 20 ms",
        10,
        3000,
        150,
        1,
        1,
        decode_correction=0.5,
        asked_itl_ms=20.0,
    ),
    Case(
        "decode-factor-nan",
        "an unknown factor falls back to the raw target (here, not in the reference)",
        10,
        3000,
        150,
        1,
        1,
        decode_correction=float("nan"),
    ),
    Case(
        "prefill-factor-nan",
        "min(1, NaN) is 1: an unknown prefill factor leaves demand alone",
        1200,
        3000,
        150,
        2,
        1,
        prefill_correction=float("nan"),
    ),
    Case("no-traffic", "0 requests: 0 -> min_replicas", 0, 3000, 150, 1, 1),
    Case(
        "no-traffic-min-zero",
        "with min_replicas 0 an idle deployment plans nothing",
        0,
        3000,
        150,
        0,
        0,
        min_replicas=0,
    ),
    Case(
        "exact-multiple",
        "exactly 2 engines' worth stays 2: 4800*1000/60/40000 = 2.0",
        4800,
        1000,
        100,
        2,
        1,
    ),
    Case(
        "prefill-throughput-zero",
        "a profile point of 0 tok/s/GPU cannot divide: min_replicas",
        10,
        3000,
        150,
        3,
        3,
        prefill_thpt=0.0,
        min_replicas=3,
    ),
    Case("decode-throughput-zero", "same for decode", 500, 3000, 150, 1, 1, decode_thpt=0.0),
]


@pytest.mark.parametrize("case", SCENARIO_A + MORE, ids=lambda c: c.name)
def test_replica_formula(case: Case) -> None:
    model = StubModel(prefill_thpt=case.prefill_thpt, decode_thpt=case.decode_thpt)
    plan = plan_replicas(
        model=model,  # type: ignore[arg-type]
        num_req=case.num_req,
        interval_s=60,
        isl_tokens=case.isl,
        osl_tokens=case.osl,
        itl_target_ms=10,
        prefill_gpus=case.prefill_gpus,
        decode_gpus=case.decode_gpus,
        min_replicas=case.min_replicas,
        prefill_correction=case.prefill_correction,
        decode_correction=case.decode_correction,
    )
    assert (plan.num_prefill, plan.num_decode) == (case.num_prefill, case.num_decode), case.why
    assert model.asked_itl_ms == [case.asked_itl_ms], case.why
    assert model.asked_context_tokens == [case.isl + case.osl / 2]
    assert plan.decode_itl_target_ms == case.asked_itl_ms


def test_plan_carries_the_interpolated_figures_and_reasons() -> None:
    plan = plan_replicas(
        model=StubModel(),  # type: ignore[arg-type]
        num_req=500,
        interval_s=60,
        isl_tokens=3000,
        osl_tokens=150,
        itl_target_ms=10,
        decode_correction=2.0,
        prefill_correction=0.5,
    )
    assert plan == ReplicaPlan(
        num_prefill=1,
        num_decode=1,
        prefill_thpt_per_gpu=40000.0,
        decode_thpt_per_gpu=10000.0,
        expected_ttft_ms=80.0,
        expected_itl_ms=0.01,
        decode_kv_usage=0.5,
        prefill_reason="12500 tok/s (x prefill correction 0.5) / 40000 tok/s/GPU / 1 GPU -> 1",
        decode_reason="1250 tok/s / 10000 tok/s/GPU / 1 GPU -> 1; "
        "ITL 10 ms / decode correction 2 = 5 ms met at 0.01 ms (kv 50%, context 3075)",
        prefill_demand_tokens_per_s=12500.0,
        decode_demand_tokens_per_s=1250.0,
        decode_context_tokens=3075.0,
        decode_itl_target_ms=5.0,
    )


@dataclass(frozen=True)
class ReasonCase:
    name: str
    why: str
    model: StubModel
    min_replicas: int
    decode_correction: float
    prefill_reason: str
    decode_reason: str


REASONS = [
    ReasonCase(
        "raised-to-min",
        "says the formula gave fewer than the minimum",
        StubModel(),
        2,
        1.0,
        "500 tok/s / 40000 tok/s/GPU / 1 GPU -> 1, raised to min_replicas 2",
        "25 tok/s / 10000 tok/s/GPU / 1 GPU -> 1, raised to min_replicas 2; "
        "ITL 10 ms met at 0.01 ms (kv 50%, context 3075)",
    ),
    ReasonCase(
        "zero-throughput",
        "says why the formula was not applied",
        StubModel(prefill_thpt=0.0, decode_thpt=-1.0),
        1,
        1.0,
        "prefill throughput at ISL 3000 is 0 tok/s/GPU -> min_replicas 1",
        "decode throughput is -1 tok/s/GPU; "
        "ITL 10 ms met at 0.01 ms (kv 50%, context 3075) -> min_replicas 1",
    ),
    ReasonCase(
        "target-missed",
        "no decode cell meets the target: the lowest-KV cell, said so",
        StubModel(decode_itl_ms=12.5),
        1,
        1.0,
        "500 tok/s / 40000 tok/s/GPU / 1 GPU -> 1",
        "25 tok/s / 10000 tok/s/GPU / 1 GPU -> 1; "
        "no cell meets ITL 10 ms; lowest-kv cell has 12.5 ms (kv 50%, context 3075)",
    ),
    ReasonCase(
        "decode-factor-ignored",
        "a factor <= 0 is named as ignored",
        StubModel(),
        1,
        -1.0,
        "500 tok/s / 40000 tok/s/GPU / 1 GPU -> 1",
        "25 tok/s / 10000 tok/s/GPU / 1 GPU -> 1; "
        "ITL 10 ms (decode correction -1 ignored) met at 0.01 ms (kv 50%, context 3075)",
    ),
]


@pytest.mark.parametrize("case", REASONS, ids=lambda c: c.name)
def test_reasons(case: ReasonCase) -> None:
    plan = plan_replicas(
        model=case.model,  # type: ignore[arg-type]
        num_req=10,
        interval_s=60,
        isl_tokens=3000,
        osl_tokens=150,
        itl_target_ms=10,
        min_replicas=case.min_replicas,
        decode_correction=case.decode_correction,
    )
    assert (plan.prefill_reason, plan.decode_reason) == (case.prefill_reason, case.decode_reason), case.why


@dataclass(frozen=True)
class BadInput:
    name: str
    field: str
    value: float


BAD_INPUTS = [
    BadInput("negative-requests", "num_req", -1),
    BadInput("nan-requests", "num_req", float("nan")),
    BadInput("zero-interval", "interval_s", 0),
    BadInput("zero-isl", "isl_tokens", 0),
    BadInput("inf-isl", "isl_tokens", float("inf")),
    BadInput("negative-osl", "osl_tokens", -5),
    BadInput("zero-itl", "itl_target_ms", 0),
    BadInput("zero-prefill-gpus", "prefill_gpus", 0),
    BadInput("zero-decode-gpus", "decode_gpus", 0),
    BadInput("negative-min", "min_replicas", -1),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda c: c.name)
def test_bad_inputs_are_refused(case: BadInput) -> None:
    args = dict(num_req=10, interval_s=60, isl_tokens=3000, osl_tokens=150, itl_target_ms=10)
    args[case.field] = case.value
    with pytest.raises(ValueError, match=f"^{case.field} must be"):
        plan_replicas(model=StubModel(), **args)  # type: ignore[arg-type]


# --- on the H200 profile ---------------------------------------------------------------------------

PREFILL_THPT_ISL_3000 = 49481.093527696125
DECODE_THPT_ITL_50_CTX_3075 = 6794.772011902521


@dataclass(frozen=True)
class H200Case:
    name: str
    why: str
    num_req: float
    interval_s: float
    num_prefill: int
    num_decode: int
    prefill_gpus: int = 1


H200_CASES = [
    H200Case("sanity-10-rps", "product sanity figure: 10 req/s -> 1P1D", 10, 1, 1, 1),
    H200Case("sanity-20-rps", "product sanity figure: 20 req/s -> 2P1D (60000/49481 = 1.21)", 20, 1, 2, 1),
    H200Case("B-interval-1", "scenario B, 10 requests per 60 s", 10, 60, 1, 1),
    H200Case(
        "B-interval-2",
        "scenario B, 5000 requests per 60 s: ceil(250000/49481) = 6, ceil(12500/6795) = 2",
        5000,
        60,
        6,
        2,
    ),
    H200Case(
        "two-gpu-prefill", "20 req/s on 2-GPU prefill engines: ceil(1.21/2) = 1", 20, 1, 1, 1, prefill_gpus=2
    ),
]


@pytest.mark.parametrize("case", H200_CASES, ids=lambda c: c.name)
def test_h200(case: H200Case) -> None:
    plan = plan_replicas(
        model=H200,
        num_req=case.num_req,
        interval_s=case.interval_s,
        isl_tokens=3000,
        osl_tokens=150,
        itl_target_ms=50,
        prefill_gpus=case.prefill_gpus,
    )
    # Scenario B's expectation, written as the formula with the interpolated figures.
    assert case.num_prefill == max(
        math.ceil(case.num_req * 3000 / case.interval_s / PREFILL_THPT_ISL_3000 / case.prefill_gpus), 1
    )
    assert case.num_decode == max(
        math.ceil(case.num_req * 150 / case.interval_s / DECODE_THPT_ITL_50_CTX_3075), 1
    )
    assert (plan.num_prefill, plan.num_decode) == (case.num_prefill, case.num_decode), case.why
    assert plan.prefill_thpt_per_gpu == pytest.approx(PREFILL_THPT_ISL_3000, rel=1e-9)
    assert plan.decode_thpt_per_gpu == pytest.approx(DECODE_THPT_ITL_50_CTX_3075, rel=1e-9)
    assert plan.expected_ttft_ms == pytest.approx(60.45866867507649, rel=1e-9)
    assert plan.expected_itl_ms == pytest.approx(41.70781893771626, rel=1e-9)
    assert plan.decode_kv_usage == 1.0


def test_scenario_b_scales_up_then_down() -> None:
    """Scenario B: the formula has no memory, so up then down gives the same counts in reverse."""

    def counts(num_req: float) -> tuple[int, int]:
        plan = plan_replicas(
            model=H200, num_req=num_req, interval_s=60, isl_tokens=3000, osl_tokens=150, itl_target_ms=50
        )
        return plan.num_prefill, plan.num_decode

    up = [counts(n) for n in (10, 5000)]
    down = [counts(n) for n in (5000, 10)]
    assert up == [(1, 1), (6, 2)]
    assert down == [(6, 2), (1, 1)]
