"""ForwardPassMetrics (FPM): what an engine reports about one scheduler iteration.

The schema of Dynamo's `forward_pass_metrics.py` (reference notes §4.1), as plain data. On the
wire a record is the msgpack map of `as_wire()` (field names as keys, the way msgspec encodes a
default Struct), sent as the multipart message `(topic, 8-byte big-endian sequence, payload)`.
An idle heartbeat is an all-zero record with `wall_time_s == 0`.

`ForwardPassMetrics.from_wire` reads every form an engine may send:

- the map form (E2/E3 msgspec default): field names as keys; unknown keys (E4's `version`,
  `counter_id`, its extra nested fields) are ignored;
- the positional array form (msgspec `array_like`), nested structs as arrays in field order:
  E3 `[worker_id, dp_rank, wall_time, scheduled[7], queued[6]]` and
  E4 `[version, worker_id, dp_rank, counter_id, wall_time, scheduled[7+], queued[6+]]`, told
  apart by the type of the first element; trailing extra fields are ignored.

Anything else raises `ValueError` naming the field: a missing field, a wrong type (a bool is not
a count, a fractional count is not a count), a negative count or variance, a non-finite float.
An integer in a float field is accepted and made a float. Decoding is on the ingestion hot path
(one call per message, up to a hundred thousand per second), hence the unrolled checks below.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from operator import itemgetter
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

    @classmethod
    def heartbeat(cls, worker_id: str, dp_rank: int = 0) -> ForwardPassMetrics:
        """What an idle engine publishes: an all-zero record with no forward pass."""
        return cls(worker_id=worker_id, dp_rank=dp_rank, wall_time_s=0.0)

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

    @classmethod
    def from_wire(cls, obj: Any) -> ForwardPassMetrics:
        """A record from a decoded msgpack payload (map or positional array, E3 or E4).

        Raises `ValueError` with a short reason naming the field when anything is missing, of the
        wrong type, negative, or (for floats) not finite."""
        kind = type(obj)
        if kind is dict:
            try:
                worker_id, dp_rank, wall_time, scheduled, queued = _TOP_GET(obj)
            except KeyError as exc:
                raise ValueError(f"{exc.args[0]}: missing") from None
        elif kind is list or kind is tuple:
            head = obj[0] if obj else None
            if type(head) is str:  # E3: worker_id first
                if len(obj) < 5:
                    raise ValueError(f"array form: expected 5 fields, got {len(obj)}")
                worker_id, dp_rank, wall_time, scheduled, queued = obj[:5]
            elif type(head) is int:  # E4: version first
                if len(obj) < 7:
                    raise ValueError(f"array form (with version): expected 7 fields, got {len(obj)}")
                _, worker_id, dp_rank, _, wall_time, scheduled, queued = obj[:7]
            else:
                raise ValueError(
                    f"array form: first field must be worker_id (str) or version (int), got {_name(head)}"
                )
        else:
            raise ValueError(f"payload: expected a map or an array, got {_name(obj)}")

        if not (
            type(worker_id) is str
            and worker_id
            and type(dp_rank) is int
            and dp_rank >= 0
            and type(wall_time) is float
            and 0.0 <= wall_time < _inf  # also false for NaN
        ):
            worker_id, dp_rank, wall_time = _explain_top(worker_id, dp_rank, wall_time)
        record = _new(cls)
        _set(
            record,
            "__dict__",
            {
                "worker_id": worker_id,
                "dp_rank": dp_rank,
                "wall_time_s": wall_time,
                "scheduled": _read_scheduled(scheduled),
                "queued": _read_queued(queued),
            },
        )
        return record


# --- decoding helpers -----------------------------------------------------------------------------
#
# Hand-unrolled on purpose: one `type(x) is int and x >= 0` per field and one dict per instance
# cost a third of a generic loop over the fields, and `_new` + `__dict__` skips a frozen
# dataclass' `__init__`, which pays an `object.__setattr__` per field. The slow path
# (`_explain`) only runs when the fast check fails: it names the bad field or coerces integers
# in float fields (an encoder may write 0 for 0.0).

_new = object.__new__
_set = object.__setattr__
_inf = math.inf
_isfinite = math.isfinite
_TOP_GET = itemgetter("worker_id", "dp_rank", "wall_time", "scheduled_requests", "queued_requests")
_SCHEDULED_NAMES = tuple(f.name for f in fields(ScheduledRequestMetrics))
_QUEUED_NAMES = tuple(f.name for f in fields(QueuedRequestMetrics))
_SCHEDULED_GET = itemgetter(*_SCHEDULED_NAMES)
_QUEUED_GET = itemgetter(*_QUEUED_NAMES)


def _name(value: Any) -> str:
    return "nil" if value is None else type(value).__name__


def _values(raw: Any, get: Callable[[dict], tuple[Any, ...]], size: int, where: str) -> Sequence[Any]:
    """The nested struct's values in field order, from its map or array form."""
    kind = type(raw)
    if kind is dict:
        try:
            return get(raw)
        except KeyError as exc:
            raise ValueError(f"{where}.{exc.args[0]}: missing") from None
    if kind is list or kind is tuple:
        if len(raw) < size:
            raise ValueError(f"{where}: expected {size} fields, got {len(raw)}")
        return raw[:size]
    raise ValueError(f"{where}: expected a map or an array, got {_name(raw)}")


