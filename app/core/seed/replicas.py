"""The throughput replica formulas (product.md step 4; reference notes §1.2 steps 4–5).

    prefill = ceil(num_req * isl / interval * min(1, prefill_correction)
                   / prefill_thpt_per_gpu(isl) / prefill_gpus)
    decode  = ceil(num_req * osl / interval
                   / best_decode_thpt_per_gpu(itl_target / decode_correction, isl + osl/2)
                   / decode_gpus)

each at least `min_replicas`. The prefill correction only ever reduces demand (a factor above 1
is ignored). A decode correction that is not a positive finite number falls back to the raw ITL
target (the reference does this for a factor <= 0; NaN and infinity are treated the same way here
rather than searching the grid for a NaN or 0 ms target). A throughput per GPU <= 0 gives
`min_replicas`. Bounds, the GPU budget and overrides are later stages, not applied here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from app.core.perf.interpolation import PerfModel


@dataclass(frozen=True)
class ReplicaPlan:
    num_prefill: int
    num_decode: int
    prefill_thpt_per_gpu: float  # prefill tokens/s/GPU at the ISL
    decode_thpt_per_gpu: float  # output tokens/s/GPU at the chosen decode cell
    expected_ttft_ms: float  # one request alone at the ISL (no queueing)
    expected_itl_ms: float  # at the chosen decode cell
    decode_kv_usage: float  # KV usage of the chosen decode cell
    prefill_reason: str
    decode_reason: str
    prefill_demand_tokens_per_s: float  # after the prefill correction
    decode_demand_tokens_per_s: float
    decode_context_tokens: float  # isl + osl/2
    decode_itl_target_ms: float  # the ITL target after the decode correction

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _num(value: float) -> str:
    """Short, readable figures for reasons: 30000, 49481, 0.0125, 41.7."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _at_least(raw: int, min_replicas: int) -> tuple[int, str]:
    if raw < min_replicas:
        return min_replicas, f" -> {raw}, raised to min_replicas {min_replicas}"
    return raw, f" -> {raw}"


def _require(value: float, name: str, *, positive: bool) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value}")
    return value


