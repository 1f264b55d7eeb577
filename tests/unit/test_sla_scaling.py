"""The engine counts the SLA step orders (`app/core/sla/`), and the reasons it gives for them.

- Prefill: engines for the prompt tokens at the TTFT target's quantile, never above the
  utilisation cap, on the learned iteration costs and over the prompt-length mix; a queue the
  engines are behind on adds its drain within the lead, but only what new engines could take.
- Decode: Little's law at the ITL target, at the peak quantile of the requests in flight, over
  the batch that meets the target (capped by the KV cache and `max_num_seqs`, at a full engine's
  pace when those bind), for the requests to come and those held.
- Going down waits for a full scale-down window watched, then takes the window's highest wish;
  going up is at once. Each tick says why, and a tick without what it needs sets no target.

The scenarios are those of `tests/unit/sla_scenarios.py`: 5 s ticks through `sla_step`, the
cluster following every order at once unless a test says otherwise.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import NormalDist

import pytest

from app.core.perf.fpm import ForwardPassMetrics, ScheduledRequestMetrics
from app.core.perf.interpolation import PerfModel
from app.core.sla.capacity import (
    Bucket,
    LengthMix,
    decode_batch_limit,
    decode_concurrency,
    decode_iteration_ms,
    profile_decode_floor,
)
from app.core.sla.latency import prefill_features
from app.core.sla.types import SlaReason, SlaResult
from tests.unit.sla_scenarios import (
    CHUNK,
    CONTEXT,
    ISL,
    OSL,
    TICK_S,
    Fpm,
    Run,
    batch_limit,
    decode_fpm,
    decode_wish,
    h200_model,
    mix_capacity,
    no_histogram_mix,
    prefill_record,
    prefill_sizing,
    prefill_wish,
    prior_of,
    settings_for,
)

LONG_MIX: tuple[Bucket, ...] = ((1024.0, 97.0), (32768.0, 0.0), (65536.0, 3.0))


@pytest.fixture(scope="module")
def h200() -> PerfModel:
    return h200_model()


# --- going down, and decode -----------------------------------------------------------------------


def drain_batches(target: int) -> list[int]:
    """What the decode engines hold: before any scale-down 3 engines with 30 requests each; once
    the target went down, the drained engines' requests sit on the first engine (a large batch,
    100) and one more engine, still draining, keeps 20."""
    return [30] * 3 if target >= 3 else [100, 20]


def test_decode_scale_down_waits_for_the_window_then_takes_its_highest_wish(h200: PerfModel) -> None:
    """An engine let go and wished back within a lead costs a start-up and misses targets
    meanwhile: decode goes down only once a full window has been watched, and then no lower
    than the highest wish of that window; it goes up at once."""
    # The window is two leads here (the default is a fixed 60 s), so that it is long enough to
    # watch both holds.
    settings = settings_for(h200, ("decode",), decode_itl_margin=0.95, scale_down_window_leads=2.0)
    high, low = 500.0, 150.0  # 100 req/s for a minute, then 30 req/s
    # The records are the profile's ITL for their batch (the world is the profile): each tick's
    # are learned, so the batch limit is the state's model's, not the cold-start prior's. After
    # the first tick's records (three of 30 requests in 9.6 ms), the line alone would allow 155 at
    # 95% of the ITL target (the prior's line 158); the profile, the floor beyond the 30 requests
    # seen, allows 107.
    prior = prior_of(h200, settings)
    first = prior.observed("decode", decode_fpm(h200, drain_batches(3))["decode"].values(), TICK_S).decode
    high_wish = decode_wish(h200, settings, high / TICK_S, 1.0, cost=first)
    lines = (batch_limit(h200, settings, floor=False), batch_limit(h200, settings, first, floor=False))
    assert lines == (158, 155)
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
        # (a diagnostic) stays 1, and the limit is the learned model's.
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
        if wish > before:  # up at once (never from a drop: test_traffic_drop_never_raises_the_decode_wish)
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


def test_traffic_drop_never_raises_the_decode_wish(h200: PerfModel) -> None:
    """The drop itself makes the per-tick counts vary; the wish for less traffic must still never
    exceed the wish for more."""
    settings = settings_for(h200, ("decode",))
    high_wish = decode_wish(h200, settings, 100.0, 1.0)
    run = Run(h200, settings, expected={"decode": high_wish})
    for _ in range(12):
        run.tick(500.0)
    for _ in range(12):
        result = run.tick(150.0)  # 100 req/s -> 30 req/s
        assert result.diagnostics["roles"]["decode"]["wish"] <= high_wish, "less traffic, no more engines"


# --- prefill and its backlog ----------------------------------------------------------------------


def test_learned_prefill_iterations_and_the_backlog_enter_the_prefill_wish(h200: PerfModel) -> None:
    """Prefill is sized on what its engines are seen to do: iterations slower than the profile,
    and a queue that must clear within the lead, both raise the count."""
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


def test_crowd_on_too_few_engines_orders_for_the_backlog_the_lead_will_add(h200: PerfModel) -> None:
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


def test_queue_stuck_on_its_engines_orders_no_engine_that_cannot_take_it(h200: PerfModel) -> None:
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


# --- the decode batch -----------------------------------------------------------------------------


def test_max_num_seqs_caps_the_decode_batch(h200: PerfModel) -> None:
    """An engine holds no more requests than it schedules, whatever the ITL target allows; a full
    engine that then iterates faster than the target is sized at its own pace, not the target's."""
    # The cold-start limit at 20 ms is above 64 requests; an engine that schedules at most 64
    # holds no more. A full engine of 64 then iterates in 13.8 ms, not 20: its requests leave
    # sooner, and 60 req/s keep 123 requests in flight at that pace (149 at the 0.99 peak
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
    assert results["capped"]["pace"] == round(full_ms / capped.itl_target_ms, 4) == 0.6899
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


