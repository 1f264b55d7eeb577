"""Request traces as plain data, and their aggregation into per-interval traffic observations.

A trace is a list of `TraceRequest`s (arrival time relative to the trace's first request, input
and output length). `bucket_requests` turns it into the `TrafficObservation`s the throughput
predictors are warmed with, the way Dynamo's `offline/trace_data.py` does: bucket index
`floor(arrival_s / interval_s)`, per bucket the request count and the mean ISL and OSL, and the
empty buckets between the first and the last request emitted too. An empty bucket has
`num_req = 0` and `isl = osl = None` (no requests, so no mean: unknown, not zero tokens).

Reading trace files is I/O and lives in `app/sources/traces.py`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from app.core.types import TrafficObservation


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: when it arrived (seconds after the trace's first request) and its
    prompt and generated lengths."""

    arrival_s: float
    isl_tokens: int
    osl_tokens: int


def bucket_requests(requests: Iterable[TraceRequest], interval_s: float) -> list[TrafficObservation]:
    """Per-interval request count and mean ISL/OSL, from the first non-empty interval to the last.

    Every observation has `duration_s = interval_s`, including the last one, which usually covers
    only part of its interval (the trace ends where its last request arrived). No requests give
    an empty list.
    """
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise ValueError(f"interval_s must be a positive finite number, got {interval_s!r}")

    # bucket index -> [count, sum isl, sum osl]
    sums: dict[int, list[int]] = {}
    for i, request in enumerate(requests):
        if not (math.isfinite(request.arrival_s) and request.arrival_s >= 0):
            raise ValueError(f"request {i}: arrival_s must be finite and >= 0, got {request.arrival_s!r}")
        if request.isl_tokens < 0 or request.osl_tokens < 0:
            raise ValueError(
                f"request {i}: token counts must be >= 0, got isl_tokens={request.isl_tokens}, "
                f"osl_tokens={request.osl_tokens}"
            )
        index = int(request.arrival_s // interval_s)
        bucket = sums.setdefault(index, [0, 0, 0])
        bucket[0] += 1
        bucket[1] += request.isl_tokens
        bucket[2] += request.osl_tokens

    if not sums:
        return []
    observations: list[TrafficObservation] = []
    for index in range(min(sums), max(sums) + 1):
        count, isl_sum, osl_sum = sums.get(index, (0, 0, 0))
        observations.append(
            TrafficObservation(
                duration_s=interval_s,
                num_req=float(count),
                isl=isl_sum / count if count else None,
                osl=osl_sum / count if count else None,
            )
        )
    return observations