def _read_scheduled(raw: Any) -> ScheduledRequestMetrics:
    a, b, c, d, e, f, g = _values(raw, _SCHEDULED_GET, 7, "scheduled_requests")
    if not (
        type(a) is int
        and a >= 0
        and type(b) is int
        and b >= 0
        and type(c) is float
        and 0.0 <= c < _inf  # also false for NaN
        and type(d) is int
        and d >= 0
        and type(e) is int
        and e >= 0
        and type(f) is int
        and f >= 0
        and type(g) is float
        and 0.0 <= g < _inf
    ):
        a, b, c, d, e, f, g = _explain(ScheduledRequestMetrics, "scheduled_requests", (a, b, c, d, e, f, g))
    inst = _new(ScheduledRequestMetrics)
    _set(
        inst,
        "__dict__",
        {
            "num_prefill_requests": a,
            "sum_prefill_tokens": b,
            "var_prefill_length": c,
            "sum_prefill_kv_tokens": d,
            "num_decode_requests": e,
            "sum_decode_kv_tokens": f,
            "var_decode_kv_tokens": g,
        },
    )
    return inst


def _read_queued(raw: Any) -> QueuedRequestMetrics:
    a, b, c, d, e, f = _values(raw, _QUEUED_GET, 6, "queued_requests")
    if not (
        type(a) is int
        and a >= 0
        and type(b) is int
        and b >= 0
        and type(c) is float
        and 0.0 <= c < _inf
        and type(d) is int
        and d >= 0
        and type(e) is int
        and e >= 0
        and type(f) is float
        and 0.0 <= f < _inf
    ):
        a, b, c, d, e, f = _explain(QueuedRequestMetrics, "queued_requests", (a, b, c, d, e, f))
    inst = _new(QueuedRequestMetrics)
    _set(
        inst,
        "__dict__",
        {
            "num_prefill_requests": a,
            "sum_prefill_tokens": b,
            "var_prefill_length": c,
            "num_decode_requests": d,
            "sum_decode_kv_tokens": e,
            "var_decode_kv_tokens": f,
        },
    )
    return inst


def _explain(cls: type, where: str, values: tuple[Any, ...]) -> list[Any]:
    """Field by field: raise naming the first bad one, or return the values, coerced."""
    return [
        _count(value, f"{where}.{f.name}") if f.type == "int" else _nonneg_float(value, f"{where}.{f.name}")
        for f, value in zip(fields(cls), values, strict=True)
    ]


def _count(value: Any, where: str) -> int:
    if type(value) is not int:
        raise ValueError(f"{where}: expected an integer, got {_name(value)}")
    if value < 0:
        raise ValueError(f"{where}: negative ({value})")
    return value


def _nonneg_float(value: Any, where: str) -> float:
    if type(value) is not float and type(value) is not int:
        raise ValueError(f"{where}: expected a number, got {_name(value)}")
    if not _isfinite(value):
        raise ValueError(f"{where}: not finite ({value})")
    if value < 0:
        raise ValueError(f"{where}: negative ({value})")
    return float(value)


def _explain_top(worker_id: Any, dp_rank: Any, wall_time: Any) -> tuple[str, int, float]:
    if type(worker_id) is not str:
        raise ValueError(f"worker_id: expected a string, got {_name(worker_id)}")
    if not worker_id:
        raise ValueError("worker_id: empty")
    return worker_id, _count(dp_rank, "dp_rank"), _nonneg_float(wall_time, "wall_time")