def test_kv_bound_decode_batch_is_sized_at_a_full_engines_pace_unless_engines_run_slower(
    h200: PerfModel,
) -> None:
    """Long contexts fill an engine's KV cache before its iterations reach the ITL target: a full
    engine (46 requests of 20k tokens) iterates in 36 ms of a 60 ms target, its requests leave
    sooner, and fewer are in flight than Little's law at the target says: 3 engines, not 5.
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
    assert decode["pace"] == round(full_ms / 60.0, 4) == 0.6028
    z = NormalDist().inv_cdf(settings.decode_peak_quantile)
    mean = decode_concurrency(request_rate_s=100.0 / TICK_S, osl_tokens=osl, itl_target_ms=60.0)
    assert decode["in_flight_at_target"] == round(
        full_ms / 60.0 * mean + z * math.sqrt(full_ms / 60.0 * mean), 1
    )
    assert decode["wish"] == math.ceil(decode["in_flight_at_target"] / kv_bound) == 3
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
    ticks: 8,428.9), a batch of 89, so the wish stays 2; the 10 held now are sized at their own
    24,000 (a batch of 32). Sized at the tick's context, the same demand would wish 4."""
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
    assert (steady["wish"], steady["batch_limit"], steady["window_context_tokens"]) == (2, 92, 8075.0)
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

    assert decode["batch_limit"] == limit(window) == 89
    assert decode["held_batch_limit"] == limit(24_000.0) == 32
    assert decode["wish"] == math.ceil(decode["in_flight_at_target"] / 89) == 2
    assert math.ceil(decode["in_flight_at_target"] / 32) == 4


# --- the prompt-length mix ------------------------------------------------------------------------


def test_long_prompt_mix_needs_more_prefill_than_its_mean_suggests(h200: PerfModel) -> None:
    """The mean prompt length hides what long prompts cost: the same token rate in a mix with 3%
    of long prompts needs twice the engines, and the prompts too long to meet the target even
    alone are counted as unservable, not sized for."""
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
    # 41,193 tokens/s per engine; the long mix needs 4.
    assert (uniform_engines, mix_sizing.engines) == (2, 4)
    # Of the mix's points (eight across each bucket, rescaled to the mean 2000 by 2000/1971.2),
    # the top four of (32768, 65536], from 51200 × 1.0146 = 51,948 tokens up, take longer than
    # the 2 s target alone (the longest servable is 51,200): 4/8 of its 3%, 1.5%, are
    # unservable and left out of the count.
    assert mix_sizing.longest_servable_tokens == 51200
    assert mix_sizing.unservable_share == pytest.approx(0.015, rel=1e-12)
    assert mix_sizing.meets_target is True
    assert uniform_result.replicas == {"prefill": uniform_engines}
    assert mix_result.replicas == {"prefill": mix_sizing.engines}
    assert mix_result.diagnostics["roles"]["prefill"]["unservable_share"] == round(0.015, 4)
    assert mix_result.diagnostics["roles"]["prefill"]["unservable_rate_s"] == round(0.015 * 20.0, 3)
    assert (
        uniform_result.diagnostics["demand"]["token_rate_s"]
        == mix_result.diagnostics["demand"]["token_rate_s"]
        == round(token_rate, 1)
    )
    assert mix_result.diagnostics["demand"]["isl_quantile"] == round(mix.quantile, 1)


