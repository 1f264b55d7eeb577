"""SLA scaling (`app/core/sla/`) driven tick by tick on small, hand-made scenarios.

Each test feeds `sla_step` 5 s ticks of traffic (a `TrafficSample` per tick), explicit ready and
expected counts and, where the mechanism needs them, forward-pass records; it pins one mechanism
with values recomputed here from the inputs through `app/core/sla/capacity.py` and the learned
iteration costs (`app/core/sla/latency.py`): the bundled H200 profile's prior until records come,
then the state's own model. No benchmark or trace is involved.

Unless a test is about the forecast, it runs with `trend=False`: growth and ramp then play no
part, and the demand is the level (the rate of the last `level_window_s`, or the smoother
`trend_window_s` one when higher) with the per-tick counts' index of dispersion.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest

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
from app.core.sla.demand import _growth_quantiles, _quantile_line, _surge, busiest_rate
from app.core.sla.latency import DecodeCost, LatencyModels, PrefillCost, prefill_features, prior_models
from app.core.sla.settings import SlaSettings
from app.core.sla.state import LevelRecord, Order, SlaState
from app.core.sla.step import scale_down_window_s, sla_step
from app.core.sla.types import SlaInput, SlaReason, SlaResult, TrafficSample
from app.core.types import EngineKey, Role, RoleBounds
from app.sources.profile_files import load_profile

H200 = Path(__file__).resolve().parents[2] / "data" / "profiles" / "h200-llama3.1-8b-fp8"
TICK_S = 5.0
ISL, OSL = 2000.0, 150.0
CONTEXT = ISL + OSL / 2  # a decode batch's mean context, half-way through the outputs
CHUNK = 8192

Fpm = Mapping[Role, Mapping[EngineKey, ForwardPassMetrics]]


@pytest.fixture(scope="module")
def h200() -> PerfModel:
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
    cluster that applies every decision before the next tick would."""

    model: PerfModel | None
    settings: SlaSettings
    expected: dict[Role, int]
    ready: dict[Role, int] | None = None
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
            SlaInput(self.now_s, traffic, fpm or {}, dict(current_ready), dict(self.expected)),
            self.settings,
        )
        if follow and result.replicas is not None:
            self.expected = dict(result.replicas)
        self.results.append(result)
        return result


# --- hand computations of the demand --------------------------------------------------------------


