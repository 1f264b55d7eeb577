"""`ForwardPassMetrics.from_wire`: every form an engine may send, and every way it can be wrong."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest

from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics
from tests.fpm_publisher import as_e3_array, as_e4_array, heartbeat, make_record

RECORD = make_record("engine-a", 7, dp_rank=2)


def wire_roundtrip(obj: Any) -> Any:
    """What the subscriber hands `from_wire`: the payload after msgpack, decoded as it decodes."""
    return msgpack.unpackb(msgpack.packb(obj), raw=False, strict_map_key=False)


# --- accepted forms -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [RECORD, make_record("w", 0), make_record("w-💡", 123_456_789), heartbeat("idle", 3)],
    ids=["record", "first", "unicode-and-large", "heartbeat"],
)
def test_round_trip_through_as_wire_and_msgpack(record: ForwardPassMetrics) -> None:
    decoded = ForwardPassMetrics.from_wire(wire_roundtrip(record.as_wire()))
    assert decoded == record
    assert hash(decoded) == hash(record)
    assert decoded.is_heartbeat == record.is_heartbeat


def test_from_wire_of_the_python_map_without_msgpack() -> None:
    assert ForwardPassMetrics.from_wire(RECORD.as_wire()) == RECORD


def test_e3_array_form() -> None:
    assert ForwardPassMetrics.from_wire(wire_roundtrip(as_e3_array(RECORD))) == RECORD


def test_e4_array_form_with_version_counter_and_extra_nested_fields() -> None:
    payload = wire_roundtrip(as_e4_array(RECORD, counter_id=991))
    assert payload[0] == 1 and len(payload[5]) == 11  # version first, 4 extra scheduled fields
    assert ForwardPassMetrics.from_wire(payload) == RECORD


def test_array_forms_accept_tuples_and_trailing_fields() -> None:
    e3 = as_e3_array(RECORD)
    e3_tuples = (*e3[:3], tuple(e3[3]), tuple([*e3[4], 99]), "a future field")
    assert ForwardPassMetrics.from_wire(e3_tuples) == RECORD


def test_map_form_ignores_unknown_keys() -> None:
    wire = RECORD.as_wire()
    wire.update(version=1, counter_id=42, future={"x": 1})
    wire["scheduled_requests"].update(
        sum_prefill_tokens_prefix_cached=5, var_non_prefix_cached_prefill_length=1.0
    )
    wire["queued_requests"]["something_new"] = "ignored"
    assert ForwardPassMetrics.from_wire(wire_roundtrip(wire)) == RECORD


def test_nested_structs_may_mix_forms() -> None:
    wire = RECORD.as_wire()
    wire["queued_requests"] = list(wire["queued_requests"].values())
    assert ForwardPassMetrics.from_wire(wire) == RECORD


def test_integers_in_float_fields_become_floats() -> None:
    """msgpack keeps 0 and 0.0 apart; an encoder may write a whole-number float as an int."""
    wire = heartbeat("idle").as_wire()
    wire["wall_time"] = 0
    wire["scheduled_requests"]["var_prefill_length"] = 4
    wire["queued_requests"]["var_decode_kv_tokens"] = 0
    decoded = ForwardPassMetrics.from_wire(wire_roundtrip(wire))
    assert decoded.is_heartbeat
    for value in (
        decoded.wall_time_s,
        decoded.scheduled.var_prefill_length,
        decoded.queued.var_decode_kv_tokens,
    ):
        assert type(value) is float
    assert decoded.scheduled.var_prefill_length == 4.0


def test_decoded_records_are_real_frozen_dataclasses() -> None:
    """from_wire skips the dataclass `__init__` for speed; the result must not differ."""
    decoded = ForwardPassMetrics.from_wire(RECORD.as_wire())
    assert type(decoded.scheduled) is ScheduledRequestMetrics
    assert type(decoded.queued) is QueuedRequestMetrics
    assert dataclasses.asdict(decoded) == dataclasses.asdict(RECORD)
    assert repr(decoded) == repr(RECORD)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.dp_rank = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.scheduled.sum_prefill_tokens = 0  # type: ignore[misc]
    assert decoded.key == ("engine-a", 2)


def test_the_input_is_not_modified() -> None:
    wire = RECORD.as_wire()
    before = copy.deepcopy(wire)
    ForwardPassMetrics.from_wire(wire)
    assert wire == before


# --- rejected payloads ----------------------------------------------------------------------------


Mutation = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class Bad:
    name: str
    mutate: Mutation  # the valid wire map in, the bad payload out
    error: str  # a substring of the ValueError's message (names the field)
    why: str


def _set(path: str, value: Any) -> Mutation:
    def mutate(wire: dict[str, Any]) -> Any:
        *parents, leaf = path.split(".")
        target = wire
        for key in parents:
            target = target[key]
        target[leaf] = value
        return wire

    return mutate


def _drop(path: str) -> Mutation:
    def mutate(wire: dict[str, Any]) -> Any:
        *parents, leaf = path.split(".")
        target = wire
        for key in parents:
            target = target[key]
        del target[leaf]
        return wire

    return mutate


def _e3(change: Callable[[list[Any]], Any]) -> Mutation:
    def mutate(wire: dict[str, Any]) -> Any:
        return change(as_e3_array(RECORD))

    return mutate


def _e4(change: Callable[[list[Any]], Any]) -> Mutation:
    def mutate(wire: dict[str, Any]) -> Any:
        return change(as_e4_array(RECORD))

    return mutate


S = "scheduled_requests"
Q = "queued_requests"

CASES = [
    Bad(
        "integer-payload", lambda w: 42, "payload: expected a map or an array, got int", "msgpack of a scalar"
    ),
    Bad("string-payload", lambda w: "fpm", "expected a map or an array, got str", "msgpack of a scalar"),
    Bad("nil-payload", lambda w: None, "got nil", "msgpack nil"),
    Bad("empty-array", lambda w: [], "array form: first field", "nothing to tell E3 from E4 by"),
    Bad(
        "array-first-field-float", _e3(lambda a: [1.5, *a[1:]]), "worker_id (str) or version (int)", "neither"
    ),
    Bad("e3-array-too-short", _e3(lambda a: a[:4]), "array form: expected 5 fields, got 4", "queued missing"),
    Bad("e4-array-too-short", _e4(lambda a: a[:6]), "expected 7 fields, got 6", "queued missing"),
    Bad("missing-worker-id", _drop("worker_id"), "worker_id: missing", "E3 map without the key"),
    Bad("missing-dp-rank", _drop("dp_rank"), "dp_rank: missing", "E3 map without the key"),
    Bad("missing-wall-time", _drop("wall_time"), "wall_time: missing", "the internal name is wall_time_s"),
    Bad("missing-queued", _drop(Q), "queued_requests: missing", "nested struct absent"),
    Bad(
        "only-identity-fields", lambda w: {"worker_id": "w", "dp_rank": 0}, ": missing", "a truncated record"
    ),
    Bad("worker-id-int", _set("worker_id", 17), "worker_id: expected a string, got int", "Dynamo sends str"),
    Bad("worker-id-empty", _set("worker_id", ""), "worker_id: empty", "no engine to key it by"),
    Bad("worker-id-bytes", _set("worker_id", b"w"), "worker_id: expected a string, got bytes", "bin type"),
    Bad("dp-rank-negative", _set("dp_rank", -1), "dp_rank: negative (-1)", "ranks start at 0"),
    Bad("dp-rank-bool", _set("dp_rank", True), "dp_rank: expected an integer, got bool", "bool is no count"),
    Bad(
        "dp-rank-float", _set("dp_rank", 1.0), "dp_rank: expected an integer, got float", "msgspec rejects it"
    ),
    Bad("wall-time-nan", _set("wall_time", math.nan), "wall_time: not finite (nan)", "poisons regressions"),
    Bad("wall-time-inf", _set("wall_time", math.inf), "wall_time: not finite (inf)", "poisons regressions"),
    Bad("wall-time-negative", _set("wall_time", -0.01), "wall_time: negative", "a duration"),
    Bad("wall-time-string", _set("wall_time", "0.01"), "wall_time: expected a number, got str", "type"),
    Bad("wall-time-bool", _set("wall_time", False), "wall_time: expected a number, got bool", "type"),
    Bad("scheduled-string", _set(S, "x"), "scheduled_requests: expected a map or an array, got str", "type"),
    Bad("scheduled-nil", _set(S, None), "scheduled_requests: expected a map or an array, got nil", "type"),
    Bad(
        "scheduled-missing-field",
        _drop(f"{S}.sum_decode_kv_tokens"),
        "scheduled_requests.sum_decode_kv_tokens: missing",
        "an older engine without the field",
    ),
    Bad(
        "scheduled-array-too-short",
        _set(S, [1, 2, 3.0]),
        "scheduled_requests: expected 7 fields, got 3",
        "positional struct truncated",
    ),
    Bad(
        "scheduled-negative-count",
        _set(f"{S}.num_prefill_requests", -1),
        "scheduled_requests.num_prefill_requests: negative (-1)",
        "counts are never negative",
    ),
    Bad(
        "scheduled-fractional-count",
        _set(f"{S}.sum_prefill_tokens", 1.5),
        "scheduled_requests.sum_prefill_tokens: expected an integer, got float",
        "tokens are whole",
    ),
    Bad(
        "scheduled-bool-count",
        _set(f"{S}.num_decode_requests", True),
        "scheduled_requests.num_decode_requests: expected an integer, got bool",
        "bool is no count",
    ),
    Bad(
        "scheduled-variance-nan",
        _set(f"{S}.var_prefill_length", math.nan),
        "scheduled_requests.var_prefill_length: not finite",
        "poisons regressions",
    ),
    Bad(
        "scheduled-variance-negative",
        _set(f"{S}.var_decode_kv_tokens", -1.0),
        "scheduled_requests.var_decode_kv_tokens: negative",
        "a variance",
    ),
    Bad(
        "scheduled-variance-string",
        _set(f"{S}.var_decode_kv_tokens", "1"),
        "scheduled_requests.var_decode_kv_tokens: expected a number, got str",
        "type",
    ),
    Bad(
        "queued-negative-count",
        _set(f"{Q}.sum_prefill_tokens", -5),
        "queued_requests.sum_prefill_tokens: negative (-5)",
        "queue depth is never negative",
    ),
    Bad(
        "queued-variance-inf",
        _set(f"{Q}.var_decode_kv_tokens", math.inf),
        "queued_requests.var_decode_kv_tokens: not finite (inf)",
        "poisons regressions",
    ),
    Bad(
        "queued-array-too-short",
        _set(Q, [0, 0, 0.0, 0, 0]),
        "queued_requests: expected 6 fields, got 5",
        "positional struct truncated",
    ),
    Bad(
        "e4-nested-negative",
        _e4(lambda a: [*a[:5], [-1, *a[5][1:]], a[6]]),
        "scheduled_requests.num_prefill_requests: negative",
        "the array form is checked as strictly as the map form",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_malformed_payloads_are_rejected_naming_the_field(case: Bad) -> None:
    payload = case.mutate(RECORD.as_wire())
    with pytest.raises(ValueError) as excinfo:
        ForwardPassMetrics.from_wire(wire_roundtrip(payload))
    assert case.error in str(excinfo.value), case.why


def test_the_first_bad_field_is_named() -> None:
    wire = RECORD.as_wire()
    wire[S]["sum_prefill_tokens"] = -1
    wire[S]["var_decode_kv_tokens"] = math.nan
    with pytest.raises(ValueError, match=r"^scheduled_requests\.sum_prefill_tokens: negative"):
        ForwardPassMetrics.from_wire(wire)
