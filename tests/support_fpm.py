"""ForwardPassMetrics records for tests: one builder with the fields the load tests vary."""

from __future__ import annotations

from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics


def fpm(
    worker: str = "w0",
    *,
    wall_s: float = 0.01,
    dp_rank: int = 0,
    prefill_tokens: int = 0,
    prefill_requests: int = 0,
    decode_kv: int = 0,
    decode_requests: int = 0,
    queued_prefill: int = 0,
    queued_decode_kv: int = 0,
) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id=worker,
        dp_rank=dp_rank,
        wall_time_s=wall_s,
        scheduled=ScheduledRequestMetrics(
            num_prefill_requests=prefill_requests,
            sum_prefill_tokens=prefill_tokens,
            num_decode_requests=decode_requests,
            sum_decode_kv_tokens=decode_kv,
        ),
        queued=QueuedRequestMetrics(sum_prefill_tokens=queued_prefill, sum_decode_kv_tokens=queued_decode_kv),
    )
