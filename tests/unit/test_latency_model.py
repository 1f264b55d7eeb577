"""The learned iteration costs (`app/core/sla/latency.py`), the busy check and quiet periods
(`app/core/sla/learners.py`, `app/core/sla/quiet.py`), each pinned on a small scenario.

The worlds are written out as iteration times of FPM records (`ForwardPassMetrics`): what an
engine would report of each forward pass. The prior is the bundled H200 profile's, read by
`prior_models` as straight lines; scenarios driving the planner go through `sla_step` with 5 s
ticks, as tests/unit/test_sla_scaling.py does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics
from app.core.perf.interpolation import PerfModel
from app.core.sla.capacity import (
    Bucket,
    LengthMix,
    decode_batch_limit,
    largest_meeting,
    prefill_engines,
    profile_decode_floor,
)
from app.core.sla.latency import PrefillCost, decode_features, prefill_features
from app.core.sla.settings import SlaSettings
from app.core.sla.state import SlaState
from app.core.sla.step import sla_step
from app.core.sla.types import SlaInput, SlaReason, SlaResult, TrafficSample
from app.core.types import Role, RoleBounds
from tests.unit.sla_scenarios import CHUNK, ISL, OSL, TICK_S, h200_model, prior_of, settings_for


@pytest.fixture(scope="module")
def h200() -> PerfModel:
    return h200_model()


@dataclass
class Run:
    """One planner's 5 s ticks; the orders are followed at once (expected and ready become the
    target). No order is ever placed in these scenarios unless said, so the lead stays the
    120 s startup estimate."""

    model: PerfModel
    settings: SlaSettings
    expected: dict[Role, int]
    state: SlaState = field(default_factory=SlaState)
    now_s: float = 0.0

    def tick(
        self,
        num_req: float,
        *,
        isl: float = ISL,
        osl: float = OSL,
        buckets: tuple[Bucket, ...] = (),
        fpm_new: dict[Role, Sequence[ForwardPassMetrics]] | None = None,
        complete: dict[Role, bool] | None = None,
        latest: bool = False,
    ) -> SlaResult:
        """`latest`: also hand each engine's last record of `fpm_new` as its latest forward pass
        (what the measured scale reads)."""
        self.now_s += TICK_S
        fpm = {
            role: {(r.worker_id, r.dp_rank): r for r in records} for role, records in (fpm_new or {}).items()
        }
        result = sla_step(
            self.model,
            self.state,
            SlaInput(
                self.now_s,
                TrafficSample(self.now_s, TICK_S, num_req, isl, osl, buckets),
                fpm if latest else {},
                dict(self.expected),
                dict(self.expected),
                fpm_new=fpm_new or {},
                fpm_complete=complete or {},
            ),
            self.settings,
        )
        if result.replicas is not None:
            self.expected = dict(result.replicas)
        return result


def decode_record(worker: str, requests: int, context: int, wall_ms: float) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id=worker,
        dp_rank=0,
        wall_time_s=wall_ms / 1000.0,
        scheduled=ScheduledRequestMetrics(
            num_decode_requests=requests, sum_decode_kv_tokens=requests * context
        ),
    )


def prefill_record(
    wall_ms: float,
    tokens: int,
    *,
    prefix: int = 0,
    prompts: int = 1,
    queued_prompts: int = 0,
    worker: str = "p0",
) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id=worker,
        dp_rank=0,
        wall_time_s=wall_ms / 1000.0,
        scheduled=ScheduledRequestMetrics(
            num_prefill_requests=prompts, sum_prefill_tokens=tokens, sum_prefill_kv_tokens=prefix
        ),
        queued=QueuedRequestMetrics(
            num_prefill_requests=queued_prompts, sum_prefill_tokens=queued_prompts * 1000
        ),
    )


# --- a decode plateau in the profile that the world does not have ---------------------------------

# The world: at a context of 1000 tokens, an iteration of n requests takes 5 + 0.1·n ms, rising
# as far as batches go. The profile's surface levels off there (36-43 ms from 300 to 900
# requests): read as a surface, a plateau is free capacity the world does not have.
CONTEXT = 1000


def world_itl_ms(n: float) -> float:
    return 5.0 + 0.1 * n


def test_decode_limit_is_the_worlds_not_the_profiles_plateau(h200: PerfModel) -> None:
    # Decode only, ITL target 30 ms, lengths whose batch context is 950 + 100/2 = 1000.
    settings = settings_for(h200, ("decode",), itl_target_ms=30.0)
    isl, osl = 950.0, 100.0
    prior = prior_of(h200, settings)

    def limit(cost: object, target_ms: float = 30.0) -> int:
        return decode_batch_limit(
            cost,  # type: ignore[arg-type]
            isl_tokens=isl,
            osl_tokens=osl,
            itl_target_ms=target_ms,
            max_kv_tokens=settings.max_kv_tokens,
        )

    # Cold, the profile's straight line allows 481 at 30 ms: far more than the world's
    # (30 - 5) / 0.1 = 250. (The profile's surface itself allows 233 at 30 ms: below
    # its plateau it is close to this world; the plateau shows at 40 ms, below.)
    assert limit(prior.decode) == 481
    assert largest_meeting(lambda n: h200.decode_itl_ms(n, CONTEXT) <= 30.0, 945) == 233
    run = Run(h200, settings, expected={"decode": 1})
    records = [decode_record(f"d{n % 4}", n, CONTEXT, world_itl_ms(n)) for n in range(1, 301)]
    for _ in range(8):  # 40 s of a decode fleet's forward passes, batches of 1 ... 300
        result = run.tick(100.0, isl=isl, osl=osl, fpm_new={"decode": records})
        assert result.diagnostics["latency"]["decode"]["learned_now"] == 300
    learned = run.state.latency.decode  # type: ignore[union-attr]
    decode = result.diagnostics["roles"]["decode"]
    assert decode["batch_limit"] == limit(learned)
    # The world's 250, within a few requests (the prior's slope, a little lower, still pulls).
    assert abs(decode["batch_limit"] - 250) <= 5
    assert result.diagnostics["latency"]["decode"]["records"] == 2400
    assert result.diagnostics["latency"]["decode"]["range"] == [3.0, 3.0]  # n / 100, K / 1e5

    # Beyond the data (300 requests), the cost keeps rising: no plateau, and the prediction is
    # at least the fitted line, within 3% of the world's straight line, and far above the
    # profile's surface.
    for n in (400, 600, 900):
        x = decode_features(n, n * CONTEXT)
        assert learned.iteration_ms(n, n * CONTEXT) >= learned.model.mean_ms(x)
        assert learned.iteration_ms(n, n * CONTEXT) >= 0.97 * world_itl_ms(n)
        assert learned.iteration_ms(n, n * CONTEXT) > h200.decode_itl_ms(n, CONTEXT) + 3.0
    rise = learned.iteration_ms(900, 900 * CONTEXT) - learned.iteration_ms(600, 600 * CONTEXT)
    assert rise >= 0.95 * 0.1 * 300
    # At 40 ms, a target only the plateau meets at large batches: the profile's surface allows
    # 606 requests (it is at most 40 ms up to there), the world 350, and the learned cost,
    # extrapolated beyond its data, stays with the world.
    assert largest_meeting(lambda n: h200.decode_itl_ms(n, CONTEXT) <= 40.0, 945) == 606
    assert 345 <= limit(learned, 40.0) <= 360


def test_a_batch_beyond_the_records_is_never_cheaper_than_the_profile(h200: PerfModel) -> None:
    # The profile's own world, seen only at the small batches of a light start (20-85 requests
    # at a 1000-token context): a line through them is flatter than the profile's rise beyond,
    # and read as the limit it would put 30 ms far past where the world has it.
    settings = settings_for(h200, ("decode",), itl_target_ms=30.0)
    isl, osl = 950.0, 100.0
    run = Run(h200, settings, expected={"decode": 2})
    records = [decode_record(f"d{n % 2}", n, CONTEXT, h200.decode_itl_ms(n, CONTEXT)) for n in range(20, 86)]
    for _ in range(8):
        result = run.tick(100.0, isl=isl, osl=osl, fpm_new={"decode": records})
    learned = run.state.latency.decode  # type: ignore[union-attr]
    assert result.diagnostics["latency"]["decode"]["range"] == [0.85, 0.85]

    def limit(floor: object, target_ms: float = 30.0) -> int:
        return decode_batch_limit(
            learned,
            isl_tokens=isl,
            osl_tokens=osl,
            itl_target_ms=target_ms,
            max_kv_tokens=settings.max_kv_tokens,
            profile_itl_ms=floor,  # type: ignore[arg-type]
        )

    world_limit = largest_meeting(lambda n: h200.decode_itl_ms(n, CONTEXT) <= 30.0, 945)
    assert world_limit == 233
    assert limit(None) >= 1.3 * world_limit  # the line alone: the free capacity the world lacks
    # With the profile as the floor beyond the records, the limit is the world's; the planner's
    # floor also reads the profile a quarter below the context (where the profile's surface
    # rises again at some batches), which here moves nothing; a quarter above would have put the
    # limit at 210, where the world is 27.7 ms.
    assert limit(h200.decode_itl_ms) == world_limit
    assert result.diagnostics["roles"]["decode"]["batch_limit"] == world_limit
    assert world_limit == largest_meeting(
        lambda n: max(h200.decode_itl_ms(n, CONTEXT * k) for k in (0.75, 1.0)) <= 30.0, 945
    )
    assert 210 == largest_meeting(
        lambda n: max(h200.decode_itl_ms(n, CONTEXT * k) for k in (0.75, 1.0, 1.25)) <= 30.0, 945
    )
    assert round(h200.decode_itl_ms(210, CONTEXT), 1) == 27.7
    # Within the records the learned cost alone decides (a limit inside them is the line's).
    inside_ms = h200.decode_itl_ms(60, CONTEXT)
    assert limit(h200.decode_itl_ms, inside_ms) == limit(None, inside_ms) < 85


def test_a_slower_world_raises_the_profile_floor_by_its_measured_scale(h200: PerfModel) -> None:
    """The same light start in a world 20% slower than the profile everywhere: beyond the records
    the floor is the profile times the measured decode scale (1.2), so the limit is the slower
    world's. A floor that only ever scaled down left it at the profile's 233, where this world
    reaches 30 ms from 187 requests on (ITL broke at every burst's start of a bursty workload)."""
    settings = settings_for(h200, ("decode",), itl_target_ms=30.0)
    isl, osl = 950.0, 100.0
    run = Run(h200, settings, expected={"decode": 2})
    records = [
        decode_record(f"d{n % 2}", n, CONTEXT, 1.2 * h200.decode_itl_ms(n, CONTEXT)) for n in range(20, 86)
    ]
    for _ in range(8):
        result = run.tick(100.0, isl=isl, osl=osl, fpm_new={"decode": records}, latest=True)
    assert result.diagnostics["scale"]["decode"] == pytest.approx(1.2, abs=1e-4)
    slower = largest_meeting(lambda n: 1.2 * h200.decode_itl_ms(n, CONTEXT) <= 30.0, 945)
    assert slower == 186
    assert result.diagnostics["roles"]["decode"]["batch_limit"] == slower


def test_the_floor_takes_its_scale_from_the_large_batches_not_the_latest_median(h200: PerfModel) -> None:
    """A world whose decode is not the profile's shape (Dynamo's mocker, timed from the same
    profile, reads 0.7-1.27 of it from tick to tick): 30% slower than the profile at 4 requests,
    30% faster at 100. The tick's scale is the median of the latest passes, whatever their batch;
    the floor's scale weighs each pass by its batch, so it stands where batches are large and does
    not follow an idle engine's small ones."""
    settings = settings_for(h200, ("decode",), itl_target_ms=30.0)
    run = Run(h200, settings, expected={"decode": 2})
    p4, p100 = h200.decode_itl_ms(4, CONTEXT), h200.decode_itl_ms(100, CONTEXT)
    small = decode_record("d0", 4, CONTEXT, 1.3 * p4)
    large = decode_record("d1", 100, CONTEXT, 0.7 * p100)
    for _ in range(8):
        both = run.tick(100.0, isl=950.0, osl=100.0, fpm_new={"decode": [small, large]}, latest=True)
    weighted = (4 * 1.3 * p4 + 100 * 0.7 * p100) / (4 * p4 + 100 * p100)
    assert weighted == pytest.approx(0.706, abs=1e-3)
    decode = both.diagnostics["roles"]["decode"]
    assert decode["floor_scale"] == pytest.approx(weighted, abs=1e-3)
    assert both.diagnostics["scale"]["decode"] == pytest.approx(1.0, abs=1e-3)  # the median of 1.3 and 0.7
    # At the tick's scale (1.0) the floor held the profile's own limit, 210 (pinned above); at the
    # large batches' 0.71 the engines are let hold more.
    assert decode["batch_limit"] > 210
    # Three ticks with only the idle engine's small batches: the tick's scale follows them up,
    # the floor's barely moves, and the limit moves only as the learned line takes the small
    # batches in: it stays above the profile's own 210, where a floor at the tick's scale (above
    # 1.15) would put it.
    limits = []
    for _ in range(3):
        small = decode_record("d0", 4, CONTEXT, 1.3 * p4 * (1 + 1e-9 * run.now_s))  # a fresh record
        idle = run.tick(100.0, isl=950.0, osl=100.0, fpm_new={"decode": [small]}, latest=True)
        limits.append(idle.diagnostics["roles"]["decode"]["batch_limit"])
    assert idle.diagnostics["scale"]["decode"] > 1.15
    assert idle.diagnostics["roles"]["decode"]["floor_scale"] == pytest.approx(weighted, abs=0.02)
    assert min(limits) > 210


def test_in_the_profiles_own_world_the_floor_scale_is_one(h200: PerfModel) -> None:
    settings = settings_for(h200, ("decode",), itl_target_ms=30.0)
    run = Run(h200, settings, expected={"decode": 2})
    for n in (5, 40, 90):
        record = decode_record("d0", n, CONTEXT, h200.decode_itl_ms(n, CONTEXT))
        result = run.tick(100.0, isl=950.0, osl=100.0, fpm_new={"decode": [record]}, latest=True)
    assert result.diagnostics["roles"]["decode"]["floor_scale"] == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize(
    ("context", "target_ms", "limit", "above"),
    [(10_000, 30.0, 76, 60), (16_700, 30.0, 46, 37), (20_000, 35.0, 44, 35)],
)
def test_at_long_contexts_the_floor_allows_the_profile_worlds_own_batch(
    h200: PerfModel, context: int, target_ms: float, limit: int, above: int
) -> None:
    """A long-prompt mix holds a few dozen requests per decode engine. The floor reads the
    profile at the context and a quarter below it: the batch limit is the profile world's own
    (its ITL at the mean context). Read a quarter above too, it fell by a fifth, and decode was
    bought for batches smaller than the engines run."""
    floor = profile_decode_floor(h200)
    cap = int(h200.decode.max_kv_tokens // context)
    world = largest_meeting(lambda n: h200.decode_itl_ms(n, float(context)) <= target_ms, cap)
    assert largest_meeting(lambda n: floor(n, float(context)) <= target_ms, cap) == world == limit
    assert above == largest_meeting(
        lambda n: max(h200.decode_itl_ms(n, context * k) for k in (1.0, 1.25)) <= target_ms, cap
    )


# --- prefill with and without chunk packing -------------------------------------------------------

# A prefill world: a + b·T + c·T·(P + T/2)/n ms, for T tokens, P of prefix, n prompts.
PA, PB, PC = 16.5, 0.0152, 0.84e-6


def world_prefill_ms(tokens: float, prefix: float = 0.0, prompts: float = 1.0, c: float = PC) -> float:
    return PA + PB * tokens + c * tokens * (prefix + tokens / 2) / prompts


def capacity_at(cost: PrefillCost, isl: float, mix: LengthMix | None = None) -> float:
    """Tokens per second per saturated engine, for prompts all of `isl` tokens unless `mix`."""
    sizing = prefill_engines(
        cost, token_rate_s=10_000.0, mix=mix or LengthMix.uniform(isl), ttft_target_ms=1000.0
    )
    return sizing.capacity_tokens_s


def test_an_engine_that_runs_one_prompt_per_iteration_is_sized_so(h200: PerfModel) -> None:
    prior = prior_of(h200, settings_for(h200, ("prefill",)))
    # Three 1000-token prompts waited when each iteration was scheduled, and it ran one of them,
    # with 7192 tokens of the chunk left: the engine does not pack prompts.
    records = [prefill_record(world_prefill_ms(1000), 1000, queued_prompts=3) for _ in range(200)]
    cost = prior.observed("prefill", records, 5.0).prefill
    assert cost.packs is False
    # Each record after the first is evidence (the first has no record before it).
    assert (cost.packed_evidence, cost.unpacked_evidence) == (0.0, 199.0)
    # Capacity for a 1000-token mix: one prompt per iteration, 1000 tokens per 32.1 ms.
    assert capacity_at(cost, 1000) == pytest.approx(1000 / cost.alone_s(1000), rel=1e-12)
    assert capacity_at(cost, 1000) == pytest.approx(1000 / (world_prefill_ms(1000) / 1000), rel=0.01)


def test_one_prompt_per_iteration_with_one_waiting_is_no_evidence(h200: PerfModel) -> None:
    prior = prior_of(h200, settings_for(h200, ("prefill",)))
    records = [prefill_record(world_prefill_ms(1000), 1000, queued_prompts=1) for _ in range(50)]
    cost = prior.observed("prefill", records, 5.0).prefill
    assert (cost.packed_evidence, cost.unpacked_evidence, cost.packs) == (0.0, 0.0, False)


def test_a_busy_tick_read_in_full_for_packing_though_the_fit_reads_a_sample(h200: PerfModel) -> None:
    """Why: a tick of a busy fleet brings more passes than the fit reads. Whether an engine packs
    compares each pass with the one it ran just before; in the thinned list the pass before is an
    older one, and an engine that packed every time two prompts waited read as one that does not
    (its capacity halved, its count doubled)."""
    run = Run(h200, settings_for(h200, ("prefill",)), expected={"prefill": 1})
    # 900 passes of one engine: one prompt while nothing else waits, then the two that arrived
    # meanwhile packed into one chunk, and so on.
    passes = [
        prefill_record(world_prefill_ms(1000), 1000, queued_prompts=2)
        if i % 2 == 0
        else prefill_record(world_prefill_ms(2000, 0, 2), 2000, prompts=2, queued_prompts=0)
        for i in range(900)
    ]
    result = run.tick(100.0, isl=1000.0, fpm_new={"prefill": passes})
    cost = run.state.latency.prefill  # type: ignore[union-attr]
    # Every two-prompt pass is evidence; no single-prompt pass ran with two waiting.
    assert (cost.packed_evidence, cost.unpacked_evidence) == (450.0, 0.0)
    assert cost.packs is True
    assert result.diagnostics["latency"]["prefill"]["learned_now"] == 400


def test_an_engine_that_packs_prompts_into_its_chunks_is_sized_so(h200: PerfModel) -> None:
    settings = settings_for(h200, ("prefill",))
    unpacked = prior_of(h200, settings).observed(
        "prefill", [prefill_record(world_prefill_ms(1000), 1000, queued_prompts=3) for _ in range(200)], 5.0
    )
    # Eight 1000-token prompts per iteration, learned through the planner's ticks.
    run = Run(h200, settings, expected={"prefill": 1})
    packed = [
        prefill_record(world_prefill_ms(8000, 0, 8), 8000, prompts=8, queued_prompts=8) for _ in range(100)
    ]
    for _ in range(2):
        result = run.tick(100.0, isl=1000.0, fpm_new={"prefill": packed})
    cost = run.state.latency.prefill  # type: ignore[union-attr]
    assert cost.packs is True
    assert result.diagnostics["latency"]["prefill"]["packs_prompts"] is True
    # 100 records, then 0.9 × 100 + 100.
    assert cost.packed_evidence == pytest.approx(190.0, rel=1e-12)
    # Packed, a 1000-token prompt pays its tokens' share of one full single-prompt chunk
    # (8192 tokens in 169.2 ms: 48,400 tokens/s), against 31,100 one per iteration. Read per
    # prompt (its share of the chunk's fixed cost, its own tokens, attention to its own 1000
    # only: 17.6 ms, 56,700 tokens/s) this world would serve 17% more; the planner does not
    # count on it, and the busy check, which only lowers, never gives it back. Where a packed
    # chunk costs what one sequence of its tokens does (the project's replay worlds), the
    # per-prompt reading would be the optimistic one, and a saturated engine the place it shows.
    full_chunk_ms = cost.iteration_ms(CHUNK)
    assert capacity_at(cost, 1000) == pytest.approx(CHUNK / (full_chunk_ms / 1000), rel=1e-9)
    assert capacity_at(cost, 1000) == pytest.approx(CHUNK / (world_prefill_ms(CHUNK) / 1000), rel=0.01)
    per_prompt_ms = PA * 1000 / CHUNK + PB * 1000 + PC * 1000 * 500
    assert 1000 / (per_prompt_ms / 1000) > 1.15 * capacity_at(cost, 1000)
    assert capacity_at(cost, 1000) > 1.5 * capacity_at(unpacked.prefill, 1000)
    # The ticks bring no ISL histogram: the planner's capacity is at the mean's exponential mix.
    no_histogram = LengthMix.exponential(1000.0, settings.quantile)
    assert result.diagnostics["roles"]["prefill"]["capacity_tokens_s"] == round(
        capacity_at(cost, 1000, no_histogram), 1
    )


# --- a long prompt's prefix cost ------------------------------------------------------------------

# This world's attention costs 1e-6 ms per token pair more than the profile's line says
# (1.84e-6 for its 0.84e-6): a late chunk of a long prompt, reading a long prefix, costs far
# more than the profile's prompts of at most 16k tokens showed; a short prompt hardly more.
LONG_C = 1.84e-6


def world_alone_s(isl: int) -> float:
    total, done = 0.0, 0
    while done < isl:
        take = min(CHUNK, isl - done)
        total += world_prefill_ms(take, done, c=LONG_C)
        done += take
    return total / 1000.0


def long_prompt_records() -> list[ForwardPassMetrics]:
    """An 85,000-token prompt chunk by chunk (the prefix growing by 8192 each), then four short
    prompts."""
    records, done = [], 0
    while done < 85_000:
        take = min(CHUNK, 85_000 - done)
        records.append(prefill_record(world_prefill_ms(take, done, c=LONG_C), take, prefix=done))
        done += take
    for tokens in (500, 1000, 2000, 4000):
        records.append(prefill_record(world_prefill_ms(tokens, c=LONG_C), tokens))
    return records


def test_a_long_prompts_prefix_cost_is_learned(h200: PerfModel) -> None:
    prior = prior_of(h200, settings_for(h200, ("prefill",)))
    models = prior
    for k in range(20):  # 100 s of an engine's forward passes: 1500 records
        models = models.observed("prefill", long_prompt_records() * 5, TICK_S * (k + 1))
    cost = models.prefill
    assert cost.model.records == 1500
    # 85,000 tokens: 8.12 s in this world. The profile's line says 4.51 s.
    assert world_alone_s(85_000) == pytest.approx(8.12, rel=1e-3)
    assert prior.prefill.alone_s(85_000) == pytest.approx(4.514, rel=1e-3)
    assert cost.alone_s(85_000) == pytest.approx(world_alone_s(85_000), rel=0.01)
    assert cost.alone_s(85_000) > 1.4 * prior.prefill.alone_s(85_000)
    # A 1000-token prompt: 32.6 ms in this world, 32.1 ms on the profile's line. The learned
    # cost stays within a few percent of both (its fixed cost and per-token cost give way a
    # little to the profile's 16k-token points, which the world contradicts).
    line_ms = prior.prefill.model.mean_ms(prefill_features(1000, 0))
    assert line_ms == pytest.approx(32.1, rel=1e-2)
    assert world_alone_s(1000) * 1000 == pytest.approx(32.62, rel=1e-3)
    assert cost.alone_s(1000) * 1000 == pytest.approx(world_alone_s(1000) * 1000, rel=0.04)
    assert cost.alone_s(1000) * 1000 == pytest.approx(line_ms, rel=0.05)


# --- quiet periods --------------------------------------------------------------------------------

BUSY = 300.0  # requests per tick: 60 req/s of 2000 tokens, 120,000 prompt tokens/s


def busy_wishes(h200: PerfModel, settings: SlaSettings, per_tick: float = BUSY) -> dict[Role, int]:
    """The counts 60 req/s (`per_tick` requests a tick) need on the cold-start prior (no forward
    pass is fed here)."""
    prior = prior_of(h200, settings)
    prefill = prefill_engines(
        prior.prefill,
        token_rate_s=per_tick / TICK_S * ISL,
        mix=LengthMix.uniform(ISL),
        ttft_target_ms=settings.ttft_target_ms,
        max_engines=32,
    ).engines
    in_flight = per_tick / TICK_S * (OSL - 1) * settings.itl_target_ms / 1000.0
    peak = in_flight + 2.3263478740408408 * math.sqrt(in_flight)  # the 0.99 normal quantile
    batch = decode_batch_limit(
        prior.decode, isl_tokens=ISL, osl_tokens=OSL, itl_target_ms=20.0, max_kv_tokens=settings.max_kv_tokens
    )
    return {"prefill": prefill, "decode": math.ceil(peak / batch)}


def busy_then_silent(h200: PerfModel, **overrides: object) -> tuple[Run, dict[Role, int]]:
    """Ten minutes at 60 req/s, the counts right from the start; then the traffic stops after
    the tick at 600 s. The 60 s trend level falls to 1/12 of the busy level (below the 10%
    quiet fraction) at 655 s: the quiet period starts there."""
    settings = settings_for(h200, ("prefill", "decode"), **overrides)
    busy = busy_wishes(h200, settings)
    run = Run(h200, settings, expected=dict(busy))
    for _ in range(120):
        result = run.tick(BUSY)
        assert (result.replicas, result.reason) == (busy, SlaReason.NO_CHANGE)
    return run, busy


def test_a_burst_after_a_quiet_minute_finds_the_engines_it_needs(h200: PerfModel) -> None:
    run, busy = busy_then_silent(h200)
    assert busy == {"prefill": 4, "decode": 2}  # 120,000 tokens/s, 179 requests in decode
    horizon_s = 120.0 + 20.0  # the lead (the startup estimate) and the level window
    ages = []
    while run.now_s < 720.0:
        result = run.tick(0.0)
        quiet = result.diagnostics.get("quiet")
        if run.now_s < 655.0:
            assert quiet is None
            continue
        ages.append(quiet["age_s"])
        # A return within the horizon is likely (no period learned: the prior h / (a + h)):
        # the counts stay at what a return needs, the busy level.
        assert quiet["periods_seen"] == 0
        assert quiet["return_probability"] == round(horizon_s / (quiet["age_s"] + horizon_s), 3)
        assert quiet["keep"] is True
        assert quiet["return_wish"] == busy
        assert (result.replicas, result.reason) == (busy, SlaReason.NO_CHANGE)
    assert ages[0] == 0.0 and ages[-1] == 65.0
    # A quiet minute (and 5 s): what the traffic alone wishes is the minimum, the quiet period
    # keeps the return's counts, at a cost of 4 engines (3 prefill, 1 decode) over the horizon;
    # letting them go
    # would send 140/205 × 60 req/s × 140 s of a return to too few engines.
    # The roles' wishes are the floored ones, as the target and the detail line say.
    assert {role: result.diagnostics["roles"][role]["wish"] for role in busy} == busy
    assert result.diagnostics["quiet"]["keep_engine_s"] == 4 * horizon_s
    assert result.diagnostics["quiet"]["release_risk_requests"] == round(140 / 205 * 60 * horizon_s, 1)
    # The burst: the engines are there; no scale-up is needed, and the period is learned.
    for _ in range(3):
        result = run.tick(BUSY)
        assert (result.replicas, result.reason) == (busy, SlaReason.NO_CHANGE)
    assert run.state.quiet.durations_s == (75.0,)

    # The same minute with a planner that keeps engines only for a certain return: it has let
    # them go by the burst, which must then wait for engines to start.
    run, busy = busy_then_silent(h200, quiet_keep_probability=1.0)
    for _ in range(24):
        result = run.tick(0.0)
    assert (result.replicas, result.reason) == ({"prefill": 1, "decode": 1}, SlaReason.SCALE_DOWN)
    result = run.tick(BUSY)
    assert result.reason == SlaReason.SCALE_UP


def test_a_first_return_is_sized_at_the_busy_level_not_at_its_forecast(h200: PerfModel) -> None:
    """Before any return from a quiet period is seen, a return is taken to need what the traffic
    did (the level it started into, or the busy period's burst level), not what was forecast
    for it: a headroom learned from one flash crowd (x10) once kept both roles at their maximum
    for 18 minutes after the traffic ended. Here the forecast is the cold-start headroom, x2 for
    the whole busy period."""
    settings = settings_for(
        h200, ("prefill", "decode"), trend=True, growth_min_points=100_000, cold_start_growth=2.0
    )
    level = busy_wishes(h200, settings)
    run = Run(h200, settings, expected=dict(level))
    for _ in range(120):
        forecast = run.tick(BUSY)
    assert forecast.diagnostics["demand"]["growth"] == [2.0, 2.0]
    sized = forecast.replicas
    assert sized is not None and sized["prefill"] > level["prefill"] and sized["decode"] > level["decode"]
    while run.now_s < 700.0:
        quiet = run.tick(0.0).diagnostics.get("quiet")
    assert quiet is not None and quiet["periods_seen"] == 0 and quiet["keep"] is True
    assert quiet["return_wish"] == level


def test_the_traffic_it_started_into_counts_as_a_return(h200: PerfModel) -> None:
    """Ten busy minutes at 60 req/s from the start, a quiet minute and a half, a return at 30
    req/s for three minutes, then silence again. The returns seen are the start (60 req/s, at
    its level) and the one at 30: what a return needs is the larger. Counting only returns
    after quiet periods, the floor kept 30 req/s' engines and the next burst, as large as the
    first, queued (bursty-gaps at a 30 s start-up: 90.2%)."""
    run, busy = busy_then_silent(h200)
    for _ in range(27):
        run.tick(0.0)
    for _ in range(36):
        run.tick(BUSY / 2)
    assert [round(r[0]) for r in run.state.quiet.returns] == [BUSY / TICK_S * ISL, BUSY / 2 / TICK_S * ISL]
    while (quiet := run.tick(0.0).diagnostics.get("quiet")) is None:
        pass
    assert quiet["periods_seen"] == 1 and quiet["keep"] is True
    assert quiet["return_wish"] == busy
    half = busy_wishes(h200, settings_for(h200, ("prefill", "decode")), per_tick=BUSY / 2)
    assert half != busy  # the return at 30 req/s alone would keep fewer


def test_a_long_silence_lets_the_engines_go(h200: PerfModel) -> None:
    run, busy = busy_then_silent(h200)
    kept_until = released_at = None
    while released_at is None:
        result = run.tick(0.0)
        quiet = result.diagnostics.get("quiet")
        if quiet is None:
            continue
        if quiet["keep"]:
            kept_until = quiet["age_s"]
            assert result.replicas == busy
        elif result.replicas == {"prefill": 1, "decode": 1}:
            released_at = quiet["age_s"]
    # 140 / (a + 140) >= 0.2 up to a = 560 s, nearly five leads of silence.
    assert kept_until == 560.0
    # Then the scale-down window (60 s) of wishes at the minimum, and down.
    assert released_at == 560.0 + 60.0 + TICK_S
    assert result.reason == SlaReason.SCALE_DOWN


def learned_gaps(h200: PerfModel) -> tuple[Run, dict[Role, int]]:
    """Ten busy minutes, then five times a 135 s pause and three busy minutes: each quiet period
    (from the trend level falling below 10% to its rising above) lasts 90 s."""
    run, busy = busy_then_silent(h200)
    for _ in range(5):
        for _ in range(27):
            run.tick(0.0)
        for _ in range(36):
            assert run.tick(BUSY).replicas == busy
    assert run.state.quiet.durations_s == (90.0,) * 5
    return run, busy


def test_learned_gaps_make_a_return_within_them_near_certain(h200: PerfModel) -> None:
    run, _ = learned_gaps(h200)
    horizon_s = 140.0
    seen = {}
    for _ in range(30):
        quiet = run.tick(0.0).diagnostics.get("quiet")
        if quiet is not None:
            seen[quiet["age_s"]] = quiet["return_probability"]
    # At 50 s, all five learned periods lasted longer and ended within 50 + 140 s; with the
    # prior worth one period: (5 + 140/190) / 6.
    assert seen[50.0] == round((5 + horizon_s / (50 + horizon_s)) / 6, 3)
    assert seen[85.0] == round((5 + horizon_s / (85 + horizon_s)) / 6, 3)


def test_a_gap_older_than_all_learned_ones_falls_back_to_the_prior(h200: PerfModel) -> None:
    run, busy = learned_gaps(h200)
    horizon_s = 140.0
    seen: dict[float, dict] = {}
    while not seen or seen[max(seen)]["keep"]:
        quiet = run.tick(0.0).diagnostics.get("quiet")
        if quiet is not None:
            seen[quiet["age_s"]] = quiet
    # Up to 85 s, every learned gap lasted longer and ended within the horizon: kept.
    assert seen[85.0]["keep"] is True
    # From 90 s none lasted longer: the prior alone, h/(a+h), as with no history. It keeps the
    # engines while that is at least 0.2, to 560 s (a gap longer than all five learned ones is
    # still as likely to end soon as an unknown one: on bursty-gaps, letting go sooner here cost
    # 17.5 points of attainment).
    assert seen[90.0]["return_probability"] == round(horizon_s / (90 + horizon_s), 3)
    assert seen[90.0]["keep"] is True
    assert seen[90.0]["periods_seen"] == 5
    let_go = max(seen)
    assert let_go == 565.0
    assert seen[560.0]["keep"] is True
    # The scale-down window (60 s) after letting go, the counts are down.
    for _ in range(int(60.0 / TICK_S) - 1):
        result = run.tick(0.0)
        assert (result.replicas, result.reason) == (busy, SlaReason.HOLD)
    result = run.tick(0.0)
    assert (result.replicas, result.reason) == ({"prefill": 1, "decode": 1}, SlaReason.SCALE_DOWN)


# --- an unservable prompt -------------------------------------------------------------------------

# 90% of the prompts in (0, 4096], 10% in (4096, 98304]: eight points evenly across each, 256,
# 768, ..., 3840 (11.25% each) and 9,984, 21,760, ..., 92,416 (1.25% each), whose mean is exactly
# 6963.2 (no rescaling).
UNSERVABLE_MIX: tuple[Bucket, ...] = ((4096.0, 90.0), (98304.0, 10.0))
UNSERVABLE_MEAN = 6963.2


def hand_miss(cost: PrefillCost, mix: LengthMix, token_rate_s: float, engines: int, target_s: float) -> float:
    """The share of the servable requests missing the target at `engines`, written out: the
    share waiting at all Erlang C's (the textbook sum; Poisson arrivals), the wait's scale the
    M/G/1 wait pooled over the engines times C/ρ, with every prompt's engine time (the
    unservable ones still load the engines), the exponential tail at each servable length's
    budget."""
    lengths = np.array([length for length, _ in mix.points])
    weights = np.array([w for _, w in mix.points])
    busy = np.array([cost.busy_s(length) for length in lengths])
    alone = np.array([cost.alone_s(length) for length in lengths])
    rate = token_rate_s / float(weights @ lengths)
    rho = rate * float(weights @ busy) / engines
    if rho >= 1:
        return 1.0
    offered = rho * engines
    last = offered**engines / math.factorial(engines) * engines / (engines - offered)
    waits = last / (sum(offered**k / math.factorial(k) for k in range(engines)) + last)
    mean_wait = rate * float(weights @ busy**2) / engines**2 / (2 * (1 - rho)) * waits / rho
    servable = alone <= target_s
    tails = waits * np.exp(-(target_s - alone[servable]) * waits / mean_wait)
    return float(weights[servable] @ tails / weights[servable].sum())


def test_an_unservable_share_is_counted_and_left_out(h200: PerfModel) -> None:
    settings = settings_for(h200, ("prefill",), ttft_target_ms=2000.0, bounds={"prefill": RoleBounds(1, 100)})
    cost = prior_of(h200, settings).prefill
    mix = LengthMix.from_histogram(list(UNSERVABLE_MIX), UNSERVABLE_MEAN, settings.quantile)
    assert [round(length) for length, _ in mix.points] == [256 + 512 * k for k in range(8)] + [
        9984 + 11776 * k for k in range(8)
    ]
    # A 57,088-token prompt takes more than 2 s alone; the longest that fits is 51,200 tokens:
    # the top four points of the long bucket, 5% of the requests, are unservable.
    assert cost.alone_s(57_088) > 2.0 > cost.alone_s(45_312)
    rate = 100_000.0  # prompt tokens/s: 14.4 req/s
    sizing = prefill_engines(cost, token_rate_s=rate, mix=mix, ttft_target_ms=2000.0, max_engines=100)
    assert sizing.longest_servable_tokens == 51200
    assert sizing.unservable_share == pytest.approx(0.05, rel=1e-9)
    assert sizing.meets_target is True
    # The count is what the servable 95% need: the first at which at most 1% of them miss.
    assert sizing.engines == 7
    assert (
        sizing.miss_share == pytest.approx(hand_miss(cost, mix, rate, 7, 2.0), rel=1e-9)
        and sizing.miss_share <= 0.01
    )
    assert hand_miss(cost, mix, rate, 6, 2.0) > 0.01
    # Counted in, the 5% that can only miss would exceed the 1% allowed at any count: the
    # search would run to max_replicas.
    assert sizing.unservable_share > 1 - settings.quantile

    # Driven: 14.4 req/s of that mix for a minute, prefill bounds 1 ... 100.
    run = Run(h200, settings, expected={"prefill": 1})
    per_tick = rate / UNSERVABLE_MEAN * TICK_S
    for _ in range(12):
        result = run.tick(per_tick, isl=UNSERVABLE_MEAN, buckets=UNSERVABLE_MIX)
    prefill = result.diagnostics["roles"]["prefill"]
    assert result.replicas == {"prefill": 7}
    assert prefill["unservable_share"] == 0.05
    assert prefill["unservable_rate_s"] == round(0.05 * rate / UNSERVABLE_MEAN, 3)
    assert prefill["longest_servable_tokens"] == 51200
    assert prefill["meets_target"] is True


def test_a_mix_of_only_unservable_prompts_still_gets_the_utilisation_bound(h200: PerfModel) -> None:
    cost = prior_of(h200, settings_for(h200, ("prefill",))).prefill
    # 16,000-token prompts against a 100 ms target: none fits alone (the longest is 4832). Every
    # request misses whatever the count, but the engines still have to compute them: not 0
    # engines, the utilisation bound, flagged.
    sizing = prefill_engines(
        cost, token_rate_s=500_000.0, mix=LengthMix.uniform(16_000.0), ttft_target_ms=100.0
    )
    assert sizing.unservable_share == 1.0
    bound = math.ceil(500_000.0 / (16_000.0 / cost.busy_s(16_000.0)) / 0.9)
    assert (sizing.engines, sizing.meets_target, sizing.miss_share) == (bound, False, 1.0)
    assert sizing.longest_servable_tokens == 4832
    assert sizing.utilisation == pytest.approx(500_000.0 / (16_000.0 / cost.busy_s(16_000.0)) / bound)
    assert sizing.utilisation <= 0.9


def test_prompts_the_correction_makes_unservable_are_left_out(h200: PerfModel) -> None:
    cost = prior_of(h200, settings_for(h200, ("prefill",))).prefill
    # 95% of 1000 tokens, 5% of 29,000 (0.965 s alone, 1.21 s at a correction of 0.8).
    points = ((1000.0, 0.95), (29_000.0, 0.05))
    mix = LengthMix(2400.0, 0.95 * 1000.0**2 + 0.05 * 29_000.0**2, 29_000.0, points)
    assert cost.alone_s(29_000) < 1.0 < cost.alone_s(29_000) / 0.8
    sizing = prefill_engines(
        cost, token_rate_s=50_000.0, mix=mix, ttft_target_ms=1000.0, max_engines=100, correction=0.8
    )
    # The correction divides the engine times: the longest servable is what fits 0.8 s alone.
    assert sizing.unservable_share == pytest.approx(0.05, rel=1e-9)
    assert sizing.longest_servable_tokens == cost.longest_within_s(0.8) < 29_000
    assert sizing.meets_target is True
    assert sizing.miss_share <= 0.01


# --- the busy check -------------------------------------------------------------------------------


def chunk_records(wall_ms: float, engines: int = 2, busy: float = 1.0) -> list[ForwardPassMetrics]:
    """Full 8192-token chunks filling `busy` of a tick on each of `engines` engines."""
    per_engine = int(busy * TICK_S * 1000.0 / wall_ms)
    return [
        prefill_record(wall_ms, CHUNK, queued_prompts=1, worker=f"p{e}")
        for e in range(engines)
        for _ in range(per_engine)
    ]


def busy_run(h200: PerfModel) -> Run:
    """Two prefill engines, two minutes of complete records at the model's own times (the
    prior's line for a full chunk, 169.1 ms): what they did is what the model says."""
    settings = settings_for(h200, ("prefill",))
    run = Run(h200, settings, expected={"prefill": 2})
    line_ms = prior_of(h200, settings).prefill.model.mean_ms(prefill_features(CHUNK, 0))
    for k in range(24):
        result = run.tick(100.0, fpm_new={"prefill": chunk_records(line_ms)}, complete={"prefill": True})
        if k > 0:  # from the second tick on: an interval to check over
            check = result.diagnostics["capacity_check"]
            # 29 chunks of 169.1 ms per engine in 5 s: 98.1% busy, as the model says.
            assert check["checked"] is True and check["busy"] == check["model_busy"] == 0.981
    assert run.state.correction == pytest.approx(1.0, abs=1e-6)
    return run


def test_engines_busier_than_the_model_says_lower_the_capacity(h200: PerfModel) -> None:
    run = busy_run(h200)
    before = run.tick(100.0).diagnostics["roles"]["prefill"]["capacity_tokens_s"]  # no records
    # The world slows: every chunk 1.5× what the model predicts (253.7 ms), the engines 99% busy.
    wall_ms = 1.5 * run.state.latency.prefill.iteration_ms(CHUNK)  # type: ignore[union-attr]
    records = chunk_records(wall_ms)
    corrections = []
    for _ in range(3):
        correction = run.state.correction
        result = run.tick(100.0, fpm_new={"prefill": records}, complete={"prefill": True})
        check = result.diagnostics["capacity_check"]
        assert check["checked"] is True
        assert check["busy"] > check["model_busy"]
        # By hand: the model's time for the same iterations (after learning them: the new
        # records are a small share of two minutes' worth) over their wall time, halfway.
        model_s = len(records) * run.state.latency.prefill.iteration_ms(CHUNK) / 1000.0  # type: ignore[union-attr]
        busy_s = len(records) * wall_ms / 1000.0
        assert check["busy"] == round(busy_s / (TICK_S * 2), 3)
        assert run.state.correction == pytest.approx(
            correction + 0.5 * (model_s / busy_s - correction), rel=1e-9
        )
        corrections.append(run.state.correction)
    assert corrections[0] < 1.0
    assert corrections == sorted(corrections, reverse=True)
    after = result.diagnostics["roles"]["prefill"]["capacity_tokens_s"]
    assert after < before / 1.3  # most of the 1.5× already, within three ticks


def test_no_busy_check_without_every_record_or_with_idle_engines(h200: PerfModel) -> None:
    run = busy_run(h200)
    wall_ms = 1.5 * run.state.latency.prefill.iteration_ms(CHUNK)  # type: ignore[union-attr]
    # Not every record of the interval: their wall times are not the engines' busy time.
    result = run.tick(100.0, fpm_new={"prefill": chunk_records(wall_ms)}, complete={"prefill": False})
    assert "capacity_check" not in result.diagnostics
    assert run.state.correction == pytest.approx(1.0, abs=1e-6)
    # Every record, but the engines 30% busy (below busy_check_min, 0.5): reported, not checked.
    result = run.tick(
        100.0, fpm_new={"prefill": chunk_records(wall_ms, busy=0.3)}, complete={"prefill": True}
    )
    check = result.diagnostics["capacity_check"]
    assert check["checked"] is False and check["busy"] < 0.5
    assert run.state.correction == pytest.approx(1.0, abs=1e-6)


# --- the saturation check (records not all there) -----------------------------------------------


_passes = iter(range(1, 1 << 30))


def queued_records(wall_ms: float, queued_prompts: int, engines: int = 2) -> list[ForwardPassMetrics]:
    """Each engine's latest full chunk, with `queued_prompts` prompts of 1000 tokens waiting; a new
    pass each call (its wall time differs from the last by a nanosecond or so)."""
    wall_ms *= 1 + 1e-9 * next(_passes)
    return [
        prefill_record(wall_ms, CHUNK, queued_prompts=queued_prompts, worker=f"p{e}") for e in range(engines)
    ]


def saturated_run(h200: PerfModel) -> tuple[Run, float, float]:
    """Two prefill engines, one record each per tick (not every record: no busy check), at the
    model's own time for a full chunk (held at two: the count is not what these tests watch);
    the first tick only records their queues."""
    settings = settings_for(h200, ("prefill",), bounds={"prefill": RoleBounds(2, 2)})
    run = Run(h200, settings, expected={"prefill": 2})
    line_ms = prior_of(h200, settings).prefill.iteration_ms(CHUNK)
    first = run.tick(100.0, fpm_new={"prefill": queued_records(line_ms, 30)}, latest=True)
    assert "capacity_check" not in first.diagnostics  # no queue before to compare with
    assert run.state.prefill_passes is not None and run.state.prefill_passes[0] == TICK_S
    return run, line_ms, first.diagnostics["roles"]["prefill"]["capacity_tokens_s"]


def test_saturated_engines_serving_less_than_the_model_says_lower_the_capacity(h200: PerfModel) -> None:
    run, line_ms, modelled = saturated_run(h200)
    # 30 prompts (30k tokens, more than a chunk) queued on each engine at both ends of every
    # interval: none idled, and what they served is what arrived. They serve 80% of the model's
    # capacity for the mix.
    per_tick = 0.8 * modelled * 2 * TICK_S / ISL
    for _ in range(3):
        before = run.state.correction
        result = run.tick(per_tick, fpm_new={"prefill": queued_records(line_ms, 30)}, latest=True)
        check = result.diagnostics["capacity_check"]
        assert check["checked"] is True
        assert check["served_tokens_s"] == round(per_tick * ISL / (2 * TICK_S), 1)
        assert check["model_tokens_s"] == pytest.approx(modelled, rel=0.01)
        ratio = (per_tick * ISL / (2 * TICK_S)) / check["model_tokens_s"]
        assert ratio == pytest.approx(0.8, rel=0.01)
        assert run.state.correction == pytest.approx(before + 0.5 * (ratio - before), rel=1e-3)
        # The sizing divides the engine times by the correction: the capacity it sizes with.
        capacity = result.diagnostics["roles"]["prefill"]["capacity_tokens_s"]
        assert capacity == pytest.approx(check["model_tokens_s"] * run.state.correction, rel=1e-3)
    assert run.state.correction == pytest.approx(0.825, abs=0.005)  # 1 -> 0.9 -> 0.85 -> 0.825


def test_no_saturation_check_where_an_engine_may_have_idled_or_the_engines_changed(h200: PerfModel) -> None:
    run, line_ms, modelled = saturated_run(h200)
    slow = 0.5 * modelled * 2 * TICK_S / ISL
    # One engine's queue below a chunk (8 prompts, 8,000 tokens) at the end: it may have idled.
    uneven = queued_records(line_ms, 30)[:1] + queued_records(line_ms, 8)[1:]
    result = run.tick(slow, fpm_new={"prefill": uneven}, latest=True)
    assert "capacity_check" not in result.diagnostics
    # ... and at the start of the next interval: still no check, whatever the end.
    result = run.tick(slow, fpm_new={"prefill": queued_records(line_ms, 30)}, latest=True)
    assert "capacity_check" not in result.diagnostics
    # A third engine ready since the queues were read: the count changed within the interval.
    run.expected = {"prefill": 3}
    three = queued_records(line_ms, 30, engines=3)
    result = run.tick(slow, fpm_new={"prefill": three}, latest=True)
    assert "capacity_check" not in result.diagnostics
    # The same passes again: no engine ran one in the interval (stalled, say, behind a decode
    # pool that takes no more), so what they served is not what they can serve.
    result = run.tick(slow, fpm_new={"prefill": three}, latest=True)
    assert "capacity_check" not in result.diagnostics
    assert run.state.correction == 1.0


def test_serving_more_than_the_model_says_never_raises_the_capacity(h200: PerfModel) -> None:
    run, line_ms, modelled = saturated_run(h200)
    # Twice the model's capacity served (a prefix cache serves prompt tokens it never computes):
    # checked, and the correction stays at 1.
    result = run.tick(
        2.0 * modelled * 2 * TICK_S / ISL, fpm_new={"prefill": queued_records(line_ms, 30)}, latest=True
    )
    check = result.diagnostics["capacity_check"]
    assert check["checked"] is True
    assert check["served_tokens_s"] == pytest.approx(2.0 * check["model_tokens_s"], rel=0.01)
    assert run.state.correction == 1.0


def test_the_busy_check_comes_first_when_every_record_is_there(h200: PerfModel) -> None:
    run = busy_run(h200)
    # Every record of the interval, and queues on both engines: the busy check reads the records.
    records = [
        prefill_record(r.wall_time_s * 1000.0, CHUNK, queued_prompts=30, worker=r.worker_id)
        for r in chunk_records(run.state.latency.prefill.iteration_ms(CHUNK))  # type: ignore[union-attr]
    ]
    for _ in range(2):
        result = run.tick(10.0, fpm_new={"prefill": records}, complete={"prefill": True}, latest=True)
        assert "busy" in result.diagnostics["capacity_check"]
        assert "served_tokens_s" not in result.diagnostics["capacity_check"]
