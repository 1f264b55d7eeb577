"""Throughput-based scaling: observed traffic and a forecast, through the profile, to replicas.

One throughput step (reference §1.2, product.md "Throughput-based"):
1. correction factors from the last interval's observation (prefill: observed TTFT over the
   profile's TTFT at that ISL; decode: observed ITL over the profile's ITL at that concurrency
   and context), off with `correction: false`;
2. the forecast of the next interval (made by the worker's predictors, passed in);
3. replicas from the profile (`plan_replicas`), before bounds, budget and overrides.
Each outcome carries one of the reference's reason names, so dashboards read the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.core.perf.interpolation import PerfModel
from app.core.seed.replicas import plan_replicas
from app.core.types import Replicas, Role, TrafficForecast, TrafficObservation


class ThroughputReason(StrEnum):
    DISABLED = "disabled"
    NO_TRAFFIC_DATA = "no_traffic_data"
    PREDICT_FAILED = "predict_failed"
    MODEL_NOT_READY = "model_not_ready"
    SCALE = "scale"
    # Both modes on: the throughput result is the floor the load decisions stay above.
    SET_LOWER_BOUND = "set_lower_bound"


@dataclass(frozen=True)
class ThroughputSettings:
    interval_s: float
    itl_target_ms: float
    correction: bool
    gpus_per_engine: dict[Role, int]


@dataclass(frozen=True)
class ThroughputInput:
    """What the worker gathered for one throughput step. Errors are the adapters' reasons."""

    observation: TrafficObservation | None
    observation_error: str | None
    forecast: TrafficForecast | None
    model: PerfModel | None
    model_error: str | None = None
    # Decode engines serving during the observed interval (for the decode correction).
    decode_engines: int | None = None


@dataclass(frozen=True)
class CorrectionFactors:
    prefill: float | None
    decode: float | None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ThroughputResult:
    replicas: Replicas | None
    reason: ThroughputReason
    detail: str
    diagnostics: dict[str, Any] = field(default_factory=dict)


def _finite_positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def correction_factors(
    model: PerfModel, obs: TrafficObservation | None, *, decode_engines: int | None
) -> CorrectionFactors:
    """Observed over expected latency; None (and a note) wherever the inputs do not allow it."""
    if obs is None or not obs.complete or not obs.num_req:
        return CorrectionFactors(None, None, ("no complete observation with traffic",))
    notes: list[str] = []
    prefill = None
    expected_ttft_ms = model.prefill.ttft_ms(obs.isl)  # type: ignore[arg-type]
    if _finite_positive(expected_ttft_ms):
        prefill = obs.ttft_ms / expected_ttft_ms  # type: ignore[operator]
    else:
        notes.append(f"profile TTFT at ISL {obs.isl:.0f} is {expected_ttft_ms}: no prefill factor")

    decode = None
    if not decode_engines:
        notes.append("decode engine count unknown: no decode factor")
    elif not _finite_positive(obs.request_duration_s):
        notes.append("request duration unknown: no decode factor")
    else:
        # Little's law: requests in flight per decode engine over the interval.
        concurrency = obs.num_req / decode_engines * obs.request_duration_s / obs.duration_s  # type: ignore[operator]
        context_tokens = obs.isl + obs.osl / 2  # type: ignore[operator]
        expected_itl_ms = model.decode.itl_ms(concurrency, context_tokens)
        if _finite_positive(expected_itl_ms):
            decode = obs.itl_ms / expected_itl_ms  # type: ignore[operator]
        else:
            notes.append(
                f"profile ITL at concurrency {concurrency:.1f} is {expected_itl_ms}: no decode factor"
            )
    return CorrectionFactors(prefill, decode, tuple(notes))


def throughput_step(
    inp: ThroughputInput, settings: ThroughputSettings, roles: tuple[Role, ...]
) -> ThroughputResult:
    obs = inp.observation
    diagnostics: dict[str, Any] = {
        "observed": None
        if obs is None
        else {
            "duration_s": obs.duration_s,
            "num_req": obs.num_req,
            "isl": obs.isl,
            "osl": obs.osl,
            "ttft_ms": obs.ttft_ms,
            "itl_ms": obs.itl_ms,
            "request_duration_s": obs.request_duration_s,
        },
        "observation_error": inp.observation_error,
    }
    if inp.model is None:
        return ThroughputResult(
            None, ThroughputReason.MODEL_NOT_READY, inp.model_error or "no profile", diagnostics
        )
    if "workers" in roles:
        return ThroughputResult(
            None,
            ThroughputReason.MODEL_NOT_READY,
            "aggregated engines have no throughput profile; they scale by load (FPM regressions)",
            diagnostics,
        )

    factors = (
        correction_factors(inp.model, obs, decode_engines=inp.decode_engines)
        if settings.correction
        else CorrectionFactors(None, None, ("correction disabled",))
    )
    diagnostics["correction"] = {
        "prefill": factors.prefill,
        "decode": factors.decode,
        "notes": list(factors.notes),
    }

    # Without this interval's traffic there is no decision: a forecast from older history would
    # scale on data nobody can vouch for (Prometheus down is not "load unchanged").
    if obs is None or obs.num_req is None:
        detail = inp.observation_error or "request count unknown for this interval"
        return ThroughputResult(None, ThroughputReason.NO_TRAFFIC_DATA, detail, diagnostics)
    forecast = inp.forecast
    if forecast is None:
        detail = "no traffic observed yet" if not obs.num_req else "the predictors have no forecast yet"
        return ThroughputResult(None, ThroughputReason.NO_TRAFFIC_DATA, detail, diagnostics)
    diagnostics["predicted"] = {
        "num_req": forecast.num_req,
        "isl": forecast.isl,
        "osl": forecast.osl,
        "notes": list(forecast.notes),
    }
    values = (forecast.num_req, forecast.isl, forecast.osl)
    if not all(v is not None and math.isfinite(v) and v >= 0 for v in values):
        return ThroughputResult(
            None, ThroughputReason.PREDICT_FAILED, f"unusable forecast {values}", diagnostics
        )

    plan = plan_replicas(
        model=inp.model,
        num_req=forecast.num_req,
        interval_s=settings.interval_s,
        isl_tokens=max(forecast.isl, 1.0),
        osl_tokens=max(forecast.osl, 1.0),
        itl_target_ms=settings.itl_target_ms,
        prefill_gpus=settings.gpus_per_engine.get("prefill", 1),
        decode_gpus=settings.gpus_per_engine.get("decode", 1),
        min_replicas=1,
        prefill_correction=factors.prefill if factors.prefill is not None else 1.0,
        decode_correction=factors.decode if factors.decode is not None else 1.0,
    )
    diagnostics["interpolated"] = {
        "prefill_thpt_per_gpu": plan.prefill_thpt_per_gpu,
        "decode_thpt_per_gpu": plan.decode_thpt_per_gpu,
        "expected_ttft_ms": plan.expected_ttft_ms,
        "expected_itl_ms": plan.expected_itl_ms,
        "decode_kv_usage": plan.decode_kv_usage,
    }
    raw = {"prefill": plan.num_prefill, "decode": plan.num_decode}
    replicas: Replicas = {role: raw[role] for role in roles}  # type: ignore[index]
    diagnostics["raw_replicas"] = replicas
    detail = "; ".join(
        f"{role}: {plan.prefill_reason if role == 'prefill' else plan.decode_reason}" for role in roles
    )
    return ThroughputResult(replicas, ThroughputReason.SCALE, detail, diagnostics)
