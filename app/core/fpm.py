"""ForwardPassMetrics (FPM): what an engine reports about one scheduler iteration.

The schema of Dynamo's `forward_pass_metrics.py` (reference notes §4.1), as plain data. On the
wire a record is the msgpack map of `as_wire()` (field names as keys, the way msgspec encodes a
default Struct), sent as the multipart message `(topic, 8-byte big-endian sequence, payload)`.
An idle heartbeat is an all-zero record with `wall_time_s == 0`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ScheduledRequestMetrics:
    """Work executed in this iteration."""

    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0  # tokens computed this step (the chunk)
    var_prefill_length: float = 0.0
    sum_prefill_kv_tokens: int = 0  # KV read but not computed (earlier chunks, prefix hits)
    num_decode_requests: int = 0
    sum_decode_kv_tokens: int = 0  # sum of the decoding requests' context lengths
    var_decode_kv_tokens: float = 0.0


@dataclass(frozen=True)
class QueuedRequestMetrics:
    """Requests waiting, not scheduled in this iteration."""

    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0
    var_prefill_length: float = 0.0
    num_decode_requests: int = 0
    sum_decode_kv_tokens: int = 0
    var_decode_kv_tokens: float = 0.0


@dataclass(frozen=True)
class ForwardPassMetrics:
    worker_id: str
    dp_rank: int
    wall_time_s: float  # 0.0 for an idle heartbeat
    scheduled: ScheduledRequestMetrics = field(default_factory=ScheduledRequestMetrics)
    queued: QueuedRequestMetrics = field(default_factory=QueuedRequestMetrics)

    @property
    def key(self) -> tuple[str, int]:
        return (self.worker_id, self.dp_rank)

    @property
    def is_heartbeat(self) -> bool:
        return self.wall_time_s == 0.0

    def as_wire(self) -> dict[str, Any]:
        """Dynamo's field names (`wall_time` in seconds, nested request metrics)."""
        return {
            "worker_id": self.worker_id,
            "dp_rank": self.dp_rank,
            "wall_time": self.wall_time_s,
            "scheduled_requests": vars(self.scheduled).copy(),
            "queued_requests": vars(self.queued).copy(),
        }
