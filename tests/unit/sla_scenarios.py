"""The small, hand-made worlds the SLA step's specifications run in (test_sla_scaling.py,
test_sla_demand.py, test_sla_learning.py).

A scenario feeds `sla_step` 5 s ticks of traffic (a `TrafficSample` per tick), explicit ready and
expected counts and, where the mechanism needs them, forward-pass records; a test pins one
mechanism with values computed by hand, or from the inputs through `app/core/sla/capacity.py` and
the learned iteration costs (`app/core/sla/latency.py`): the bundled H200 profile's prior until
records come, then the state's own model. No benchmark or trace is involved.

Unless a test is about the forecast, it runs with `trend=False`: growth and ramp then play no
part, and the demand is the level (the rate of the last `level_window_s`, or the smoother
`trend_window_s` one when higher) with the per-tick counts' index of dispersion.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from statistics import NormalDist

from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics
from app.core.perf.interpolation import PerfModel
from app.core.sla.capacity import (
    Bucket,
    LengthMix,
    PrefillSizing,
    decode_batch_limit,
    decode_concurrency,
    decode_iteration_ms,
    prefill_engines,
    profile_decode_floor,
)
from app.core.sla.latency import DecodeCost, LatencyModels, PrefillCost, prior_models
from app.core.sla.settings import SlaSettings
from app.core.sla.state import SlaState
from app.core.sla.step import sla_step
from app.core.sla.types import SlaInput, SlaResult, TrafficSample
from app.core.types import EngineKey, Role, RoleBounds
from app.sources.profile_files import load_profile

H200 = Path(__file__).resolve().parents[2] / "data" / "profiles" / "h200-llama3.1-8b-fp8"
TICK_S = 5.0
ISL, OSL = 2000.0, 150.0
CONTEXT = ISL + OSL / 2  # a decode batch's mean context, half-way through the outputs
CHUNK = 8192

Fpm = Mapping[Role, Mapping[EngineKey, ForwardPassMetrics]]


@cache
def h200_model() -> PerfModel:
    """The bundled H200 profile, read once for every scenario."""
    return PerfModel.from_profile(load_profile(H200))


def settings_for(model: PerfModel, roles: tuple[Role, ...], **overrides: object) -> SlaSettings:
    base = SlaSettings(
        ttft_target_ms=500.0,
        itl_target_ms=20.0,
        bounds={role: RoleBounds(1, 32) for role in roles},
        chunk_tokens=CHUNK,
        max_kv_tokens=model.decode.max_kv_tokens,
        trend=False,
        startup_estimate_s=120.0,  # the scenarios' lead until measured (the default reads 300)
    )
    return base.model_copy(update=overrides)


@dataclass
class Run:
    """One planner's ticks: the clock, the state it keeps, the counts it last ordered.

    By default the orders are followed at once (expected and ready become the target), as a
    cluster that applies every decision before the next tick would. `inventory_known` False
    stands for a service that cannot yet tell what runs (its counts are placeholders)."""

    model: PerfModel | None
    settings: SlaSettings
    expected: dict[Role, int]
    ready: dict[Role, int] | None = None
    inventory_known: bool = True
    state: SlaState = field(default_factory=SlaState)
    now_s: float = 0.0
    counts: list[float] = field(default_factory=list)  # requests per tick, as fed
    results: list[SlaResult] = field(default_factory=list)

    def tick(
        self,
        num_req: float | None,
        *,
        isl: float | None = ISL,
        osl: float | None = OSL,
        buckets: tuple[Bucket, ...] = (),
        fpm: Fpm | None = None,
        ready: dict[Role, int] | None = None,
        follow: bool = True,
        passes: Mapping[Role, list[ForwardPassMetrics]] | None = None,
    ) -> SlaResult:
        self.now_s += TICK_S
        traffic = None
        if num_req is not None:
            traffic = TrafficSample(self.now_s, TICK_S, num_req, isl, osl, buckets)
            self.counts.append(num_req)
        current_ready = ready if ready is not None else (self.ready or self.expected)
        result = sla_step(
            self.model,
            self.state,
            SlaInput(
                self.now_s,
                traffic,
                fpm or {},
                dict(current_ready),
                dict(self.expected),
                inventory_known=self.inventory_known,
                # Every forward pass of the interval, for the roles given.
                fpm_new=dict(passes or {}),
                fpm_complete=dict.fromkeys(passes or {}, True),
            ),
            self.settings,
        )
        if follow and result.replicas is not None:
            self.expected = dict(result.replicas)
        self.results.append(result)
        return result


# --- the sizing, by hand --------------------------------------------------------------------------


def prior_of(model: PerfModel, settings: SlaSettings) -> LatencyModels:
    """The iteration costs a planner starts from: the profile's points as the prior."""
    return prior_models(
        model,
        chunk_tokens=settings.chunk_tokens,
        prior_records=settings.latency_prior_records,
        half_life_s=settings.latency_half_life_s,
    )


def no_histogram_mix(settings: SlaSettings, isl: float = ISL) -> LengthMix:
    """The prompt lengths a planner sizes for when the traffic brings a mean ISL and no histogram
    (these ticks bring none): the mean at an exponential spread."""
    return LengthMix.exponential(isl, settings.quantile)


