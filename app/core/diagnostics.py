"""The tick record: what one tick saw and decided, typed, written by the core and read back by the
store, `/metrics`, the HTML report and the replay outputs by attribute.

Stored as JSON with a `version`. Rows written before the version existed (version 1, with no
`version` field) parse too: every field has a default and unknown keys are kept, so an old row
still renders and a reader never fails on a field it does not know.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

# 2: the record became a typed model (tick time as `at_s`; the load step's pending target as
# `issued_s`). 1: the untyped dicts before it.
DIAGNOSTICS_VERSION = 2


class _Record(BaseModel):
    # Keep what this version does not know (an older or newer writer's fields), never fail on it.
    model_config = ConfigDict(extra="allow")


class TickDiagnostics(_Record):
    version: int = 1
    at: str | None = None  # ISO time, set by the service (its clock); the core speaks seconds
    at_s: float | None = None
    deployment: str | None = None
    latest_decision_id: int | None = None
    latest_decision_status: str | None = None
    overrides: dict[str, int | None] | None = None
    bounds: dict[str, dict[str, int]] | None = None
    stages: list[dict[str, Any]] | None = None
    target: dict[str, int] | None = None
    throughput: dict[str, Any] | None = None
    load: dict[str, Any] | None = None
    sla: dict[str, Any] | None = None
    # Written by the shells around the tick: the FPM subscribers' counters or the embedder's
    # summary, what SLA scaling observed, the protocol's verdict and the decision it stored.
    fpm: dict[str, Any] | None = None
    traffic: dict[str, Any] | None = None
    expired_decision_id: int | None = None
    verdict: str | None = None
    decision_id: int | None = None

    def as_json(self) -> dict[str, Any]:
        """The stored form: JSON-ready, the fields this version writes (None included, so that a
        section that did not run reads as null, as before)."""
        return self.model_dump(mode="json")

    @classmethod
    def read(cls, record: dict[str, Any] | None) -> TickDiagnostics:
        """A stored record, of any version, as the model; an unreadable one as an empty record."""
        if not isinstance(record, dict):
            return cls()
        try:
            return cls.model_validate(record)
        except ValueError:
            return cls.model_construct(**record)