def plan_replicas(
    *,
    model: PerfModel,
    num_req: float,
    interval_s: float,
    isl_tokens: float,
    osl_tokens: float,
    itl_target_ms: float,
    prefill_gpus: int = 1,
    decode_gpus: int = 1,
    min_replicas: int = 1,
    prefill_correction: float = 1.0,
    decode_correction: float = 1.0,
) -> ReplicaPlan:
    """Prefill and decode replicas for `num_req` requests over the next `interval_s` seconds."""
    num_req = _require(num_req, "num_req", positive=False)
    interval_s = _require(interval_s, "interval_s", positive=True)
    isl_tokens = _require(isl_tokens, "isl_tokens", positive=True)
    osl_tokens = _require(osl_tokens, "osl_tokens", positive=False)
    itl_target_ms = _require(itl_target_ms, "itl_target_ms", positive=True)
    for name, gpus in (("prefill_gpus", prefill_gpus), ("decode_gpus", decode_gpus)):
        if gpus < 1:
            raise ValueError(f"{name} must be at least 1, got {gpus}")
    if min_replicas < 0:
        raise ValueError(f"min_replicas must be >= 0, got {min_replicas}")

    # --- prefill ---------------------------------------------------------------------------------
    prefill_factor = min(1, prefill_correction)  # this order: min(1, NaN) is 1, as in the reference
    prefill_demand = num_req * isl_tokens / interval_s * prefill_factor
    prefill_thpt = model.prefill_thpt_per_gpu(isl_tokens)
    expected_ttft = model.prefill_ttft_ms(isl_tokens)
    correction_note = f" (x prefill correction {_num(prefill_factor)})" if prefill_factor != 1 else ""
    if prefill_thpt <= 0:
        num_prefill = min_replicas
        prefill_reason = (
            f"prefill throughput at ISL {_num(isl_tokens)} is {_num(prefill_thpt)} tok/s/GPU"
            f" -> min_replicas {min_replicas}"
        )
    else:
        raw = math.ceil(prefill_demand / prefill_thpt / prefill_gpus)
        num_prefill, tail = _at_least(raw, min_replicas)
        prefill_reason = (
            f"{_num(prefill_demand)} tok/s{correction_note} / {_num(prefill_thpt)} tok/s/GPU"
            f" / {prefill_gpus} GPU{tail}"
        )

    # --- decode ----------------------------------------------------------------------------------
    if math.isfinite(decode_correction) and decode_correction > 0:
        itl_target = itl_target_ms / decode_correction
        target_note = (
            f"ITL {_num(itl_target_ms)} ms / decode correction {_num(decode_correction)}"
            f" = {_num(itl_target)} ms"
            if decode_correction != 1
            else f"ITL {_num(itl_target_ms)} ms"
        )
    else:
        itl_target = itl_target_ms
        target_note = f"ITL {_num(itl_target_ms)} ms (decode correction {decode_correction:g} ignored)"
    context_tokens = isl_tokens + osl_tokens / 2
    best = model.best_decode_throughput_per_gpu(itl_target, context_tokens)
    decode_demand = num_req * osl_tokens / interval_s
    where = f"kv {best.kv_usage:.0%}, context {_num(context_tokens)}"
    if best.itl_ms <= itl_target:
        cell = f"{target_note} met at {_num(best.itl_ms)} ms ({where})"
    else:
        cell = f"no cell meets {target_note}; lowest-kv cell has {_num(best.itl_ms)} ms ({where})"
    if best.thpt_per_gpu <= 0:
        num_decode = min_replicas
        decode_reason = (
            f"decode throughput is {_num(best.thpt_per_gpu)} tok/s/GPU; {cell} -> min_replicas {min_replicas}"
        )
    else:
        raw = math.ceil(decode_demand / best.thpt_per_gpu / decode_gpus)
        num_decode, tail = _at_least(raw, min_replicas)
        decode_reason = (
            f"{_num(decode_demand)} tok/s / {_num(best.thpt_per_gpu)} tok/s/GPU"
            f" / {decode_gpus} GPU{tail}; {cell}"
        )

    return ReplicaPlan(
        num_prefill=num_prefill,
        num_decode=num_decode,
        prefill_thpt_per_gpu=prefill_thpt,
        decode_thpt_per_gpu=best.thpt_per_gpu,
        expected_ttft_ms=expected_ttft,
        expected_itl_ms=best.itl_ms,
        decode_kv_usage=best.kv_usage,
        prefill_reason=prefill_reason,
        decode_reason=decode_reason,
        prefill_demand_tokens_per_s=prefill_demand,
        decode_demand_tokens_per_s=decode_demand,
        decode_context_tokens=context_tokens,
        decode_itl_target_ms=itl_target,
    )


def what_if(
    *,
    model: PerfModel,
    rps: float,
    isl: float,
    osl: float,
    ttft_ms: float,
    itl_ms: float,
    prefill_gpus: int = 1,
    decode_gpus: int = 1,
    min_replicas: int = 1,
) -> dict[str, Any]:
    """The what-if answer of `planner plan` and `POST /plan`: the replicas a steady `rps` needs,
    the interpolated figures, and whether the targets are met. Inputs are echoed back."""
    # A steady rate is the formula's num_req / interval_s over a one-second interval.
    plan = plan_replicas(
        model=model,
        num_req=rps,
        interval_s=1.0,
        isl_tokens=isl,
        osl_tokens=osl,
        itl_target_ms=itl_ms,
        prefill_gpus=prefill_gpus,
        decode_gpus=decode_gpus,
        min_replicas=min_replicas,
    )
    return {
        "rps": rps,
        "isl": isl,
        "osl": osl,
        "ttft_ms": ttft_ms,
        "itl_ms": itl_ms,
        "prefill_gpus": prefill_gpus,
        "decode_gpus": decode_gpus,
        "min_replicas": min_replicas,
        "num_prefill": plan.num_prefill,
        "num_decode": plan.num_decode,
        "prefill_thpt_per_gpu": plan.prefill_thpt_per_gpu,
        "decode_thpt_per_gpu": plan.decode_thpt_per_gpu,
        "expected_ttft_ms": plan.expected_ttft_ms,
        "expected_itl_ms": plan.expected_itl_ms,
        "decode_kv_usage": plan.decode_kv_usage,
        "decode_context_tokens": plan.decode_context_tokens,
        "ttft_met": plan.expected_ttft_ms <= ttft_ms,
        "itl_met": plan.expected_itl_ms <= itl_ms,
        "prefill_reason": plan.prefill_reason,
        "decode_reason": plan.decode_reason,
    }
