"""What one engine can serve within the targets, by the FPM regressions (the reference's
`find_best_engine_*`): requests per second for prefill, decode and aggregated engines."""

from __future__ import annotations

from typing import NamedTuple

from app.core.seed.regression import (
    AggRegression,
    DecodeRegression,
    PrefillRegression,
    chunked_prefill_s,
    clamp_kv_hit_rate,
)

# Batch caps when neither the KV capacity nor a batch seen says more.
DEFAULT_DECODE_BATCH_CAP = 256
DEFAULT_AGG_BATCH_CAP = 1024


class PrefillCapacity(NamedTuple):
    engine_rps: float  # 0 = model not ready or invalid input
    ttft_ms: float


class DecodeCapacity(NamedTuple):
    engine_rps: float
    itl_ms: float


class AggCapacity(NamedTuple):
    engine_rps: float
    ttft_ms: float
    itl_ms: float


def best_prefill_rps(
    model: PrefillRegression,
    ttft_target_ms: float,
    isl_tokens: float,
    max_num_batched_tokens: int | None = None,
) -> PrefillCapacity:
    """Requests/s one engine prefills at this ISL: 1 / wall time of one (chunked) prefill. Linear
    in tokens, batching B requests takes B times as long, so the rate does not depend on B. An
    unreachable target is still answered (the TTFT says so): the caller scales on load."""
    if isl_tokens <= 0 or not model.ready:
        return PrefillCapacity(0.0, 0.0)
    if max_num_batched_tokens and max_num_batched_tokens > 0:
        wall_s = chunked_prefill_s(isl_tokens, max_num_batched_tokens, model.predict_wall_s)
    else:
        wall_s = model.predict_wall_s(isl_tokens)  # type: ignore[assignment]
    return PrefillCapacity(1.0 / wall_s, wall_s * 1000.0)  # type: ignore[operator]


def best_decode_rps(
    model: DecodeRegression,
    itl_target_ms: float,
    context_tokens: float,
    osl_tokens: float,
    max_kv_tokens: int | None = None,
    max_num_seqs: int | None = None,
) -> DecodeCapacity:
    """Requests/s one engine decodes within the ITL target: the largest batch whose predicted
    iteration fits, through Little's law (`batch / (osl * wall)`). Batch 1 over the target is
    still answered with its rate and ITL."""
    if context_tokens <= 0 or osl_tokens <= 0 or itl_target_ms <= 0 or not model.ready:
        return DecodeCapacity(0.0, 0.0)
    if max_kv_tokens and max_kv_tokens > 0:
        kv_cap = max(1, int(max_kv_tokens / context_tokens))
    elif model.max_kv_seen > 0:
        kv_cap = max(1, int(model.max_kv_seen / context_tokens))
    else:
        kv_cap = DEFAULT_DECODE_BATCH_CAP
    seq_cap = max_num_seqs if max_num_seqs and max_num_seqs > 0 else kv_cap
    best_bs, best_wall = 1, model.predict_wall_s(1.0, context_tokens)
    assert best_wall is not None
    if best_wall * 1000.0 <= itl_target_ms:
        # Binary search: the prediction grows with the batch (coefficients are >= 0).
        lo, hi = 1, max(1, min(kv_cap, seq_cap))
        while lo <= hi:
            mid = (lo + hi) // 2
            wall = model.predict_wall_s(float(mid), mid * context_tokens)
            assert wall is not None
            if wall * 1000.0 <= itl_target_ms:
                best_bs, best_wall, lo = mid, wall, mid + 1
            else:
                hi = mid - 1
    return DecodeCapacity(best_bs / (osl_tokens * best_wall), best_wall * 1000.0)


def best_agg_rps(
    model: AggRegression,
    isl_tokens: float,
    osl_tokens: float,
    max_num_batched_tokens: int,
    ttft_target_ms: float,
    itl_target_ms: float,
    max_kv_tokens: int | None = None,
    max_num_seqs: int | None = None,
    kv_hit_rate: float | None = None,
) -> AggCapacity:
    """Requests/s one engine serves within both targets: sweep the decode batch up from 1 and
    keep the last size meeting TTFT and ITL; the sweep stops where prefill admission can no
    longer keep up with decode egress (`isl / (mbt - batch) > osl`)."""
    mbt = max_num_batched_tokens
    if isl_tokens <= 0 or osl_tokens <= 0 or mbt <= 0 or not model.ready:
        return AggCapacity(0.0, 0.0, 0.0)
    effective_isl = isl_tokens * (1.0 - clamp_kv_hit_rate(kv_hit_rate))
    avg_ctx = isl_tokens + osl_tokens / 2.0  # KV residency uses the full ISL: hits save compute only
    if max_kv_tokens and max_kv_tokens > 0:
        kv_cap = max(1, int(max_kv_tokens / max(1.0, avg_ctx)))
    else:
        kv_cap = DEFAULT_AGG_BATCH_CAP
    seq_cap = max_num_seqs if max_num_seqs and max_num_seqs > 0 else kv_cap
    lo, hi = 1, max(1, min(kv_cap, seq_cap, mbt - 1))
    while lo < hi:  # largest batch with admission >= egress
        mid = (lo + hi + 1) // 2
        if mbt - mid > 0 and isl_tokens / (mbt - mid) <= osl_tokens:
            lo = mid
        else:
            hi = mid - 1
    best = AggCapacity(0.0, 0.0, 0.0)
    for bs in range(1, lo + 1):
        decode_kv = bs * avg_ctx
        prefill_per_iter = min(bs * effective_isl / max(1.0, osl_tokens), float(mbt))
        wall = model.predict_wall_s(prefill_per_iter, decode_kv)
        ttft = model.estimate_next_ttft(int(prefill_per_iter), mbt, int(decode_kv))
        assert wall is not None and ttft is not None
        itl_ms, ttft_ms = wall * 1000.0, ttft * 1000.0
        if itl_ms > itl_target_ms or ttft_ms > ttft_target_ms:
            if bs == 1:
                best = AggCapacity(1.0 / (osl_tokens * wall), ttft_ms, itl_ms)
            break
        best = AggCapacity(bs / (osl_tokens * wall), ttft_ms, itl_ms)
    return best
