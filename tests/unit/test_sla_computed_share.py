"""The computed share (app/core/sla/computed.py): the share of the prompt tokens prefill computes,
measured from every forward pass of the interval, and prefill sized for what the cache leaves it."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics
from app.core.sla.capacity import LengthMix
from app.core.sla.computed import MIN_SHARE, update_computed_share
from app.core.sla.state import SlaState
from app.core.sla.types import SlaInput, TrafficSample
from tests.unit.sla_scenarios import (
    CHUNK,
    ISL,
    OSL,
    TICK_S,
    Run,
    h200_model,
    prefill_record,
    prefill_sizing,
    prior_of,
    settings_for,
)

REQUESTS = 40.0  # per 5 s tick: 80,000 prompt tokens of ISL 2,000
PROMPT = int(REQUESTS * ISL)


def prefill_pass(computed_tokens: int, queued_tokens: int, worker: str = "p0") -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id=worker,
        dp_rank=0,
        wall_time_s=0.2,
        scheduled=ScheduledRequestMetrics(num_prefill_requests=4, sum_prefill_tokens=computed_tokens),
        queued=QueuedRequestMetrics(num_prefill_requests=1, sum_prefill_tokens=queued_tokens),
    )


class Tick(NamedTuple):
    requests: float
    computed_tokens: int | None  # what the interval's passes computed (None: not every pass seen)
    queued_tokens: int  # the engine's queue at the tick


class ShareCase(NamedTuple):
    name: str
    ticks: list[Tick]
    share: float
    why: str


CASES = [
    ShareCase(
        "every_pass",
        [Tick(REQUESTS, int(PROMPT * 0.3), 4000)] * 16,
        0.3,
        "the passes computed 30% of the prompt tokens, the queue steady: 70% came from the cache "
        "(the first tick has no earlier queue and adds no point)",
    ),
    ShareCase(
        "a_growing_queue_is_not_a_cache",
        [Tick(REQUESTS, PROMPT // 2, 4000 + i * (PROMPT - PROMPT // 2)) for i in range(16)],
        1.0,
        "half the prompt tokens computed and the other half queued: engines behind, not a cache hit",
    ),
    ShareCase(
        "a_draining_queue_counts_what_it_computes",
        [Tick(REQUESTS, PROMPT, 200_000 - i * int(PROMPT * 0.4)) for i in range(6)]
        + [Tick(REQUESTS, int(PROMPT * 0.6), 200_000 - 5 * int(PROMPT * 0.4))] * 10,
        0.6,
        "computing the arrivals whole while the queue shrinks by 40% of them: 60% of what arrives "
        "is computed, the rest of the passes' work is the queue's",
    ),
    ShareCase(
        "not_every_pass",
        [Tick(REQUESTS, None, 0)] * 16,
        1.0,
        "without every pass (one record per engine and tick) nothing says what a cache saves",
    ),
    ShareCase(
        "too_few_prompt_tokens",
        [Tick(1.0, 200, 0)] * 16,
        1.0,
        "15 prompts of 2,000 tokens are under 8 chunks: too few to read a cache from",
    ),
    ShareCase(
        "a_few_passes_say_little",
        [Tick(REQUESTS, int(PROMPT * 0.3), 4000)] * 4,
        1.0,
        "15 s of passes do not span the trend window: a prompt still in progress would read as a hit",
    ),
    ShareCase(
        "never_below_the_floor",
        [Tick(REQUESTS, 0, 0)] * 16,
        MIN_SHARE,
        "a prompt is never all cached: its last block at least is computed",
    ),
]


def feed(ticks: list[Tick]) -> tuple[SlaState, dict]:
    settings = settings_for(h200_model(), ("prefill", "decode"))
    state, diag = SlaState(), {}
    for i, t in enumerate(ticks):
        now_s = (i + 1) * TICK_S
        complete = t.computed_tokens is not None
        record = prefill_pass(t.computed_tokens or 0, t.queued_tokens)
        inp = SlaInput(
            now_s,
            TrafficSample(now_s, TICK_S, t.requests, ISL, OSL),
            {"prefill": {("p0", 0): record}},
            {"prefill": 1, "decode": 1},
            {"prefill": 1, "decode": 1},
            fpm_new={"prefill": [record]} if complete else {},
            fpm_complete={"prefill": complete},
        )
        diag = update_computed_share(state, inp, settings)
    return state, diag


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_computed_share_is_measured_from_every_pass(case: ShareCase) -> None:
    state, diag = feed(case.ticks)
    assert state.computed_share == pytest.approx(case.share, abs=1e-9), case.why
    assert diag["computed_share_measured"] == (case.ticks[-1].computed_tokens is not None), case.why


def test_an_engine_gone_with_its_queue_is_not_a_cache_hit() -> None:
    """Two engines computing 30% of the prompt tokens between them; one, 200,000 tokens queued,
    goes away (restarted, expired, removed) half-way: its queue is not read as tokens a cache
    served."""
    settings = settings_for(h200_model(), ("prefill", "decode"))
    state = SlaState()
    for i in range(16):
        now_s = (i + 1) * TICK_S
        engines = ("p0", "p1") if i < 8 else ("p0",)
        records = {
            (e, 0): prefill_pass(int(PROMPT * 0.3) // len(engines), 200_000 if e == "p1" else 0, e)
            for e in engines
        }
        inp = SlaInput(
            now_s,
            TrafficSample(now_s, TICK_S, REQUESTS, ISL, OSL),
            {"prefill": records},
            {"prefill": len(engines), "decode": 1},
            {"prefill": len(engines), "decode": 1},
            fpm_new={"prefill": list(records.values())},
            fpm_complete={"prefill": True},
        )
        update_computed_share(state, inp, settings)
    assert state.computed_share == pytest.approx(0.3, abs=1e-4), "the vanished queue is not a hit"


def test_the_share_is_read_over_the_lookback() -> None:
    settings = settings_for(h200_model(), ("prefill", "decode"))
    ticks = int(settings.lookback_s / TICK_S)
    hits = [Tick(REQUESTS, int(PROMPT * 0.2), 0)] * ticks + [Tick(REQUESTS, int(PROMPT * 0.8), 0)] * (
        2 * ticks
    )
    state, _ = feed(hits)
    assert state.computed_share == pytest.approx(0.8), (
        "a cache that stopped hitting a lookback ago no longer counts"
    )


def test_a_cached_prefix_is_read_not_computed() -> None:
    """Prompts of 2 × ISL whose first half is cached cost prefill less than the same prompts
    computed whole, and more than prompts of ISL alone: their computed half reads the cached one."""
    model = h200_model()
    settings = settings_for(model, ("prefill", "decode"))
    cost = prior_of(model, settings).prefill
    whole = LengthMix.exponential(2 * ISL, settings.quantile)
    sized = {
        name: prefill_sizing(cost, settings, 400.0 / TICK_S * isl, mix, disp=1.0)
        for name, isl, mix in (
            ("whole", 2 * ISL, whole),
            ("cached", 2 * ISL, whole.computed(0.5)),
            ("half", ISL, LengthMix.exponential(ISL, settings.quantile)),
        )
    }
    assert sized["whole"].engines > sized["cached"].engines >= sized["half"].engines > 1, sized
    # In prompt tokens an engine serves more of the cached prompts, but not twice as many.
    ratio = sized["cached"].capacity_tokens_s / sized["whole"].capacity_tokens_s
    assert 1.2 < ratio < 2.0, ratio


def test_the_step_sizes_prefill_for_what_the_cache_leaves() -> None:
    """The same traffic, its passes (full chunks at the profile's time) computing half the prompt
    tokens or all of them: the step reports the share it measured and orders fewer prefill
    engines for the cached one; decode alike (it holds the whole context either way)."""
    model = h200_model()
    settings = settings_for(model, ("prefill", "decode"))
    record = prefill_record(model, "p0")
    results = {}
    for share in (0.5, 1.0):
        run = Run(model, settings, {"prefill": 1, "decode": 1})
        chunks = round(400.0 * 2 * ISL * share / CHUNK)
        for _ in range(24):
            results[share] = run.tick(
                400.0,
                isl=2 * ISL,
                fpm={"prefill": {("p0", 0): record}},
                passes={"prefill": [record] * chunks},
            ).diagnostics
    cached, whole = results[0.5], results[1.0]
    assert cached["demand"]["computed_share"] == pytest.approx(0.5, abs=0.01)
    assert whole["demand"]["computed_share"] == pytest.approx(1.0, abs=0.01)
    assert cached["roles"]["prefill"]["needed"] < whole["roles"]["prefill"]["needed"], (cached, whole)
    assert cached["roles"]["decode"]["needed"] == whole["roles"]["decode"]["needed"]