def window_rate(counts: list[float], window_s: float) -> float:
    """Requests per second over the last `window_s` of 5 s ticks."""
    kept = counts[-int(window_s // TICK_S) :]
    return sum(kept) / (len(kept) * TICK_S)


def level_rate(counts: list[float], settings: SlaSettings) -> float:
    """The rate sized for without a forecast: the busiest `burst_window_s` of the level window
    (5 s ticks: two consecutive ticks), or the smoother trend level if higher."""
    recent = counts[-int(settings.level_window_s // TICK_S) :]
    per = int(settings.burst_window_s // TICK_S)
    busiest = max(sum(recent[i : i + per]) for i in range(len(recent) - per + 1)) / settings.burst_window_s
    return max(busiest, window_rate(counts, settings.trend_window_s))


def prior_of(model: PerfModel, settings: SlaSettings) -> LatencyModels:
    """The iteration costs a planner starts from: the profile's points as the prior."""
    return prior_models(
        model,
        chunk_tokens=settings.chunk_tokens,
        prior_records=settings.latency_prior_records,
        caution_z=settings.latency_caution_z,
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


# --- a. a burst inside an interval ----------------------------------------------------------------


def test_a_burst_raises_prefill_on_the_very_next_tick(h200: PerfModel) -> None:
    settings = settings_for(h200, ("prefill",))
    steady, burst = 100.0, 600.0  # 20 req/s, then 120 req/s (6×) for two ticks (10 s)
    mix = no_histogram_mix(settings)
    steady_wish = prefill_wish(h200, settings, steady / TICK_S * ISL, mix, 1.0)
    run = Run(h200, settings, expected={"prefill": steady_wish})

    # Three minutes of steady traffic: the count is right from the start and stays.
    for _ in range(36):
        result = run.tick(steady)
        assert (result.replicas, result.reason) == ({"prefill": steady_wish}, SlaReason.NO_CHANGE)
        assert result.diagnostics["demand"]["dispersion"] == 1.0  # identical ticks: Poisson at most

    # The burst's first tick: the busiest 10 s of the level window now hold 5 s of it.
    result = run.tick(burst)
    rate = level_rate(run.counts, settings)
    assert rate == (steady + burst) / 10.0  # 70 req/s: the busiest 10 s, above the 60 s level
    # 36 identical counts then one 500 higher: the differences are 35 zeros and one 500, whose
    # median absolute deviation is 0: one step is a change of level, not burstiness.
    disp = 1.0
    # No forward pass is fed: the costs are the cold-start prior's throughout.
    prior = prior_of(h200, settings).prefill
    sizing = prefill_sizing(prior, settings, rate * ISL, mix, disp)
    # Pinned on the H200 prior: 40,000 then 140,000 tokens/s at 34,159 tokens/s per engine (the
    # prior's line read 2σ high, over the exponential mix of 2000-token mean; 36,231 for prompts
    # all of 2000 tokens), which the 500 ms target lets run at the 0.9 cap: 40000 / 30743 =
    # 1.3 -> 2 and 140000 / 30743 = 4.6 -> 5. (The old profile × scale formula's 48,191 tokens/s
    # per engine gave (2, 4).)
    assert (steady_wish, sizing.engines) == (2, 5)
    assert sizing.engines == math.ceil(rate * ISL / (mix_capacity(prior, mix) * 0.9))
    assert result.reason == SlaReason.SCALE_UP
    assert result.replicas == {"prefill": sizing.engines}
    roles = result.diagnostics["roles"]["prefill"]
    assert (roles["wish"], roles["needed"], roles["reason"]) == (sizing.engines, sizing.engines, "scale_up")
    assert result.diagnostics["demand"]["token_rate_s"] == round(rate * ISL, 1)
    assert result.diagnostics["demand"]["dispersion"] == round(disp, 2)
    # Never sized for 100%: at the chosen count each engine runs at most at the cap.
    capacity = mix_capacity(prior, mix)
    assert roles["capacity_tokens_s"] == round(capacity, 1)
    assert sizing.utilisation == pytest.approx(rate * ISL / (sizing.engines * capacity), rel=1e-12)
    assert sizing.utilisation <= settings.prefill_max_utilisation
    assert roles["utilisation"] == round(sizing.utilisation, 3)
    first = sizing.engines

    # The second burst tick: 10 s of it in the level window; up again at once if that needs more.
    result = run.tick(burst)
    rate = level_rate(run.counts, settings)
    assert rate == 2 * burst / 10.0
    # Still Poisson: the differences are 35 zeros, one 500 and one 0 (median deviation 0).
    assert result.diagnostics["demand"]["dispersion"] == 1.0
    second = prefill_wish(h200, settings, rate * ISL, mix, 1.0)
    # 70 req/s, then 120 req/s: pinned on the H200 prior (240000 / 30743 = 7.8 -> 8; the old
    # formula gave (4, 6)).
    assert (first, second) == (5, 8)
    assert (result.replicas, result.reason) == ({"prefill": second}, SlaReason.SCALE_UP)


# --- b. a scale-down during a decode drain --------------------------------------------------------


def drain_batches(target: int) -> list[int]:
    """What the decode engines hold: before any scale-down 3 engines with 30 requests each; once
    the target went down, the drained engines' requests sit on the first engine (a large batch,
    100) and one more engine, still draining, keeps 20."""
    return [30] * 3 if target >= 3 else [100, 20]


def test_b_decode_scale_down_waits_for_the_window_then_takes_its_highest_wish(h200: PerfModel) -> None:
    # The window is two leads here (the default is a fixed 60 s), so that it is long enough to
    # watch both holds.
    settings = settings_for(h200, ("decode",), decode_itl_margin=0.95, scale_down_window_leads=2.0)
    high, low = 500.0, 150.0  # 100 req/s for a minute, then 30 req/s
    # The records are the profile's ITL for their batch (the world is the profile): each tick's
    # are learned, so the batch limit is the state's model's, not the cold-start prior's. After
    # the first tick's records (three of 30 requests in 9.6 ms, where the prior reads its line 2σ
    # high), the line alone would allow 129 at 95% of the ITL target (the prior's line 119); the
    # profile, the floor beyond the 30 requests seen, allows 107.
    prior = prior_of(h200, settings)
    first = prior.observed("decode", decode_fpm(h200, drain_batches(3))["decode"].values(), TICK_S).decode
    high_wish = decode_wish(h200, settings, high / TICK_S, 1.0, cost=first)
    lines = (batch_limit(h200, settings, floor=False), batch_limit(h200, settings, first, floor=False))
    assert lines == (119, 129)
    assert batch_limit(h200, settings) == batch_limit(h200, settings, first) == 107
    # 100 req/s: 338 requests in flight at the 0.99 peak quantile, 4 engines of 107.
    assert high_wish == 4
    run = Run(h200, settings, expected={"decode": high_wish})
    wishes: list[tuple[float, int]] = []
    first_s = TICK_S
    # No scale-up, so no lead measured: two leads of the 120 s estimate.
    window_s = 240.0

    def tick(num_req: float) -> tuple[SlaResult, int, int]:
        before = run.expected["decode"]
        result = run.tick(num_req, fpm=decode_fpm(h200, drain_batches(before)))
        decode = result.diagnostics["roles"]["decode"]
        wishes.append((run.now_s, decode["wish"]))
        # The records' wall times are the profile's for their batch, large or not: the scale
        # (a diagnostic now) stays 1, and the limit is the learned model's.
        assert run.state.scale["decode"] == 1.0
        limit = batch_limit(h200, settings, run.state.latency.decode)  # type: ignore[union-attr]
        assert decode["batch_limit"] == limit
        # The requests held never exceed the traffic's need here: the wish follows the traffic.
        assert math.ceil(decode["held_now"] / limit) <= decode["wish"]
        return result, before, decode["wish"]

    for _ in range(12):  # t = 5 ... 60, identical ticks
        result, _, _ = tick(high)
        assert (result.replicas, result.reason) == ({"decode": high_wish}, SlaReason.NO_CHANGE)

    reasons: list[tuple[float, SlaReason]] = []
    while run.now_s < 800.0:
        result, before, wish = tick(low)
        now, target = run.now_s, result.replicas["decode"]  # type: ignore[index]
        decode = result.diagnostics["roles"]["decode"]
        reasons.append((now, result.reason))
        assert result.diagnostics["scale_down_window_s"] == window_s
        if wish > before:  # up at once (a drop never gets here: see the next test)
            assert (target, result.reason) == (wish, SlaReason.SCALE_UP)
        elif wish == before:
            assert (target, result.reason) == (before, SlaReason.NO_CHANGE)
        elif now - first_s < window_s:
            # Not a full window watched yet: whatever the wish, nothing goes down.
            assert (target, result.reason) == (before, SlaReason.HOLD)
            assert decode["hold"] == f"watched {now - first_s:.0f} s of the 240 s window"
        else:
            highest = max(w for t, w in wishes if t >= now - window_s)
            if highest < before:
                assert (target, result.reason) == (highest, SlaReason.SCALE_DOWN)
            else:
                assert (target, result.reason) == (before, SlaReason.HOLD)
                assert decode["hold"] == f"highest wish of the window is {highest}"

    # Both holds happened: first for the watch, then for the window's highest wish.
    assert any(r == SlaReason.HOLD and t < first_s + window_s for t, r in reasons)
    assert any(r == SlaReason.HOLD and t >= first_s + window_s for t, r in reasons)
    # The first scale-down comes one tick after the last tick that wished the count held has
    # become older than the window (a wish exactly one window old still counts).
    held = max(r.replicas["decode"] for r in run.results)  # type: ignore[index]
    first_down = next(t for t, r in reasons if r == SlaReason.SCALE_DOWN)
    assert first_down == max(t for t, w in wishes if w >= held) + window_s + TICK_S
    # Once the drop has left the lookback the dispersion is back to 1: the target is the low
    # traffic's own count, on the model learned by then (30 req/s: 111 requests in flight at the
    # peak quantile, beyond the 100 the engines were seen holding, where the profile's 107 is
    # the limit: two engines).
    low_wish = decode_wish(h200, settings, low / TICK_S, 1.0, cost=run.state.latency.decode)  # type: ignore[union-attr]
    assert run.results[-1].diagnostics["demand"]["dispersion"] == 1.0
    assert wishes[-1][1] == low_wish == 2
    assert run.expected == {"decode": low_wish}


def test_b_a_traffic_drop_never_raises_the_decode_wish(h200: PerfModel) -> None:
    settings = settings_for(h200, ("decode",))
    high_wish = decode_wish(h200, settings, 100.0, 1.0)
    run = Run(h200, settings, expected={"decode": high_wish})
    for _ in range(12):
        run.tick(500.0)
    for _ in range(12):
        result = run.tick(150.0)  # 100 req/s -> 30 req/s
        assert result.diagnostics["roles"]["decode"]["wish"] <= high_wish


def test_b_decode_scale_follows_slower_iterations_by_ewma(h200: PerfModel) -> None:
    settings = settings_for(h200, ("decode",))
    run = Run(h200, settings, expected={"decode": 2})
    run.tick(150.0, fpm=decode_fpm(h200, [60, 60], ratio=1.0))
    assert run.state.scale["decode"] == 1.0
    scale = 1.0
    for _ in range(6):
        result = run.tick(150.0, fpm=decode_fpm(h200, [60, 60], ratio=1.2))
        scale += settings.scale_smoothing * (1.2 - scale)
        assert run.state.scale["decode"] == pytest.approx(scale, rel=1e-12)
        assert result.diagnostics["scale"]["decode"] == round(run.state.scale["decode"], 4)
        assert result.diagnostics["scale_samples"] == {"decode": 2}
    # 1.0, then 1.06, 1.102, 1.1314, ...: towards 1.2, never past it.
    assert scale == pytest.approx(1.2 - 0.2 * 0.7**6, rel=1e-12)
    # The scale is a diagnostic now: the batch limit is the learned model's (14 records of 60
    # requests in 15.4 ms, and the prior), and iterations slower than the profile raise the
    # learned line above that of the same ticks at the profile's speed (12.9 ms): alone, it would
    # allow 127 requests against 145. Beyond the 60 requests seen the profile times the measured
    # scale is the floor, higher than both lines: 113 at the profile's speed, 88 at x1.18.
    decode = result.diagnostics["roles"]["decode"]
    measured = run.state.scale["decode"]
    assert decode["batch_limit"] == batch_limit(h200, settings, run.state.latency.decode, scale=measured)  # type: ignore[union-attr]
    same = Run(h200, settings, expected={"decode": 2})
    for _ in range(7):
        same.tick(150.0, fpm=decode_fpm(h200, [60, 60], ratio=1.0))
    lines = (
        batch_limit(h200, settings, run.state.latency.decode, floor=False),  # type: ignore[union-attr]
        batch_limit(h200, settings, same.state.latency.decode, floor=False),  # type: ignore[union-attr]
    )
    assert lines == (127, 145)
    limits = (decode["batch_limit"], same.results[-1].diagnostics["roles"]["decode"]["batch_limit"])
    assert limits == (88, 113)


def test_b_scale_ratio_is_clamped_then_smoothed(h200: PerfModel) -> None:
    settings = settings_for(h200, ("decode",))
    low, high = settings.scale_bounds
    run = Run(h200, settings, expected={"decode": 2})
    run.tick(150.0, fpm=decode_fpm(h200, [60], ratio=10.0))  # 10× slower: clamped to 4
    assert run.state.scale["decode"] == high
    run.tick(150.0, fpm=decode_fpm(h200, [60], ratio=0.1))  # 10× faster: clamped to 0.5, smoothed
    assert run.state.scale["decode"] == pytest.approx(
        high + settings.scale_smoothing * (low - high), rel=1e-12
    )


def test_b_scale_takes_the_median_of_fresh_records_only(h200: PerfModel) -> None:
    settings = settings_for(h200, ("decode",))
    run = Run(h200, settings, expected={"decode": 2})
    records = {
        ("d0", 0): decode_record(h200, "d0", 60, 1.0),
        ("d1", 0): decode_record(h200, "d1", 60, 1.2),
        ("d2", 0): decode_record(h200, "d2", 60, 3.0),  # an outlier does not move the median
    }
    result = run.tick(150.0, fpm={"decode": records})
    assert run.state.scale["decode"] == pytest.approx(1.2, rel=1e-12)
    assert result.diagnostics["scale_samples"] == {"decode": 3}
    # Without `fpm_new`, the latency model learns each engine's latest record when it is new.
    assert result.diagnostics["latency"]["decode"]["learned_now"] == 3
    assert result.diagnostics["latency"]["decode"]["records"] == 3
    # The same records again (no new iteration reported): nothing folded, the scale stays.
    result = run.tick(150.0, fpm={"decode": records})
    assert run.state.scale["decode"] == pytest.approx(1.2, rel=1e-12)
    assert result.diagnostics["scale_samples"] == {"decode": 0}
    assert result.diagnostics["latency"]["decode"]["learned_now"] == 0
    assert result.diagnostics["latency"]["decode"]["records"] == 3


def test_learned_prefill_iterations_and_the_backlog_enter_the_prefill_wish(h200: PerfModel) -> None:
    # A prefill world 1.5× slower than the profile (a full chunk in 255 ms, the profile says
    # 170), and 6 M prompt tokens queued: the queue must be cleared within the lead (the startup
    # estimate, 120 s, nothing measured yet).
    settings = settings_for(h200, ("prefill",))
    run = Run(h200, settings, expected={"prefill": 1})
    fpm = {"prefill": {("p0", 0): prefill_record(h200, "p0", ratio=1.5, queued_tokens=6_000_000)}}
    result = run.tick(100.0, fpm=fpm)
    assert run.state.scale["prefill"] == pytest.approx(1.5, rel=1e-12)  # a diagnostic
    # The one record is learned (no `fpm_new`: the engine's latest record, new). Worth 1
    # against the prior's 10, it moves the chunk's cost part of the way from the prior's line
    # (169 ms) towards the world's 255 ms.
    learned = run.state.latency.prefill  # type: ignore[union-attr]
    prior = prior_of(h200, settings).prefill
    assert result.diagnostics["latency"]["prefill"]["learned_now"] == 1
    assert prior.model.mean_ms(prefill_features(CHUNK, 0)) < learned.iteration_ms(CHUNK) < 255.0
    assert learned.iteration_ms(CHUNK) == pytest.approx(184.98, rel=1e-4)
    # The one engine is behind (6 M queued) and its capacity is just under the arrivals' 40,000
    # tokens/s, so the queue also grows for the lead before more engines could serve. Of the
    # 6 M, the engine clears 4.7 M itself within the lead; the rest waits on it whatever the
    # count, and orders nothing.
    mix = no_histogram_mix(settings)
    capacity = mix_capacity(learned, mix)
    growth = (100.0 / TICK_S * ISL - capacity) * settings.startup_estimate_s
    own = capacity * settings.startup_estimate_s
    backlog = (own + growth) / max(settings.startup_estimate_s, settings.level_window_s)
    token_rate = 100.0 / TICK_S * ISL + backlog
    expected = prefill_wish(h200, settings, token_rate, mix, 1.0, cost=learned)
    prefill = result.diagnostics["roles"]["prefill"]
    assert prefill["backlog_growth_tokens"] == round(growth, 1) == 104_911.7
    assert prefill["backlog_tokens_s"] == round(backlog, 1) == 40_000.0
    assert prefill["queued_tokens"] == 6_000_000
    assert prefill["stuck_tokens"] == round(6_000_000 - own, 1) == 1_304_911.7
    assert prefill["capacity_tokens_s"] == round(capacity, 1)
    assert result.replicas == {"prefill": expected}
    # 80,000 tokens/s: 3 engines; the traffic alone (40,000 tokens/s) would need 2.
    no_queue = prefill_wish(h200, settings, 100.0 / TICK_S * ISL, mix, 1.0, cost=learned)
    assert (expected, no_queue) == (3, 2)


def test_a_crowd_on_too_few_engines_orders_for_the_backlog_the_lead_will_add(h200: PerfModel) -> None:
    """Engines ordered now serve a lead later, and requests are routed on arrival: the queue they
    find is the one seen now plus all the lead's arrivals beyond the ready engines' capacity. So
    while the engines' queue shows they are behind, prefill is sized to drain that future queue
    within the lead, and decode for the prompts that drain brings it."""
    settings = settings_for(h200, ("prefill", "decode"))
    lead_s = settings.startup_estimate_s  # nothing measured yet: 120 s
    crowd = 1_000.0  # 200 req/s of 2,000 tokens, on 2 prefill engines
    queued = 2_000_000

    def fpm(queued_tokens: int) -> Fpm:
        half = queued_tokens // 2
        return {
            "prefill": {(f"p{i}", 0): prefill_record(h200, f"p{i}", queued_tokens=half) for i in range(2)},
            **decode_fpm(h200, [100, 100]),
        }

    run = Run(h200, settings, expected={"prefill": 2, "decode": 2}, ready={"prefill": 2, "decode": 2})
    first = run.tick(crowd, fpm=fpm(queued))
    cost = run.state.latency.prefill  # type: ignore[union-attr]
    mix = no_histogram_mix(settings)
    capacity = mix_capacity(cost, mix)
    arriving = crowd / TICK_S * ISL
    # No order open yet: the ready engines are all there is for the whole lead.
    growth = (arriving - 2 * capacity) * lead_s
    prefill = first.diagnostics["roles"]["prefill"]
    assert prefill["backlog_growth_tokens"] == round(growth, 1)
    draining = (queued + growth) / lead_s
    assert prefill["backlog_tokens_s"] == round(draining, 1)
    wish = prefill_wish(h200, settings, arriving + draining, mix, 1.0, cost=cost)
    seen_only = prefill_wish(h200, settings, arriving + queued / lead_s, mix, 1.0, cost=cost)
    assert first.replicas is not None and first.replicas["prefill"] == wish
    assert (wish, seen_only) == (21, 12)  # for the queue seen now alone: 12
    # Decode is sized for the drained prompts' flow as well as the arrivals' (at the target's
    # pace: the target bounds the batch).
    drained_flight = decode_concurrency(
        request_rate_s=draining / ISL, osl_tokens=OSL, itl_target_ms=settings.itl_target_ms
    )
    decode = first.diagnostics["roles"]["decode"]
    assert decode["pace"] == 1.0
    assert decode["backlog_in_flight"] == pytest.approx(drained_flight, abs=0.1)

    # 5 s later the order is open, due in 115 s: the ready engines until then, the ordered
    # count for the lead's last 5 s (it covers the arrivals: nothing more from it).
    second = run.tick(crowd, fpm=fpm(queued), ready={"prefill": 2, "decode": 2})
    cost = run.state.latency.prefill  # type: ignore[union-attr]
    capacity = mix_capacity(cost, mix)
    before = (arriving - 2 * capacity) * (lead_s - TICK_S)
    after = max(0.0, arriving - wish * capacity) * TICK_S
    assert after == 0.0
    assert second.diagnostics["roles"]["prefill"]["backlog_growth_tokens"] == round(before + after, 1)

    # A queue under a TTFT target's work per ready engine is not being behind: nothing is added.
    calm = Run(h200, settings, expected={"prefill": 2, "decode": 2})
    short = calm.tick(crowd, fpm=fpm(10_000))
    assert short.diagnostics["roles"]["prefill"]["backlog_growth_tokens"] == 0.0
    # Decode still takes what that queue's drain sends it: 10,000 tokens over the lead.
    short_flight = decode_concurrency(
        request_rate_s=10_000 / lead_s / ISL, osl_tokens=OSL, itl_target_ms=settings.itl_target_ms
    )
    assert short.diagnostics["roles"]["decode"]["backlog_in_flight"] == pytest.approx(short_flight, abs=0.1)
    assert short_flight < 0.5


def test_a_queue_stuck_on_its_engines_orders_no_engine_that_cannot_take_it(h200: PerfModel) -> None:
    """After a crowd, the two engines that were running when it came still hold 50 M prompt
    tokens each; twelve engines serve the new arrivals. A prompt waits on the engine it was routed
    to, so engines added now would take new arrivals only: the queue counts as load up to what its
    own engine clears within the lead, and the rest (`stuck_tokens`) orders nothing."""
    settings = settings_for(h200, ("prefill",))
    lead_s = settings.startup_estimate_s
    stuck = 50_000_000
    queues = [stuck, stuck] + [0] * 10
    fpm = {
        "prefill": {
            (f"p{i}", 0): prefill_record(h200, f"p{i}", queued_tokens=q) for i, q in enumerate(queues)
        }
    }
    run = Run(h200, settings, expected={"prefill": 12}, ready={"prefill": 12})
    result = run.tick(100.0, fpm=fpm)
    cost = run.state.latency.prefill  # type: ignore[union-attr]
    mix = no_histogram_mix(settings)
    capacity = mix_capacity(cost, mix)
    arriving = 100.0 / TICK_S * ISL
    prefill = result.diagnostics["roles"]["prefill"]
    # Each engine clears `capacity × lead` of its own queue; the 2 × 50 M are far beyond that.
    own = capacity * lead_s
    assert prefill["queued_tokens"] == 2 * stuck
    assert prefill["stuck_tokens"] == round(2 * (stuck - own), 1)
    # The queue is behind, so the lead's arrivals beyond the ready engines' capacity count too
    # (none here: twelve engines take 40,000 tokens/s).
    assert prefill["backlog_growth_tokens"] == 0.0
    assert prefill["backlog_tokens_s"] == round(2 * own / lead_s, 1)
    wish = prefill_wish(h200, settings, arriving + 2 * capacity, mix, 1.0, cost=cost)
    everything = prefill_wish(h200, settings, arriving + 2 * stuck / lead_s, mix, 1.0, cost=cost)
    assert prefill["wish"] == wish
    # The arrivals' engines plus the two that are busy with their own queue; for the whole queue
    # it would have been many more, to stand idle: new engines take new arrivals only.
    alone = prefill_wish(h200, settings, arriving, mix, 1.0, cost=cost)
    assert (alone, wish, everything) == (2, 4, 25)

    # While an order is open, the queue is also the first sign of a rise the level lags behind
    # (a crowd's first seconds on the engines it found), and it counts whole. The first tick
    # has no order open: the arrivals' 2 engines and the 2 busy with their queues. Its order
    # open, the next tick sizes for the whole queue, as `everything` above.
    rising = Run(h200, settings, expected={"prefill": 2}, ready={"prefill": 2})
    crowd = {"prefill": {(f"p{i}", 0): prefill_record(h200, f"p{i}", queued_tokens=stuck) for i in range(2)}}
    first = rising.tick(100.0, fpm=crowd)
    assert first.replicas == {"prefill": wish}
    own = mix_capacity(rising.state.latency.prefill, mix) * lead_s  # type: ignore[union-attr]
    assert first.diagnostics["roles"]["prefill"]["stuck_tokens"] == round(2 * (stuck - own), 1)
    assert "prefill" in rising.state.orders
    second = rising.tick(100.0, fpm=crowd, ready={"prefill": 2})
    assert second.diagnostics["roles"]["prefill"]["stuck_tokens"] == 0.0
    assert second.replicas == {"prefill": everything}
    # The order the lead is measured by can close before the engines all serve: one placed for
    # 2 engines keeps its count when the crowd raises the target, and closes when the second is
    # ready. The engines still on their way (25 expected, 3 ready) keep the queue whole.
    rising.state.orders.clear()
    third = rising.tick(100.0, fpm=crowd, ready={"prefill": 3})
    assert rising.expected == {"prefill": everything}
    assert third.diagnostics["roles"]["prefill"]["stuck_tokens"] == 0.0
    assert third.replicas == {"prefill": everything}


def test_decode_takes_the_drain_of_a_queue_stuck_on_its_engines(h200: PerfModel) -> None:
    """The two engines a crowd found clear their own queue at their own pace, and each prompt
    they clear reaches decode on top of the arrivals, though nothing more is ordered for it and
    the backlog no longer grows: decode is sized for that drain too."""
    settings = settings_for(h200, ("prefill", "decode"))
    stuck = 50_000_000
    queues = [stuck, stuck] + [0] * 10
    fpm = {
        "prefill": {
            (f"p{i}", 0): prefill_record(h200, f"p{i}", queued_tokens=q) for i, q in enumerate(queues)
        },
        **decode_fpm(h200, [100] * 6),
    }
    run = Run(h200, settings, expected={"prefill": 12, "decode": 6}, ready={"prefill": 12, "decode": 6})
    result = run.tick(100.0, fpm=fpm)
    prefill, decode = result.diagnostics["roles"]["prefill"], result.diagnostics["roles"]["decode"]
    assert prefill["backlog_growth_tokens"] == 0.0
    assert prefill["stuck_tokens"] > 0
    drained = decode_concurrency(
        request_rate_s=prefill["backlog_tokens_s"] / ISL, osl_tokens=OSL, itl_target_ms=settings.itl_target_ms
    )
    assert decode["pace"] == 1.0
    assert decode["backlog_in_flight"] == pytest.approx(drained, abs=0.1)
    assert drained > 100  # two engines' worth of prompts: a decode engine's batch or more


def test_max_num_seqs_caps_the_decode_batch(h200: PerfModel) -> None:
    # The cold-start limit at 20 ms is above 64 requests; an engine that schedules at most 64
    # holds no more. A full engine of 64 then iterates in 15.3 ms, not 20: its requests leave
    # sooner, and 60 req/s keep 137 requests in flight at that pace (164 at the 0.99 peak
    # quantile), 3 engines, not the 4 Little's law at the target would say (210 at the peak).
    free = settings_for(h200, ("decode",))
    capped = settings_for(h200, ("decode",), max_num_seqs=64)
    assert batch_limit(h200, free) > 64
    results = {}
    for name, settings in (("free", free), ("capped", capped)):
        run = Run(h200, settings, expected={"decode": 1})
        results[name] = run.tick(300.0).diagnostics["roles"]["decode"]
    assert results["capped"]["batch_limit"] == 64
    assert results["free"]["batch_limit"] == batch_limit(h200, free)
    full_ms = decode_iteration_ms(prior_of(h200, capped).decode, 64, CONTEXT, profile_decode_floor(h200))
    assert results["capped"]["pace"] == round(full_ms / capped.itl_target_ms, 4) == 0.7632
    assert results["free"]["pace"] == 1.0  # the target bounds its batch
    assert results["capped"]["wish"] == math.ceil(results["capped"]["in_flight_at_target"] / 64)
    at_target = decode_concurrency(request_rate_s=60.0, osl_tokens=OSL, itl_target_ms=capped.itl_target_ms)
    peak_at_target = at_target + NormalDist().inv_cdf(capped.decode_peak_quantile) * math.sqrt(at_target)
    assert math.ceil(peak_at_target / 64) == 4
    assert (results["free"]["wish"], results["capped"]["wish"]) == (2, 3)
    assert (results["free"]["wish"], results["capped"]["wish"]) == (
        decode_wish(h200, free, 60.0, 1.0),
        decode_wish(h200, capped, 60.0, 1.0),
    )


def test_a_kv_bound_decode_batch_is_sized_at_a_full_engines_pace_unless_engines_run_slower(
    h200: PerfModel,
) -> None:
    """Long contexts fill an engine's KV cache before its iterations reach the ITL target: a full
    engine (46 requests of 20k tokens) iterates in 40 ms of a 60 ms target, its requests leave
    sooner, and fewer are in flight than Little's law at the target says: 4 engines, not 5.
    An engine seen beyond the target (65 ms) makes the target bound the batch again: pace 1.
    At a 120 ms target the batch stays the KV cache's, and an engine seen at 100 ms where the
    model, barely moved off its prior by one record, pictures a full engine at 55 ms sets the
    pace: 100 / 120, not 55 / 120."""
    settings = settings_for(h200, ("decode",), itl_target_ms=60.0)
    isl, osl = 20_000.0, 150.0
    kv_bound = int(settings.max_kv_tokens // (isl + osl))
    calm = Run(h200, settings, expected={"decode": 1}).tick(100.0, isl=isl, osl=osl)
    decode = calm.diagnostics["roles"]["decode"]
    assert decode["batch_limit"] == kv_bound == 46
    full_ms = decode_iteration_ms(
        prior_of(h200, settings).decode, kv_bound, isl + osl / 2, profile_decode_floor(h200)
    )
    assert decode["pace"] == round(full_ms / 60.0, 4) == 0.6689
    z = NormalDist().inv_cdf(settings.decode_peak_quantile)
    mean = decode_concurrency(request_rate_s=100.0 / TICK_S, osl_tokens=osl, itl_target_ms=60.0)
    assert decode["in_flight_at_target"] == round(
        full_ms / 60.0 * mean + z * math.sqrt(full_ms / 60.0 * mean), 1
    )
    assert decode["wish"] == math.ceil(decode["in_flight_at_target"] / kv_bound) == 4
    assert math.ceil((mean + z * math.sqrt(mean)) / kv_bound) == 5

    overrun = ForwardPassMetrics(
        worker_id="d0",
        dp_rank=0,
        wall_time_s=0.065,
        scheduled=ScheduledRequestMetrics(num_decode_requests=30, sum_decode_kv_tokens=30 * 20_075),
    )
    run = Run(h200, settings, expected={"decode": 1})
    decode = run.tick(100.0, isl=isl, osl=osl, fpm={"decode": {("d0", 0): overrun}}).diagnostics["roles"][
        "decode"
    ]
    model_full_ms = decode_iteration_ms(
        run.state.latency.decode,  # type: ignore[union-attr]
        decode["batch_limit"],
        decode["held_context_tokens"],
        profile_decode_floor(h200, decode["floor_scale"]),
    )
    assert model_full_ms < 40.0 < 65.0
    assert decode["pace"] == 1.0
    assert decode["batch_limit"] < kv_bound

    loose = settings_for(h200, ("decode",), itl_target_ms=120.0)
    slow = ForwardPassMetrics(
        worker_id="d0",
        dp_rank=0,
        wall_time_s=0.100,
        scheduled=ScheduledRequestMetrics(num_decode_requests=46, sum_decode_kv_tokens=46 * 20_075),
    )
    run = Run(h200, loose, expected={"decode": 1})
    decode = run.tick(100.0, isl=isl, osl=osl, fpm={"decode": {("d0", 0): slow}}).diagnostics["roles"][
        "decode"
    ]
    assert decode["batch_limit"] == kv_bound
    model_full_ms = decode_iteration_ms(
        run.state.latency.decode,  # type: ignore[union-attr]
        kv_bound,
        decode["held_context_tokens"],
        profile_decode_floor(h200, decode["floor_scale"]),
    )
    assert round(model_full_ms, 1) == 55.2
    assert decode["pace"] == round(100.0 / 120.0, 4)


def test_decode_sizes_the_requests_to_come_at_the_windows_context_and_those_held_at_their_own(
    h200: PerfModel,
) -> None:
    """A tick's few requests are a noisy sample of the mix. For a minute two decode engines hold
    20 requests of 8,075 tokens each; then one tick they hold 5 of 24,000. The requests to come
    are sized at the context held over the trend window (Σ KV tokens ÷ Σ requests of its 12
    ticks: 8,428.9), a batch of 81, so the wish stays 2; the 10 held now are sized at their own
    24,000 (a batch of 29). Sized at the tick's context, as before, the same demand wished 4."""
    settings = settings_for(h200, ("decode",), itl_target_ms=30.0)
    isl, osl = 8000.0, 150.0

    def held(n: int, context: float) -> Fpm:
        return {
            "decode": {
                (w, 0): ForwardPassMetrics(
                    worker_id=w,
                    dp_rank=0,
                    wall_time_s=h200.decode_itl_ms(n, context) / 1000.0,
                    scheduled=ScheduledRequestMetrics(
                        num_decode_requests=n, sum_decode_kv_tokens=int(n * context)
                    ),
                )
                for w in ("d0", "d1")
            }
        }

    run = Run(h200, settings, expected={"decode": 2})
    for _ in range(12):
        steady = run.tick(100.0, isl=isl, osl=osl, fpm=held(20, 8075.0)).diagnostics["roles"]["decode"]
    assert (steady["wish"], steady["batch_limit"], steady["window_context_tokens"]) == (2, 85, 8075.0)
    decode = run.tick(100.0, isl=isl, osl=osl, fpm=held(5, 24_000.0)).diagnostics["roles"]["decode"]
    window = (11 * 40 * 8075.0 + 10 * 24_000.0) / (11 * 40 + 10)
    assert decode["window_context_tokens"] == round(window, 1) == 8428.9
    assert decode["held_context_tokens"] == 24_000.0

    def limit(context: float) -> int:
        return decode_batch_limit(
            run.state.latency.decode,  # type: ignore[union-attr]
            isl_tokens=isl,
            osl_tokens=osl,
            itl_target_ms=30.0,
            max_kv_tokens=settings.max_kv_tokens,
            max_num_seqs=settings.max_num_seqs,
            held_context_tokens=context,
            profile_itl_ms=profile_decode_floor(h200, decode["floor_scale"]),
        )

    assert decode["batch_limit"] == limit(window) == 81
    assert decode["held_batch_limit"] == limit(24_000.0) == 29
    assert decode["wish"] == math.ceil(decode["in_flight_at_target"] / 81) == 2
    assert math.ceil(decode["in_flight_at_target"] / 29) == 4


# --- c. a long-prompt mix -------------------------------------------------------------------------


LONG_MIX: tuple[Bucket, ...] = ((1024.0, 97.0), (32768.0, 0.0), (65536.0, 3.0))


def test_c_a_long_prompt_mix_needs_more_prefill_than_its_mean_suggests(h200: PerfModel) -> None:
    # Same requests per second and same mean ISL (2000): the same prompt-token rate. One run has
    # every prompt ~2000 tokens; in the other 97% are under 1024 and 3% between 32k and 64k.
    settings = settings_for(h200, ("prefill",), ttft_target_ms=2000.0)
    per_tick = 100.0  # 20 req/s, 40,000 prompt tokens/s

    def final(buckets: tuple[Bucket, ...]) -> SlaResult:
        run = Run(h200, settings, expected={"prefill": 1})
        for _ in range(12):
            result = run.tick(per_tick, buckets=buckets)
        return result

    uniform_result, mix_result = final(()), final(LONG_MIX)
    token_rate = per_tick / TICK_S * ISL
    mix = LengthMix.from_histogram(list(LONG_MIX), ISL, settings.quantile)
    assert mix.mean == ISL
    assert mix.quantile == pytest.approx(32768 + 32768 * 2 / 3, rel=1e-12)  # rank 99 of 100
    uniform_engines = prefill_wish(h200, settings, token_rate, LengthMix.uniform(ISL), 1.0)
    prior = prior_of(h200, settings).prefill
    mix_sizing = prefill_sizing(prior, settings, token_rate, mix, 1.0)
    # Pinned on the H200 prior: 40,000 tokens/s of 2000-token prompts need the cap's 2 at
    # 36,231 tokens/s per engine (the old formula's 48,191 needed 1); the long mix needs 4 (3).
    assert (uniform_engines, mix_sizing.engines) == (2, 4)
    # Of the mix's points (eight across each bucket, rescaled to the mean 2000 by 2000/1971.2),
    # the top five of (32768, 65536], from 47104 × 1.0146 = 47,792 tokens up, take longer than
    # the 2 s target alone (the longest servable is 46,208): 5/8 of its 3%, 1.875%, are
    # unservable and left out of the count.
    assert mix_sizing.longest_servable_tokens == 46208
    assert mix_sizing.unservable_share == pytest.approx(0.01875, rel=1e-12)
    assert mix_sizing.meets_target is True
    assert uniform_result.replicas == {"prefill": uniform_engines}
    assert mix_result.replicas == {"prefill": mix_sizing.engines}
    assert mix_result.diagnostics["roles"]["prefill"]["unservable_share"] == round(0.01875, 4)
    assert mix_result.diagnostics["roles"]["prefill"]["unservable_rate_s"] == round(0.01875 * 20.0, 3)
    assert (
        uniform_result.diagnostics["demand"]["token_rate_s"]
        == mix_result.diagnostics["demand"]["token_rate_s"]
        == round(token_rate, 1)
    )
    assert mix_result.diagnostics["demand"]["isl_quantile"] == round(mix.quantile, 1)


# --- d. diagnostics -------------------------------------------------------------------------------


def test_d_every_tick_names_demand_wishes_reasons_scale_and_lead(h200: PerfModel) -> None:
    settings = settings_for(h200, ("prefill", "decode"))
    run = Run(h200, settings, expected={"prefill": 1, "decode": 1})
    for i in range(8):
        before = dict(run.expected)
        result = run.tick(100.0, fpm=decode_fpm(h200, [50]) if i % 2 else None)
        diag = result.diagnostics
        assert result.replicas is not None
        assert set(diag["demand"]) >= {"request_rate_s", "token_rate_s", "in_flight", "isl_mean", "osl_mean"}
        assert diag["demand"]["request_rate_s"] == 20.0
        assert diag["demand"]["token_rate_s"] == 40_000.0
        assert (diag["demand"]["isl_mean"], diag["demand"]["osl_mean"]) == (ISL, OSL)
        for role in ("prefill", "decode"):
            assert diag["roles"][role]["wish"] == result.replicas[role]
            assert diag["roles"][role]["needed"] == result.replicas[role]
            expected_reason = "scale_up" if result.replicas[role] > before[role] else "no_change"
            assert diag["roles"][role]["reason"] == expected_reason
            assert f"{role} {before[role]}->{result.replicas[role]} ({expected_reason}" in result.detail
        # The decode scale exists from the first record on (ticks 1, 3, ...), at the profile's 1.0.
        assert diag["scale"] == ({"decode": 1.0} if i >= 1 else {})
        assert diag["scale_samples"] == ({"decode": 1} if i % 2 else {})
        # The first tick orders engines; this cluster has them ready by the next tick: a 5 s lead.
        if i == 0:
            assert result.reason == SlaReason.SCALE_UP
            assert (diag["lead_s"], diag["lead_measured"]) == (settings.startup_estimate_s, False)
        else:
            assert result.reason == SlaReason.NO_CHANGE
            assert (diag["lead_s"], diag["lead_measured"]) == (TICK_S, True)


def test_d_no_traffic_and_no_model(h200: PerfModel) -> None:
    settings = settings_for(h200, ("prefill", "decode"))
    run = Run(h200, settings, expected={"prefill": 2, "decode": 2})
    result = run.tick(None)  # the frontend gave nothing
    assert (result.replicas, result.reason) == (None, SlaReason.NO_TRAFFIC_DATA)
    assert "demand" not in result.diagnostics and "roles" not in result.diagnostics
    assert result.diagnostics["lead_s"] == settings.startup_estimate_s
    # Windows with no request at all are zero demand, not unknown: the wishes fall to the
    # minimum (held until the planner has watched a full window: 55 of 60 s here).
    for _ in range(11):
        result = run.tick(0.0, isl=None, osl=None)
    assert (result.replicas, result.reason) == ({"prefill": 2, "decode": 2}, SlaReason.HOLD)
    roles = result.diagnostics["roles"]
    assert (roles["prefill"]["wish"], roles["decode"]["wish"]) == (1, 1)
    result = run.tick(0.0, isl=None, osl=None)
    assert (result.replicas, result.reason) == ({"prefill": 1, "decode": 1}, SlaReason.SCALE_DOWN)

    blind = Run(None, settings, expected={"prefill": 2, "decode": 2})
    result = blind.tick(100.0)
    assert (result.replicas, result.reason) == (None, SlaReason.MODEL_NOT_READY)
    assert result.diagnostics["scale"] == {} and result.diagnostics["lead_s"] == settings.startup_estimate_s


# --- e. the lead --------------------------------------------------------------------------------


def test_e_lead_is_measured_from_order_to_ready(h200: PerfModel) -> None:
    settings = settings_for(h200, ("prefill",), scale_down_window_leads=2.0)
    need = prefill_wish(h200, settings, 100.0 / TICK_S * ISL, LengthMix.uniform(ISL), 1.0)
    assert need == 2  # an order above the single engine running (pinned on the H200 prior, as before)
    run = Run(h200, settings, expected={"prefill": 1})
    result = run.tick(100.0, ready={"prefill": 1})
    ordered_s = run.now_s
    assert (result.replicas, result.reason) == ({"prefill": need}, SlaReason.SCALE_UP)
    assert run.state.orders == {"prefill": (ordered_s, need)}

    # The engines come up after 45 s: until then the lead is the configured estimate.
    startup_s = 45.0
    while run.now_s < ordered_s + startup_s - TICK_S:
        result = run.tick(100.0, ready={"prefill": 1})
        assert (result.diagnostics["lead_s"], result.diagnostics["lead_measured"]) == (
            settings.startup_estimate_s,
            False,
        )
        # The scale-down window is two leads (set above): 2 × the 120 s estimate.
        assert result.diagnostics["scale_down_window_s"] == 240.0
    result = run.tick(100.0, ready={"prefill": need})
    assert run.now_s == ordered_s + startup_s
    assert run.state.lead_s == startup_s
    assert (result.diagnostics["lead_s"], result.diagnostics["lead_measured"]) == (startup_s, True)
    assert run.state.orders == {}
    # ... and follows the measured lead: 2 × 45 s.
    assert result.diagnostics["scale_down_window_s"] == 90.0


def test_e_an_open_order_older_than_the_estimate_lengthens_the_lead(h200: PerfModel) -> None:
    """A world slower than the estimate: an order still open after the estimate's 120 s is a
    censored measurement, so the lead is read as the order's age (never shorter than what has
    been measured), and the first completion sets the measured lead."""
    settings = settings_for(h200, ("prefill",))
    run = Run(h200, settings, expected={"prefill": 1})
    run.tick(100.0, ready={"prefill": 1})
    ordered_s, need = run.now_s, run.expected["prefill"]
    assert need == 2 and run.state.orders == {"prefill": (ordered_s, need)}
    leads = []
    while run.now_s < ordered_s + 300.0 - TICK_S:
        leads.append(run.tick(100.0, ready={"prefill": 1}).diagnostics["lead_s"])
    # The estimate (120 s) until the order is that old, then the order's age, tick by tick.
    ages = [ordered_s + TICK_S * (i + 1) - ordered_s for i in range(len(leads))]
    assert leads == [max(settings.startup_estimate_s, age) for age in ages]
    assert leads[-1] == 295.0
    result = run.tick(100.0, ready={"prefill": need})
    assert run.state.lead_s == 300.0
    assert (result.diagnostics["lead_s"], result.diagnostics["lead_measured"]) == (300.0, True)
    # A measured lead shorter than a later open order's age gives way to that age as well.
    run.state.orders, run.expected = {"prefill": Order(run.now_s - 400.0, 3)}, {"prefill": 3}
    assert run.tick(100.0, ready={"prefill": need}, follow=False).diagnostics["lead_s"] == 405.0


def test_e_the_scale_down_window_is_leads_times_the_lead_with_a_floor(h200: PerfModel) -> None:
    settings = settings_for(h200, ("prefill",), scale_down_window_s=60.0, scale_down_window_leads=2.0)
    assert [scale_down_window_s(settings, lead) for lead in (0.0, 20.0, 30.0, 45.0, 300.0)] == [
        60.0,
        60.0,
        60.0,
        90.0,
        600.0,
    ]
    fixed = settings.model_copy(update={"scale_down_window_s": 300.0, "scale_down_window_leads": 0.0})
    assert [scale_down_window_s(fixed, lead) for lead in (0.0, 45.0, 600.0)] == [300.0] * 3


def test_e_an_order_cancelled_by_a_lower_expected_count_measures_nothing(h200: PerfModel) -> None:
    settings = settings_for(h200, ("prefill",))
    run = Run(h200, settings, expected={"prefill": 1})
    run.tick(100.0, ready={"prefill": 1})
    assert "prefill" in run.state.orders
    # Someone (a pin, the budget) brought the count back to 1 before the engines came up.
    run.expected = {"prefill": 1}
    run.tick(100.0, ready={"prefill": 1}, follow=False)
    assert run.state.lead_s is None


def test_e_an_order_the_ready_engines_already_meet_measures_nothing(h200: PerfModel) -> None:
    # A service that starts with no decision of its own thinks 0 are ordered while 5 serve.
    settings = settings_for(h200, ("prefill",))
    run = Run(h200, settings, expected={"prefill": 0}, ready={"prefill": 5})
    result = run.tick(100.0)
    assert result.reason == SlaReason.SCALE_UP  # 0 -> the wish, below the 5 serving
    assert result.replicas["prefill"] < 5  # type: ignore[index]
    assert run.state.orders == {}
    run.tick(100.0)
    assert run.state.lead_s is None


# --- an unknown inventory -------------------------------------------------------------------------


def test_without_an_inventory_it_learns_but_orders_nothing(h200: PerfModel) -> None:
    """Zeros that mean "unknown" (a service that just started) must not become a target: the
    cluster might be running many more engines than the wish."""
    settings = settings_for(h200, ("prefill", "decode"))
    state = SlaState()
    for k in range(3):
        now = TICK_S * (k + 1)
        result = sla_step(
            h200,
            state,
            SlaInput(
                now,
                TrafficSample(now, TICK_S, 100.0, ISL, OSL),
                {},
                {"prefill": 0, "decode": 0},
                {"prefill": 0, "decode": 0},
                inventory_known=False,
            ),
            settings,
        )
        assert (result.replicas, result.reason) == (None, SlaReason.NO_INVENTORY)
        # The wishes are computed and shown; the traffic is kept for when the inventory comes.
        assert result.diagnostics["roles"]["prefill"]["wish"] == prefill_wish(
            h200, settings, 100.0 / TICK_S * ISL, LengthMix.uniform(ISL), 1.0
        )
    assert len(state.samples) == 3
    assert state.wishes == deque()  # nothing to stabilise against: no target was set


def test_a_short_first_window_is_not_read_alone_as_a_burst() -> None:
    """The scrape right after a start-up check covers 0.04 s; two requests in it are not 50
    requests/s when the ticks after it say 20/s (the live failover test ordered 8 prefill
    engines for 2 engines' traffic from exactly that)."""
    first = TrafficSample(end_s=0.04, duration_s=0.04, num_req=2.0, isl=3000.0, osl=200.0)
    steady = [
        TrafficSample(end_s=0.04 + k, duration_s=1.0, num_req=20.0, isl=3000.0, osl=200.0) for k in (1, 2, 3)
    ]
    assert busiest_rate([first, *steady], window_s=2.0) == pytest.approx(20.0)
    # A run of ticks shorter than the window altogether is still read at its mean rate.
    assert busiest_rate([first, steady[0]], window_s=2.0) == pytest.approx(22.0 / 1.04)
    # And a real burst in a full window is found wherever it is.
    burst = TrafficSample(end_s=4.04, duration_s=1.0, num_req=60.0, isl=3000.0, osl=200.0)
    assert busiest_rate([first, *steady, burst], window_s=2.0) == pytest.approx(40.0)


def test_a_steady_rise_is_carried_a_lead_ahead_and_a_step_only_to_the_levels_seen(h200: PerfModel) -> None:
    """A rise along a line (1% a tick for five minutes: growth compounding, a day's morning) is
    carried one lead ahead at its growth rate, beyond any level seen; a step to the same height
    is not a ramp, however steeply the trend catches up with it afterwards. The headroom is held
    at x1 here so that the ramp alone speaks, and the engines at one, so that no order is
    measured and the lead stays the 120 s estimate."""
    settings = settings_for(
        h200,
        ("prefill",),
        trend=True,
        cold_start_growth=1.0,
        growth_min_points=100_000,
        bounds={"prefill": RoleBounds(1, 1)},
    )
    ahead_s = settings.startup_estimate_s + settings.trend_window_s / 2  # from the window's middle
    per_tick = settings.trend_window_s / TICK_S
    ramp = Run(h200, settings, expected={"prefill": 1})
    for i in range(60):
        result = ramp.tick(100.0 * 1.01**i)
    demand = result.diagnostics["demand"]
    assert result.diagnostics["lead_s"] == 120.0
    # The trend window's level grows by 1% a tick too: its log rises log(1.01) every 5 s.
    assert demand["ramp_growth_per_s"][0] == pytest.approx(math.log(1.01) / TICK_S, abs=1e-6)
    trend_tokens_s = sum(ramp.counts[-int(per_tick) :]) / settings.trend_window_s * ISL
    forecast = trend_tokens_s * math.exp(math.log(1.01) / TICK_S * ahead_s)
    assert demand["token_rate_s"] == pytest.approx(forecast, rel=1e-3)
    level_now = (ramp.counts[-1] + ramp.counts[-2]) / (2 * TICK_S) * ISL  # the busiest 10 s
    assert forecast > 1.2 * level_now
    # The history keeps what the tick forecast, for the headroom to learn the rise beyond it.
    at, tokens_s, _, forecast_tokens_s, _ = ramp.state.history[-1]
    assert (at, tokens_s) == (ramp.now_s, pytest.approx(trend_tokens_s))
    assert forecast_tokens_s == pytest.approx(forecast, rel=1e-3)

    step = Run(h200, settings, expected={"prefill": 1})
    for count in [100.0] * 48 + [180.0] * 12:
        result = step.tick(count)
    demand = result.diagnostics["demand"]
    assert demand["ramp_growth_per_s"] is None
    # The trend rose all of the last minute, and a line through it would read far above 180...
    trend_tokens_s = sum(step.counts[-int(per_tick) :]) / settings.trend_window_s * ISL
    assert trend_tokens_s + demand["ramp_per_s"][0] * ahead_s > 1.5 * 180.0 / TICK_S * ISL
    # ... but a step is carried no higher than the levels seen: 180 requests a tick.
    assert demand["token_rate_s"] == pytest.approx(180.0 / TICK_S * ISL)
    # A step is no forecast the headroom learns beyond: the level is recorded as it.
    _, tokens_s, _, forecast_tokens_s, _ = step.state.history[-1]
    assert forecast_tokens_s == tokens_s == pytest.approx(trend_tokens_s)


def test_a_crowd_still_arriving_is_carried_as_long_as_it_has_lasted_and_a_split_step_is_not(
    h200: PerfModel,
) -> None:
    """A crowd rising at the tick scale (40 requests a tick, then 80, 160, 240, 320): from the
    second rise in a row it is carried ahead at its pace for as long as it has lasted (at most
    the lead), since engines ordered now come a lead later. A burst after a quiet minute that
    starts mid-tick rises in two ticks and then holds: a step, not a crowd, and not carried;
    from near silence (at most the quiet fraction of the rate now) it takes a third rise."""
    settings = settings_for(
        h200, ("prefill",), trend=True, cold_start_growth=1.0, bounds={"prefill": RoleBounds(1, 64)}
    )
    lead_s = settings.startup_estimate_s  # no order is measured: the estimate (120 s)
    crowd = Run(h200, settings, expected={"prefill": 1}, ready={"prefill": 1})
    for _ in range(24):
        result = crowd.tick(40.0, follow=False)
    surges = []
    for count in (80.0, 160.0, 240.0, 320.0):
        result = crowd.tick(count, follow=False)
        surges.append(result.diagnostics["demand"]["surge"])
    assert surges[0] is None  # one rise: a step as much as a crowd
    # Two rises from a busy level (40 -> 160 over 10 s): carried 10 s more at 24 requests/s per
    # second; three (40 -> 240 over 15 s): 15 s more; four (40 -> 320 over 20 s): 20 s more.
    assert settings.quiet_fraction * 160.0 < 40.0
    assert surges[1] == [10.0, pytest.approx(160 / TICK_S + (160 - 40) / TICK_S / 10.0 * 10.0, abs=0.1)]
    assert surges[2] == [15.0, pytest.approx(240 / TICK_S + (240 - 40) / TICK_S / 15.0 * 15.0, abs=0.1)]
    assert surges[3] == [20.0, pytest.approx(320 / TICK_S + (320 - 40) / TICK_S / 20.0 * 20.0, abs=0.1)]
    assert result.diagnostics["demand"]["token_rate_s"] == pytest.approx(surges[3][1] * ISL, rel=1e-3)
    # A lead shorter than the rise has lasted carries it one lead: a crowd seen for 20 s with
    # engines 10 s away is carried 10 s.
    assert _surge(list(crowd.state.samples), 10.0) == (
        20.0,
        pytest.approx(64.0 + 56.0 / 20.0 * 10.0),
    )
    # The crowd holds: no rise this tick, no surge; the level and the headroom take over.
    result = crowd.tick(320.0, follow=False)
    assert result.diagnostics["demand"]["surge"] is None
    assert lead_s > 20.0

    # From silence, or a trickle at most the quiet fraction of the rate now, two rises are a
    # burst that began mid-tick: not carried (the quiet period's keep answers for its size).
    for quiet in (0.0, 2.0):
        step = Run(h200, settings, expected={"prefill": 1}, ready={"prefill": 1})
        for count in [quiet] * 12 + [150.0, 300.0, 300.0, 300.0]:
            result = step.tick(count, follow=False)
            assert result.diagnostics["demand"]["surge"] is None
    # The same two rises from a busy level are a crowd's first: carried.
    busy = Run(h200, settings, expected={"prefill": 1}, ready={"prefill": 1})
    for count in [40.0] * 12 + [150.0, 300.0]:
        result = busy.tick(count, follow=False)
    assert result.diagnostics["demand"]["surge"] == [10.0, pytest.approx(60.0 + 52.0, abs=0.1)]
    # Rises of about one Poisson standard deviation each (100, 115, 130, 145, 160 requests a
    # tick: 3 requests/s against 2.9-3.5) are no surge: a slope that slow is the trend's and its
    # ramp's to carry, not a crowd's.
    noise = Run(h200, settings, expected={"prefill": 1}, ready={"prefill": 1})
    for count in [100.0] * 12 + [115.0, 130.0, 145.0, 160.0]:
        result = noise.tick(count, follow=False)
        assert result.diagnostics["demand"]["surge"] is None


def test_rises_within_the_traffics_own_burstiness_are_no_surge(h200: PerfModel) -> None:
    """Bursty traffic (1,000 and 1,400 requests a tick in turn: dispersion about 6) rises 1,300,
    1,600, 1,900, 2,200: three rises of 60 requests/s, each more than 3 Poisson standard
    deviations (38 requests/s) but within 3 of its own (96). The standard deviation is Poisson's times the
    dispersion the demand reads: the Azure trace at 30x (each request 30 arriving within a
    second) ran such rises on noise and paid for engines it did not need."""
    settings = settings_for(h200, ("prefill",), trend=True, cold_start_growth=1.0)
    run = Run(h200, settings, expected={"prefill": 1}, ready={"prefill": 1})
    for count in [1000.0, 1400.0] * 12 + [1300.0, 1600.0, 1900.0, 2200.0]:
        result = run.tick(count, follow=False)
        assert result.diagnostics["demand"]["surge"] is None
    assert result.diagnostics["demand"]["dispersion"] == pytest.approx(6.26, abs=0.01)
    # Read as Poisson, the same three rises would be a crowd, carried 15 s.
    assert _surge(list(run.state.samples), 120.0) is not None
    assert _surge(list(run.state.samples), 120.0, 6.26) is None


def test_a_few_ticks_are_not_enough_to_call_traffic_bursty(h200: PerfModel) -> None:
    settings = settings_for(h200, ("prefill",))
    run = Run(h200, settings, expected={"prefill": 1})
    for count in (30.0, 290.0, 60.0, 400.0, 80.0):  # five wildly different ticks
        result = run.tick(count)
        assert result.diagnostics["demand"]["dispersion"] == 1.0
    result = run.tick(500.0)  # the sixth: now the deviation of five differences counts
    # Differences 260, -230, 340, -320, 420: median 260, absolute deviations 0, 490, 80, 580, 160,
    # their median 160; sigma = 1.4826 x 160 = 237.2, raw = 237.2^2 / 2 / 226.7 (the mean count)
    # = 124.1; five differences against the prior's 60 s of 5 s ticks: 1 + 123.1 x 5/17 = 37.21.
    assert result.diagnostics["demand"]["dispersion"] == 37.21


def test_a_burstiness_read_off_a_few_ticks_weighs_less_than_a_minute_of_poisson(h200: PerfModel) -> None:
    """The long-prompt mix's first 40 s (5 s ticks): Poisson-like counts whose seven differences
    happen to alternate, so their median deviation reads 6.8 times Poisson; the first minute's
    counts vary 1.5-2.5 times. Shrunk by 60 s of prior ticks (12) the reading is 3.15, and it
    counts fully only with `dispersion_prior_s` 0."""
    counts = [29.0, 51.0, 36.0, 50.0, 46.0, 47.0, 26.0, 44.0]
    # Differences 22, -15, 14, -4, 1, -21, 18: median 1, absolute deviations 21, 16, 13, 5, 0, 22,
    # 17, their median 16; sigma = 1.4826 x 16 = 23.7, raw = 23.7^2 / 2 / 41.1 (the mean count)
    # = 6.84; shrunk by seven differences against the prior's 12 ticks: 1 + 5.84 x 7/19 = 3.15.
    raw = 6.8415
    for prior_s, expected in ((60.0, 1.0 + (raw - 1.0) * 7 / 19), (0.0, raw)):
        settings = settings_for(h200, ("prefill",), dispersion_prior_s=prior_s)
        run = Run(h200, settings, expected={"prefill": 1})
        for count in counts:
            result = run.tick(count)
        assert result.diagnostics["demand"]["dispersion"] == round(expected, 2), prior_s
    assert round(1.0 + (raw - 1.0) * 7 / 19, 2) == 3.15


def test_a_cold_start_forecasts_with_the_cold_headroom_until_the_history_has_its_points(
    h200: PerfModel,
) -> None:
    """Nothing learned is the widest uncertainty: until `growth_min_points` lead-spaced levels
    exist, the trend level is raised by `cold_start_growth`."""
    settings = settings_for(h200, ("prefill",), trend=True)
    run = Run(h200, settings, expected={"prefill": 1})
    for _ in range(3):
        result = run.tick(100.0)
    demand = result.diagnostics["demand"]
    assert (demand["growth"], demand["growth_learned"]) == ([1.6, 1.6], False)
    # 20 req/s of 2,000 tokens, raised by 1.6 (the busiest 10 s is the same 20 req/s, lower).
    assert demand["token_rate_s"] == round(100.0 / TICK_S * ISL * 1.6, 1)
    # Once the history has its points (the lead is the 120 s estimate: 24 pairs of levels
    # 120 s apart need the trend window, the lead and 24 ticks), the growth is the learned one:
    # steady traffic grew by exactly 1.
    for _ in range(60):
        result = run.tick(100.0)
    demand = result.diagnostics["demand"]
    assert (demand["growth"], demand["growth_learned"]) == ([1.0, 1.0], True)
    assert demand["token_rate_s"] == round(100.0 / TICK_S * ISL, 1)


def test_a_nothing_goes_down_until_the_headroom_is_learned(h200: PerfModel) -> None:
    """The scale-down window is short because the learned headroom covers the peak within a lead.
    Until that headroom is learned, nothing says which engines the next lead needs: the planner
    keeps what runs, past the window, then scales down on the first learned tick."""
    settings = settings_for(h200, ("prefill",), trend=True)
    run = Run(h200, settings, expected={"prefill": 8})
    learned_at = None
    wishes: list[tuple[float, int]] = []
    while learned_at is None:
        result = run.tick(100.0)
        demand = result.diagnostics["demand"]
        wishes.append((run.now_s, result.diagnostics["roles"]["prefill"]["wish"]))
        if demand["growth_learned"]:
            learned_at = run.now_s
            assert result.reason == SlaReason.SCALE_DOWN
            # Down to the highest wish of the window: the cold headroom's 64,000 tokens/s wished 3
            # (at 2 engines, 88% busy, more than 1% would wait past the target), the learned x1
            # wishes 2 (40,000 tokens/s), the window keeps the 3.
            window = [w for t, w in wishes if t >= run.now_s - settings.scale_down_window_s]
            assert (max(window), wishes[-1][1]) == (3, 2)
            assert result.replicas == {"prefill": 3}
        else:
            assert (result.replicas, result.reason) == ({"prefill": 8}, SlaReason.HOLD)
            if run.now_s - TICK_S >= settings.scale_down_window_s:
                hold = result.diagnostics["roles"]["prefill"]["hold"]
                assert hold == "the forecast's headroom is not learned yet"
    # The first tick is at 5 s and the history starts once a full trend window is watched (65 s);
    # 24 pairs of levels one lead (the 120 s estimate) apart then need 120 s + 23 ticks more.
    assert learned_at == TICK_S + settings.trend_window_s + settings.startup_estimate_s + 23 * TICK_S


def test_a_the_growth_headroom_learns_from_pairs_that_started_near_the_level_now(h200: PerfModel) -> None:
    """A square wave between 100 and 200 with a 240 s period: within 120 s (one lead) of a
    trough level the traffic reaches 200 (x2); within 120 s of a peak level it never exceeds
    that peak (x1). The whole history's 0.9 quantile says x2 wherever the traffic stands (the
    trough is not more than x2 below the peak: its pairs say how the traffic grows); the
    pairs that started near the level now say x2 in a trough and x1 at a peak. The regression
    on the level says x1 at a peak too; in the trough its line reads x2, but it is capped at the
    way back to the median level, and here the median is the trough's own 100 (8 of the 15
    half-periods kept): the neighbours' x2 is what counts there."""
    settings = settings_for(h200, ("prefill",), trend=True)
    lead_s = settings.startup_estimate_s

    def history(ending_high: bool) -> deque[LevelRecord]:
        times = np.arange(0.0, 1800.0, TICK_S) + (120.0 if ending_high else 0.0)
        levels = [200.0 if (t // 120) % 2 else 100.0 for t in times]
        return deque(flat(t, level, level / 10) for t, level in zip(times, levels, strict=True))

    trough, peak = history(ending_high=False), history(ending_high=True)
    assert (trough[-1][1], peak[-1][1]) == (100.0, 200.0)
    everything = settings.model_copy(update={"growth_neighbour_share": 1.0, "growth_regression": False})
    assert growth_of(trough, lead_s, everything) == ((2.0, 2.0), (2.0, 2.0), None)
    assert growth_of(peak, lead_s, everything) == ((2.0, 2.0), (2.0, 2.0), None)
    assert (settings.growth_neighbour_share, settings.growth_regression) == (0.3, True)
    assert growth_of(trough, lead_s, settings) == ((2.0, 2.0), (2.0, 2.0), (1.0, 1.0))
    assert growth_of(peak, lead_s, settings) == ((1.0, 1.0), (1.0, 1.0), (1.0, 1.0))


def test_a_crowd_seen_from_below_forecasts_its_own_peak_not_its_ratio_from_above(h200: PerfModel) -> None:
    """Ten minutes at 40, then a crowd at 400. Of the pairs that started at 40, the last lead's
    worth saw the crowd: x10 at the 0.9 quantile. Read at 40 that forecasts the crowd, 400; read at
    400, during the crowd, the same pairs say the traffic went to 400 (their peak over the level
    now, x1), not to 4,000: they started more than x2 below it. Before, every engine count was
    sized for ten crowds."""
    settings = settings_for(
        h200, ("prefill",), trend=True, growth_neighbour_share=1.0, growth_regression=False
    )
    lead_s = settings.startup_estimate_s
    times = np.arange(0.0, 900.0, TICK_S)
    levels = [400.0 if t >= 600.0 else 40.0 for t in times]
    crowd = deque(flat(t, level, level / 10) for t, level in zip(times, levels, strict=True))
    assert growth_of(crowd, lead_s, settings) == ((1.0, 1.0), (1.0, 1.0), None)
    before = deque(h for h in crowd if h[0] < 700.0)
    before.append(flat(700.0, 40.0, 4.0))  # the level back at 40: the crowd forecast again
    assert growth_of(before, lead_s, settings) == ((10.0, 10.0), (10.0, 10.0), None)
    # At 60, within x2 of the pairs' 40, their ratio is how this traffic grows: x10 still.
    near = deque(before)
    near[-1] = flat(700.0, 60.0, 6.0)
    assert growth_of(near, lead_s, settings) == ((10.0, 10.0), (10.0, 10.0), None)


def test_a_the_headroom_is_the_peak_within_the_lead_not_the_level_at_its_end(h200: PerfModel) -> None:
    """Spikes of 20 s to 300 every 240 s from 100. From half of the starts a spike comes within
    the next 120 s (one lead): the peak within the lead is x3 at the 0.9 quantile. The level at
    the lead's end is in a spike from one start in twelve, too few to move that quantile off x1.
    The engines kept now must serve the spike, so the peak is what counts."""
    settings = settings_for(
        h200, ("prefill",), trend=True, growth_neighbour_share=1.0, growth_regression=False
    )
    lead_s = settings.startup_estimate_s
    times = np.arange(0.0, 1800.0, TICK_S)
    levels = np.array([300.0 if t % 240 >= 220 else 100.0 for t in times])
    history = deque(flat(t, level, level) for t, level in zip(times, levels, strict=True))
    assert growth_of(history, lead_s, settings)[0] == (3.0, 3.0)
    ends = np.searchsorted(times, times + lead_s)
    starts = ends < len(times)
    assert float(np.quantile(levels[ends[starts]] / levels[starts], settings.growth_quantile)) == 1.0


def test_a_rise_the_forecast_carried_is_not_headroom_on_the_way_down(h200: PerfModel) -> None:
    """A day compressed: a steady rise from 100 to 300 over ten minutes, then down again. On the
    way up each tick forecast the rise a lead ahead (up to the top it reached), and the traffic
    never went beyond that forecast: every pair's peak over its forecast is x1, and so is the
    headroom on the way down. Read against the level instead, the rise the forecast already
    carried counts again as headroom: x1.3 on the way down, where the traffic only falls
    (`diurnal` at a 300 s start-up read x1.3-x4.7 on its decline)."""
    settings = settings_for(
        h200, ("prefill",), trend=True, growth_neighbour_share=1.0, growth_regression=False
    )
    lead_s = settings.startup_estimate_s
    slope = 200.0 / 600.0

    def level(t: float) -> float:
        if t < 600:
            return 100.0 + slope * t
        return max(100.0, 300.0 - slope * (t - 600))

    times = np.arange(0.0, 1050.0, TICK_S)  # ends on the way down, at 150
    forecast = [min(level(t) + slope * lead_s, 300.0) if t < 600 else level(t) for t in times]
    history = deque(LevelRecord(t, level(t), level(t), f, f) for t, f in zip(times, forecast, strict=True))
    assert level(times[-1]) == pytest.approx(150.0 + slope * TICK_S)
    assert growth_of(history, lead_s, settings)[0] == (1.0, 1.0)
    against_level = deque(flat(t, level(t), level(t)) for t in times)
    assert growth_of(against_level, lead_s, settings)[0] == (1.3057, 1.3057)


def test_a_the_regression_reads_a_first_trough_as_a_way_back_to_the_usual_level(h200: PerfModel) -> None:
    """Every dip so far (a minute at 150, every four minutes) came back to 200 within a lead. Then
    a trough at 100, lower than anything seen, for 5 minutes: its nearest pairs (10% here, 33
    of them; the trough has 36 whose lead is in the history) all started in the flat trough and
    say x1; the regression on the level, pooled over every pair, reads the
    trough as the way back to 200 (x2) that the dips showed, and the larger estimate counts."""
    settings = settings_for(h200, ("prefill",), trend=True, growth_neighbour_share=0.1)
    times = np.arange(0.0, 1800.0, TICK_S)

    def level(t: float) -> float:
        if t >= 1800.0 - 300.0:
            return 100.0
        return 150.0 if (t // 60) % 4 == 1 else 200.0

    history = deque(flat(t, level(t), level(t) / 10) for t in times)
    growth = _growth_quantiles(history, settings.startup_estimate_s, settings)
    assert growth is not None and growth.neighbours == (1.0, 1.0)
    assert growth.regression == pytest.approx((2.0, 2.0), rel=1e-4)
    assert (growth.tokens, growth.flight) == growth.regression
    alone = _growth_quantiles(
        history, settings.startup_estimate_s, settings.model_copy(update={"growth_regression": False})
    )
    assert alone is not None and (alone.tokens, alone.flight) == (1.0, 1.0)


def test_a_the_regression_reads_a_trough_no_further_than_the_way_back_to_the_usual_level(
    h200: PerfModel,
) -> None:
    """Every dip to 150 so far was followed, a minute later, by a 20 s spike to 300; the usual
    level (the history's median) is 200. Then a trough at 100 for 5 minutes. The line through
    the dips' growth (x2 from 150 to the spike) reads the trough as x3, the spike's peak; the
    regression is capped at the way back to the usual level, x2."""
    settings = settings_for(h200, ("prefill",), trend=True, growth_neighbour_share=0.1)
    lead_s = settings.startup_estimate_s
    times = np.arange(0.0, 1800.0, TICK_S)

    def level(t: float) -> float:
        if t >= 1800.0 - 300.0:
            return 100.0
        minute = (t // 60) % 4
        if minute == 1:
            return 150.0
        return 300.0 if minute == 2 and t % 60 < 20 else 200.0

    history = deque(flat(t, level(t), level(t) / 10) for t in times)
    levels = np.array([h[1] for h in history])
    starts = np.flatnonzero(np.searchsorted(times, times + lead_s) < len(times))
    peaks = np.array([levels[i : np.searchsorted(times, times[i] + lead_s) + 1].max() for i in starts])
    reference = float(np.log(levels).mean())
    line = math.exp(
        _quantile_line(
            np.log(levels[starts]) - reference,
            np.log(peaks / levels[starts]),
            settings.growth_quantile,
            math.log(100.0) - reference,
        )
    )
    assert line == pytest.approx(3.0, rel=1e-4)
    assert float(np.median(levels)) == 200.0
    assert growth_of(history, lead_s, settings) == ((2.0, 2.0), (1.0, 1.0), (2.0, 2.0))
    growth = _growth_quantiles(history, lead_s, settings)
    assert growth is not None and growth.ceiling == (2.0, 2.0)
    # Just below the usual level, at 190, the way back is x1.05 where the line reads x1.58: the
    # ceiling binds there too, and the neighbours' own estimate (x1.5) is what counts.
    at_190 = deque([*history][:-1] + [flat(times[-1], 190.0, 19.0)])
    growth = _growth_quantiles(at_190, lead_s, settings)
    assert growth is not None and growth.regression == pytest.approx((200 / 190, 200 / 190))
    assert (growth.tokens, growth.flight) == growth.neighbours == (1.5, 1.5)


def flat(t: float, tokens_s: float, flight: float) -> LevelRecord:
    """A history point whose forecast was its own level (no ramp under way)."""
    return LevelRecord(t, tokens_s, flight, tokens_s, flight)


def growth_of(
    history: deque[LevelRecord], lead_s: float, settings: SlaSettings
) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float] | None]:
    """(the headroom, the neighbours' estimate, the regression's), rounded where a fit gives them."""
    growth = _growth_quantiles(history, lead_s, settings)
    assert growth is not None

    def rounded(pair: tuple[float, float]) -> tuple[float, float]:
        return round(pair[0], 4), round(pair[1], 4)

    return (
        rounded((growth.tokens, growth.flight)),
        rounded(growth.neighbours),
        rounded(growth.regression) if growth.regression else None,
    )