# --- what a tick says -----------------------------------------------------------------------------


def test_every_tick_names_its_demand_wishes_reasons_scale_and_lead(h200: PerfModel) -> None:
    """A decision is read back from its tick alone: each tick names the demand it sized for,
    each role's wish and reason, the scale measured and the lead it assumed."""
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


# --- a tick without what it needs -----------------------------------------------------------------


@dataclass(frozen=True)
class NoTargetCase:
    name: str
    model_ready: bool
    traffic: bool  # whether the frontend gave a count
    inventory_known: bool
    reason: SlaReason
    shows_wishes: bool  # the demand and each role's wish in the diagnostics
    samples_kept: int  # of the 3 ticks' traffic
    why: str


NO_TARGET_CASES = [
    NoTargetCase(
        "no_traffic_data",
        model_ready=True,
        traffic=False,
        inventory_known=True,
        reason=SlaReason.NO_TRAFFIC_DATA,
        shows_wishes=False,
        samples_kept=0,
        why="the frontend gave nothing: there is no demand to size for, and unknown is not zero",
    ),
    NoTargetCase(
        "no_performance_model",
        model_ready=False,
        traffic=True,
        inventory_known=True,
        reason=SlaReason.MODEL_NOT_READY,
        shows_wishes=False,
        samples_kept=3,
        why="without a model no count can be sized; the traffic is kept for when the model comes",
    ),
    NoTargetCase(
        "no_inventory",
        model_ready=True,
        traffic=True,
        inventory_known=False,
        reason=SlaReason.NO_INVENTORY,
        shows_wishes=True,
        samples_kept=3,
        why="zeros that mean unknown (a service that just started) must not become a target: the "
        "cluster might run many more engines than the wish; the wishes are shown, the traffic kept",
    ),
]


@pytest.mark.parametrize("case", NO_TARGET_CASES, ids=lambda c: c.name)
def test_tick_without_what_it_needs_sets_no_target(h200: PerfModel, case: NoTargetCase) -> None:
    settings = settings_for(h200, ("prefill", "decode"))
    counts = {"prefill": 2, "decode": 2} if case.inventory_known else {"prefill": 0, "decode": 0}
    run = Run(
        h200 if case.model_ready else None, settings, expected=counts, inventory_known=case.inventory_known
    )
    for _ in range(3):
        result = run.tick(100.0 if case.traffic else None)
        diagnostics = result.diagnostics
        assert (result.replicas, result.reason) == (None, case.reason), case.why
        assert diagnostics["lead_s"] == settings.startup_estimate_s, case.why
        assert diagnostics["scale"] == {}, case.why
        assert ("demand" in diagnostics, "roles" in diagnostics) == (case.shows_wishes, case.shows_wishes), (
            case.why
        )
        if case.shows_wishes:
            assert diagnostics["roles"]["prefill"]["wish"] == prefill_wish(
                h200, settings, 100.0 / TICK_S * ISL, LengthMix.uniform(ISL), 1.0
            ), case.why
    assert len(run.state.samples) == case.samples_kept, case.why
    assert run.state.wishes == deque(), "nothing to stabilise against: no target was set"


def test_ticks_without_requests_are_zero_demand_and_go_down_after_the_window(h200: PerfModel) -> None:
    """A tick with no request is a measured zero, not a missing reading: the wishes fall to the
    minimum, and are held like any lower wish until a full scale-down window is watched."""
    settings = settings_for(h200, ("prefill", "decode"))
    run = Run(h200, settings, expected={"prefill": 2, "decode": 2})
    # The watch starts at the first tick (5 s): at 60 s it has seen 55 of the 60 s window.
    for _ in range(12):
        result = run.tick(0.0, isl=None, osl=None)
    assert (result.replicas, result.reason) == ({"prefill": 2, "decode": 2}, SlaReason.HOLD)
    roles = result.diagnostics["roles"]
    assert (roles["prefill"]["wish"], roles["decode"]["wish"]) == (1, 1), "zero demand wishes the minimum"
    assert roles["prefill"]["hold"] == "watched 55 s of the 60 s window"
    result = run.tick(0.0, isl=None, osl=None)
    assert (result.replicas, result.reason) == ({"prefill": 1, "decode": 1}, SlaReason.SCALE_DOWN)