def mix_capacity(cost: PrefillCost, mix: LengthMix) -> float:
    """Prompt tokens per second one saturated engine computes of `mix`: its mean length over its
    mean busy time."""
    busy_s = sum(weight * cost.busy_s(length) for length, weight in mix.points)
    return sum(weight * length for length, weight in mix.points) / busy_s


def prefill_sizing(
    cost: PrefillCost,
    settings: SlaSettings,
    token_rate_s: float,
    mix: LengthMix,
    disp: float,
    correction: float = 1.0,
) -> PrefillSizing:
    return prefill_engines(
        cost,
        token_rate_s=token_rate_s,
        mix=mix,
        ttft_target_ms=settings.ttft_target_ms,
        quantile=settings.quantile,
        max_utilisation=settings.prefill_max_utilisation,
        max_engines=settings.bounds["prefill"].max_replicas,
        dispersion=disp,
        correction=correction,
    )


def prefill_wish(
    model: PerfModel,
    settings: SlaSettings,
    token_rate_s: float,
    mix: LengthMix,
    disp: float,
    cost: PrefillCost | None = None,
) -> int:
    """The prefill count for this demand on `cost` (the cold-start prior unless given)."""
    cost = cost or prior_of(model, settings).prefill
    return prefill_sizing(cost, settings, token_rate_s, mix, disp).engines


def batch_limit(
    model: PerfModel,
    settings: SlaSettings,
    cost: DecodeCost | None = None,
    *,
    floor: bool = True,
    scale: float = 1.0,
) -> int:
    """The planner's decode batch limit on `cost`; beyond its records the profile is the floor
    (`profile_decode_floor`, at the measured decode `scale`: 1 in these worlds unless a test
    slows them) unless `floor` is False."""
    return decode_batch_limit(
        cost or prior_of(model, settings).decode,
        isl_tokens=ISL,
        osl_tokens=OSL,
        itl_target_ms=settings.itl_target_ms * settings.decode_itl_margin,
        max_kv_tokens=settings.max_kv_tokens,
        max_num_seqs=settings.max_num_seqs,
        profile_itl_ms=profile_decode_floor(model, scale) if floor else None,
    )


def decode_wish(
    model: PerfModel, settings: SlaSettings, rate: float, disp: float, cost: DecodeCost | None = None
) -> int:
    """Little's law at the ITL target, at the pace of a full engine (1 unless the KV cache or
    `max_num_seqs` bounds the batch: then its iteration time over the ITL it is sized for), at
    the `decode_peak_quantile` of the requests in flight (normal approximation, variance mean ×
    dispersion), over the batch meeting the ITL."""
    cost = cost or prior_of(model, settings).decode
    limit = batch_limit(model, settings, cost)
    sized_ms = settings.itl_target_ms * settings.decode_itl_margin
    full_ms = decode_iteration_ms(cost, limit, CONTEXT, profile_decode_floor(model))
    kv_bound = limit >= int(settings.max_kv_tokens // (ISL + OSL))
    seqs_bound = settings.max_num_seqs is not None and limit >= settings.max_num_seqs
    pace = min(1.0, full_ms / sized_ms) if kv_bound or seqs_bound else 1.0
    mean = pace * decode_concurrency(
        request_rate_s=rate, osl_tokens=OSL, itl_target_ms=settings.itl_target_ms
    )
    z = NormalDist().inv_cdf(settings.decode_peak_quantile)
    peak = mean + z * math.sqrt(mean * disp)
    return math.ceil(peak / limit)


# --- forward-pass records -------------------------------------------------------------------------


def decode_record(model: PerfModel, worker: str, batch: int, ratio: float = 1.0) -> ForwardPassMetrics:
    """A decode iteration of `batch` requests at CONTEXT whose wall time is `ratio` × the
    profile's ITL for that batch. A new object each call: the planner folds each record once."""
    wall_s = model.decode_itl_ms(batch, CONTEXT) / 1000.0 * ratio
    return ForwardPassMetrics(
        worker_id=worker,
        dp_rank=0,
        wall_time_s=wall_s,
        scheduled=ScheduledRequestMetrics(
            num_decode_requests=batch, sum_decode_kv_tokens=int(batch * CONTEXT)
        ),
    )


def prefill_record(
    model: PerfModel, worker: str, *, ratio: float = 1.0, queued_tokens: int = 0
) -> ForwardPassMetrics:
    """A prefill iteration of one full chunk, `ratio` × the profile's time, with a queue."""
    return ForwardPassMetrics(
        worker_id=worker,
        dp_rank=0,
        wall_time_s=model.prefill_ttft_ms(CHUNK) / 1000.0 * ratio,
        scheduled=ScheduledRequestMetrics(num_prefill_requests=1, sum_prefill_tokens=CHUNK),
        queued=QueuedRequestMetrics(num_prefill_requests=1, sum_prefill_tokens=queued_tokens),
    )


def decode_fpm(model: PerfModel, batches: list[int], ratio: float = 1.0) -> Fpm:
    return {"decode": {(f"d{i}", 0): decode_record(model, f"d{i}", b, ratio) for i, b in enumerate(batches)}}
