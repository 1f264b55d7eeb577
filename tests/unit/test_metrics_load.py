"""The load-scaling gauges of `PlannerMetrics.observe_load`, read back from a real registry's
exposition text, for records made by the real `load_step` (and passed through JSON, as the
tick store keeps them)."""

from __future__ import annotations

import json
import logging
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.core.perf.fpm import ForwardPassMetrics
from app.core.seed.load import load_step
from app.core.seed.load_models import LoadModels
from app.core.seed.load_types import LoadInput, LoadReason, LoadSettings
from app.core.types import Mode, Role
from app.reports.metrics import LOAD_STATES, THROUGHPUT_STATES, PlannerMetrics
from tests.support_fpm import fpm as make_fpm

NOW_S = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC).timestamp()
Engines = dict[tuple[str, int], ForwardPassMetrics]


def fpm(worker: str, **fields: Any) -> ForwardPassMetrics:
    """A record with one prefill request whenever it computed prompt tokens."""
    return make_fpm(worker, prefill_requests=1 if fields.get("prefill_tokens") else 0, **fields)


# 10 us per prompt token + 1 ms; 10 us per KV token + 1 ms (the reference's consolidation lines).
PREFILL_TRAINING = [fpm("bench", wall_s=1e-5 * t + 1e-3, prefill_tokens=t) for t in (500, 1000, 1500, 2000)]
PREFILL_TRAINING.append(fpm("bench", wall_s=1e-5 * 2500 + 1e-3, prefill_tokens=2500))
DECODE_TRAINING = [
    fpm("bench", wall_s=1e-5 * kv + 1e-3, decode_kv=kv, decode_requests=kv // 1000)
    for kv in (5000, 10_000, 20_000, 30_000, 40_000)
]


def prefill_engine(worker: str, queued: int, dp_rank: int = 0) -> ForwardPassMetrics:
    return fpm(worker, dp_rank=dp_rank, wall_s=1e-5 * 500 + 1e-3, prefill_tokens=500, queued_prefill=queued)


def decode_engine(worker: str, kv: int, queued_kv: int = 0, dp_rank: int = 0) -> ForwardPassMetrics:
    return fpm(
        worker,
        dp_rank=dp_rank,
        wall_s=1e-5 * kv + 1e-3,
        decode_kv=kv,
        decode_requests=max(1, kv // 1000),
        queued_decode_kv=queued_kv,
    )


def load_record(
    tick: dict[Role, Engines],
    *,
    mode: Mode = "disagg",
    training: bool = True,
    ready: dict[Role, int] | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """A load record as the tick store keeps it: `load_step`'s diagnostics through JSON."""
    models = LoadModels(mode)
    if training:
        models.observe_many(
            {
                role: PREFILL_TRAINING if role == "prefill" else DECODE_TRAINING
                for role in models.regressions
                if role in ("prefill", "decode")
            }
        )
    models.observe_many({role: list(engines.values()) for role, engines in tick.items()})
    if ready is None:
        ready = {role: len({w for w, _ in engines}) for role, engines in tick.items()}
    settings = {"ttft_target_ms": 100.0, "itl_target_ms": 50.0, "max_num_batched_tokens": 2048, **settings}
    result = load_step(
        models, LoadInput(fpm=tick, ready=ready, now_s=NOW_S), LoadSettings(mode=mode, **settings)
    )
    return json.loads(json.dumps(result.diagnostics))


def disagg_tick(prefill_queues: dict[str, int], decode_kv: dict[str, int]) -> dict[Role, Engines]:
    return {
        "prefill": {(w, 0): prefill_engine(w, q) for w, q in prefill_queues.items()},
        "decode": {(w, 0): decode_engine(w, kv, queued_kv=kv // 10) for w, kv in decode_kv.items()},
    }


# --- reading the registry back ---------------------------------------------------------------------


def samples(metrics: PlannerMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{sorted labels: value} of every sample named `name` in the exposition text."""
    text = generate_latest(metrics.registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def engine_values(
    metrics: PlannerMetrics, name: str, deployment: str = "demo"
) -> dict[tuple[str, str, str], float]:
    return {
        (labels["role"], labels["worker_id"], labels["dp_rank"]): value
        for key, value in samples(metrics, name).items()
        if (labels := dict(key))["deployment"] == deployment
    }


def enum_state(metrics: PlannerMetrics, name: str, deployment: str = "demo") -> str | None:
    on = [
        dict(k)[name]
        for k, v in samples(metrics, name).items()
        if dict(k)["deployment"] == deployment and v == 1
    ]
    assert len(on) <= 1, on
    return on[0] if on else None


def by_deployment(metrics: PlannerMetrics, name: str) -> dict[str, float]:
    return {dict(k)["deployment"]: v for k, v in samples(metrics, name).items()}


ENGINE_METRICS = [
    "dynamo_planner_engine_queued_prefill_tokens",
    "dynamo_planner_engine_queued_decode_kv_tokens",
    "dynamo_planner_engine_inflight_decode_kv_tokens",
    "dynamo_planner_engine_estimated_ttft_ms",
    "dynamo_planner_engine_estimated_itl_ms",
]


# --- tests -----------------------------------------------------------------------------------------


def test_enum_states_are_the_references():
    assert LOAD_STATES == (
        "unset",
        "disabled",
        "no_fpm_data",
        "scaling_in_progress",
        "worker_count_mismatch",
        "insufficient_data",
        "no_change",
        "scale_up",
        "scale_down",
        "scale_down_capped_by_throughput",
        "scale_down_refused_consolidation",
    )
    assert THROUGHPUT_STATES[:7] == (
        "unset",
        "disabled",
        "no_traffic_data",
        "predict_failed",
        "model_not_ready",
        "set_lower_bound",
        "scale",
    )
    metrics = PlannerMetrics()
    metrics.observe_load("demo", None)
    assert set(
        dict(k)["dynamo_planner_load_scaling_decision"]
        for k in samples(metrics, "dynamo_planner_load_scaling_decision")
    ) == set(LOAD_STATES)


def test_a_disagg_record_sets_every_engine_and_the_estimates():
    record = load_record(disagg_tick({"p0": 2000, "p1": 0}, {"d0": 8000, "d1": 3000}))
    metrics = PlannerMetrics()
    metrics.observe_load("demo", record)

    assert enum_state(metrics, "dynamo_planner_load_scaling_decision") == record["reason"]
    rows = {
        (role, row["engine"].split(":dp")[0]): row
        for role in ("prefill", "decode")
        for row in record["roles"][role]["engines"]
    }
    assert engine_values(metrics, "dynamo_planner_engine_queued_prefill_tokens") == {
        ("prefill", "p0", "0"): 2000.0,
        ("prefill", "p1", "0"): 0.0,
    }
    assert engine_values(metrics, "dynamo_planner_engine_inflight_decode_kv_tokens") == {
        ("decode", "d0", "0"): 8000.0,
        ("decode", "d1", "0"): 3000.0,
    }
    assert engine_values(metrics, "dynamo_planner_engine_queued_decode_kv_tokens") == {
        ("decode", "d0", "0"): 800.0,
        ("decode", "d1", "0"): 300.0,
    }
    ttft = engine_values(metrics, "dynamo_planner_engine_estimated_ttft_ms")
    assert ttft == {("prefill", w, "0"): rows["prefill", w]["estimated_ttft_ms"] for w in ("p0", "p1")}
    # more queued tokens, a longer estimate; the deployment's figure is the worst engine's
    assert ttft["prefill", "p0", "0"] > ttft["prefill", "p1", "0"] > 0
    itl = engine_values(metrics, "dynamo_planner_engine_estimated_itl_ms")
    assert itl == {("decode", w, "0"): rows["decode", w]["estimated_itl_ms"] for w in ("d0", "d1")}
    assert by_deployment(metrics, "dynamo_planner_estimated_ttft_ms") == {"demo": max(ttft.values())}
    assert by_deployment(metrics, "dynamo_planner_estimated_itl_ms") == {"demo": max(itl.values())}
    assert by_deployment(metrics, "dynamo_planner_sla_target_ttft_ms") == {"demo": 100.0}
    assert by_deployment(metrics, "dynamo_planner_sla_target_itl_ms") == {"demo": 50.0}


def test_regression_samples_and_coefficients():
    record = load_record(disagg_tick({"p0": 100}, {"d0": 2000}))
    metrics = PlannerMetrics()
    metrics.observe_load("demo", record)
    models = record["models"]
    assert samples(metrics, "dynamo_planner_regression_samples") == {
        (("deployment", "demo"), ("model", "decode")): float(models["decode"]["observations"]),
        (("deployment", "demo"), ("model", "prefill")): float(models["prefill"]["observations"]),
    }
    assert models["prefill"]["observations"] == 6  # 5 training + the tick's own
    assert set(samples(metrics, "dynamo_planner_regression_ready").values()) == {1.0}
    coefficients = {
        (dict(k)["model"], dict(k)["term"]): v
        for k, v in samples(metrics, "dynamo_planner_regression_coefficient_seconds").items()
    }
    # the prefill line was trained at 10 us per token + 1 ms, and the tick's record is on it
    assert coefficients["prefill", "sum_prefill_tokens"] == pytest.approx(1e-5, rel=1e-6)
    assert coefficients["prefill", "intercept"] == pytest.approx(1e-3, rel=1e-4)
    assert {term for model, term in coefficients if model == "decode"} == {
        "intercept",
        "num_decode_requests",
        "sum_decode_kv_tokens",
    }


def test_departed_engines_disappear_and_other_deployments_stay():
    metrics = PlannerMetrics()
    metrics.observe_load("other", load_record(disagg_tick({"x0": 5}, {"y0": 1000})))
    metrics.observe_load("demo", load_record(disagg_tick({"p0": 10, "p1": 20}, {"d0": 1000, "d1": 2000})))
    metrics.observe_load("demo", load_record(disagg_tick({"p1": 30}, {"d1": 4000})))

    assert engine_values(metrics, "dynamo_planner_engine_queued_prefill_tokens") == {
        ("prefill", "p1", "0"): 30.0
    }
    assert engine_values(metrics, "dynamo_planner_engine_inflight_decode_kv_tokens") == {
        ("decode", "d1", "0"): 4000.0
    }
    assert engine_values(metrics, "dynamo_planner_engine_queued_prefill_tokens", "other") == {
        ("prefill", "x0", "0"): 5.0
    }


def test_dp_ranks_and_agg_workers():
    tick = {
        "workers": {
            ("w0", rank): fpm(
                "w0",
                dp_rank=rank,
                wall_s=1e-4 * 200 + 1e-5 * 10_000 + 1e-3,  # on the training plane
                prefill_tokens=200,
                decode_kv=10_000,
                decode_requests=10,
                queued_prefill=100 * (rank + 1),
            )
            for rank in (0, 1)
        }
    }
    agg_training = [
        fpm("bench", wall_s=1e-4 * p + 1e-5 * d + 1e-3, prefill_tokens=p, decode_kv=d, decode_requests=10)
        for p, d in [(100, 5000), (200, 15000), (300, 25000), (400, 35000), (500, 45000)]
    ]
    models = LoadModels("agg")
    models.observe_many({"workers": agg_training + list(tick["workers"].values())})
    settings = LoadSettings(
        mode="agg", ttft_target_ms=500.0, itl_target_ms=1000.0, max_num_batched_tokens=2048
    )
    result = load_step(models, LoadInput(fpm=tick, ready={"workers": 1}, now_s=NOW_S), settings)
    metrics = PlannerMetrics()
    metrics.observe_load("demo", json.loads(json.dumps(result.diagnostics)))
    assert engine_values(metrics, "dynamo_planner_engine_queued_prefill_tokens") == {
        ("workers", "w0", "0"): 100.0,
        ("workers", "w0", "1"): 200.0,
    }
    assert set(engine_values(metrics, "dynamo_planner_engine_estimated_itl_ms")) == {
        ("workers", "w0", "0"),
        ("workers", "w0", "1"),
    }
    assert set(engine_values(metrics, "dynamo_planner_engine_estimated_ttft_ms")) == {
        ("workers", "w0", "0"),
        ("workers", "w0", "1"),
    }


def test_insufficient_data_clears_engines_and_coefficients():
    metrics = PlannerMetrics()
    metrics.observe_load("demo", load_record(disagg_tick({"p0": 10}, {"d0": 1000})))
    assert engine_values(metrics, "dynamo_planner_engine_queued_prefill_tokens")

    record = load_record(disagg_tick({"p0": 10}, {"d0": 1000}), training=False)
    assert record["reason"] == LoadReason.INSUFFICIENT_DATA
    metrics.observe_load("demo", record)
    assert enum_state(metrics, "dynamo_planner_load_scaling_decision") == "insufficient_data"
    for name in ENGINE_METRICS + [
        "dynamo_planner_regression_coefficient_seconds",
        "dynamo_planner_estimated_ttft_ms",
    ]:
        assert samples(metrics, name) == {}, name
    assert by_deployment(metrics, "dynamo_planner_regression_samples") == {"demo": 1.0}
    assert set(samples(metrics, "dynamo_planner_regression_ready").values()) == {0.0}


def test_a_tick_without_a_load_step():
    metrics = PlannerMetrics()
    metrics.observe_load("demo", load_record(disagg_tick({"p0": 10}, {"d0": 1000})))
    before = engine_values(metrics, "dynamo_planner_engine_queued_prefill_tokens")
    state = enum_state(metrics, "dynamo_planner_load_scaling_decision")

    # load scaling on, not a load tick: the last step's values stay
    metrics.observe_load("demo", None)
    assert engine_values(metrics, "dynamo_planner_engine_queued_prefill_tokens") == before
    assert enum_state(metrics, "dynamo_planner_load_scaling_decision") == state

    # load scaling off: disabled, and nothing of the last step is left
    metrics.observe_load("demo", None, load_enabled=False)
    assert enum_state(metrics, "dynamo_planner_load_scaling_decision") == "disabled"
    for name in ENGINE_METRICS + ["dynamo_planner_estimated_itl_ms", "dynamo_planner_regression_samples"]:
        assert samples(metrics, name) == {}, name

    # a deployment never load-stepped reads "unset"
    metrics.observe_load("fresh", None)
    assert enum_state(metrics, "dynamo_planner_load_scaling_decision", "fresh") == "unset"


def test_disabled_record():
    record = load_record(disagg_tick({"p0": 10}, {"d0": 1000}), enabled=False)
    metrics = PlannerMetrics()
    metrics.observe_load("demo", record)
    assert enum_state(metrics, "dynamo_planner_load_scaling_decision") == "disabled"
    assert samples(metrics, "dynamo_planner_engine_queued_prefill_tokens") == {}


@pytest.mark.parametrize(
    "load",
    [
        pytest.param({}, id="empty"),
        pytest.param({"reason": "no_change", "roles": None, "models": None, "targets": None}, id="nulls"),
        pytest.param(
            {"reason": "no_change", "roles": {"prefill": {"engines": [{"engine": None}, 7]}}}, id="bad-rows"
        ),
        pytest.param(
            {"reason": "no_change", "estimated_ttft_ms": "12", "models": {"prefill": 3}}, id="wrong-types"
        ),
        pytest.param({"reason": "gpu_budget_guard_hold"}, id="unknown-reason"),
        pytest.param({"reason": "no_change", "estimated_ttft_ms": math.nan}, id="nan"),
    ],
)
def test_odd_records_do_not_raise(load, caplog):
    metrics = PlannerMetrics()
    with caplog.at_level(logging.WARNING, logger="app.reports.metrics"):
        metrics.observe_load("demo", load)
    assert samples(metrics, "dynamo_planner_estimated_ttft_ms") == {}
    assert samples(metrics, "dynamo_planner_engine_queued_prefill_tokens") == {}
    if load.get("reason") == "gpu_budget_guard_hold":
        assert "not an exported state" in caplog.text


def test_throughput_reasons_including_the_lower_bound():
    metrics = PlannerMetrics()
    metrics.observe_throughput("demo", {"reason": "set_lower_bound", "detail": "x"})
    assert enum_state(metrics, "dynamo_planner_throughput_scaling_decision") == "set_lower_bound"
    metrics.observe_throughput("demo", {"reason": "something_new", "detail": "x"})  # logged, not raised
    assert enum_state(metrics, "dynamo_planner_throughput_scaling_decision") == "set_lower_bound"
