"""ORM rows to response bodies."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter
from typing_extensions import TypedDict  # pydantic needs it for TypedDicts before Python 3.12

from app.api.schemas import AuditOut, DecisionOut, OverrideOut, TickOut
from app.store.models import AuditEntry, Decision, Override, Tick
from app.store.overrides import is_active


def decision_out(d: Decision) -> DecisionOut:
    return DecisionOut(
        id=d.decision_id,
        deployment=d.deployment,
        num_prefill=d.num_prefill,
        num_decode=d.num_decode,
        num_workers=d.num_workers,
        source=d.source,  # type: ignore[arg-type]
        reasons=list(d.reasons),
        created_at=d.created_at,
        status=d.status,  # type: ignore[arg-type]
        status_reason=d.status_reason,
        completed_at=d.completed_at,
        observed=d.observed,
        message=d.message,
        remove=d.remove,
        tick_id=d.tick_id,
        override_id=d.override_id,
    )


def encode_decision(d: Decision) -> bytes:
    """The JSON body of a decision, as GET /decisions/{id} sends it."""
    return decision_out(d).model_dump_json().encode()


def override_out(o: Override, now: datetime) -> OverrideOut:
    return OverrideOut(
        id=o.id,
        deployment=o.deployment,
        action=o.action,  # type: ignore[arg-type]
        params=dict(o.params),
        reason=o.reason,
        created_at=o.created_at,
        created_by=o.created_by,
        expires_at=o.expires_at,
        ended_at=o.ended_at,
        ended_reason=o.ended_reason,
        active=is_active(o, now),
    )


def tick_out(t: Tick) -> TickOut:
    return TickOut.model_validate(t, from_attributes=True)


def audit_out(a: AuditEntry) -> AuditOut:
    return AuditOut.model_validate(a, from_attributes=True)


# Decisions as GET /decisions writes them: straight from plain rows, with DecisionOut's fields
# as a TypedDict, so pydantic writes the same JSON without building and validating a model per
# decision (derived from DecisionOut, so the two cannot drift).
_DecisionDict = TypedDict(  # type: ignore[misc]
    "_DecisionDict", {name: field.annotation for name, field in DecisionOut.model_fields.items()}
)


class _PageDict(TypedDict):
    items: list[_DecisionDict]  # type: ignore[valid-type]
    next_cursor: int | None


_PAGE = TypeAdapter(_PageDict)
_DECISION_KEYS = tuple(DecisionOut.model_fields)


def encode_decision_page(rows: Sequence[Mapping[str, Any]], next_cursor: int | None) -> bytes:
    """The JSON of a DecisionPage, from rows of `store.decisions.DECISION_ROW_COLUMNS`."""
    items = [{key: row[key] for key in _DECISION_KEYS} for row in rows]
    return _PAGE.dump_json({"items": items, "next_cursor": next_cursor})


class ResponseCache:
    """Encoded response bodies by key, least recently used out beyond `max_bytes`. Thread-safe
    (sync routes run in the thread pool). The key must change whenever the body would: the
    decision pages key on the decisions' version (`store.decisions.decisions_version`)."""

    def __init__(self, max_bytes: int = 8 * 1024 * 1024) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._bodies: OrderedDict[Hashable, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> bytes | None:
        with self._lock:
            body = self._bodies.get(key)
            if body is not None:
                self._bodies.move_to_end(key)
            return body

    def put(self, key: Hashable, body: bytes) -> None:
        if len(body) > self._max_bytes:
            return
        with self._lock:
            old = self._bodies.pop(key, None)
            self._bytes += len(body) - (len(old) if old is not None else 0)
            self._bodies[key] = body
            while self._bytes > self._max_bytes:
                _, dropped = self._bodies.popitem(last=False)
                self._bytes -= len(dropped)
