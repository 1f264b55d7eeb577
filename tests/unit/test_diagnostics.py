"""The typed tick record: every field the core writes is declared (a renamed field would leave a
chart or a gauge silently empty), the stored JSON carries a version, and older rows still read."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from app.core.diagnostics import DIAGNOSTICS_VERSION, TickDiagnostics
from tests.unit.test_planner import _input, _planner


def undeclared(model: Any, path: str = "record") -> list[str]:
    """Every key the model holds without declaring it, at any depth."""
    if isinstance(model, BaseModel):
        found = [f"{path}.{k}" for k in (model.model_extra or {})]
        for name in type(model).model_fields:
            found += undeclared(getattr(model, name), f"{path}.{name}")
        return found
    if isinstance(model, dict):
        return [p for k, v in model.items() for p in undeclared(v, f"{path}[{k}]")]
    if isinstance(model, list):
        return [p for i, v in enumerate(model) for p in undeclared(v, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("algorithm", ["sla", "seed"])
def test_every_field_the_core_writes_is_declared(algorithm: str) -> None:
    planner = _planner(algorithm)
    sections: set[str] = set()
    for i in range(40):  # long enough for the learned headroom, a scale-up and a hold
        effects = planner.on_tick(_input(i))
        planner.commit(effects)
        record = effects.diagnostics
        assert undeclared(record) == [], f"tick {i}"
        # The stored JSON reads back as the same record.
        assert TickDiagnostics.read(record.as_json()) == record
        sections |= {name for name in ("sla", "throughput", "load") if getattr(record, name) is not None}
    assert sections == ({"sla"} if algorithm == "sla" else {"throughput", "load"})


def test_the_stored_record_carries_its_version() -> None:
    planner = _planner("sla")
    stored = planner.on_tick(_input(0)).diagnostics.as_json()
    assert stored["version"] == DIAGNOSTICS_VERSION == 2


def test_a_version_1_row_still_reads() -> None:
    """As the service stored them before the record was typed: no version, `at` only, the load
    step's pending target as an ISO time."""
    row = {
        "at": "2026-11-29T12:00:00+00:00",
        "deployment": "demo",
        "stages": [{"stage": "proposal", "replicas": None, "reason": "x"}],
        "target": None,
        "throughput": None,
        "sla": None,
        "load": {
            "reason": "scaling_in_progress",
            "pending": {"state": "waiting", "issued_at": "2026-11-29T11:59:00+00:00", "age_s": 60.0},
            "roles": {"prefill": {"engines": [{"engine": "p0:dp0", "queued_prefill_tokens": 5}]}},
        },
    }
    record = TickDiagnostics.read(row)
    assert record.version == 1
    assert record.at_s is None and record.at == "2026-11-29T12:00:00+00:00"
    assert record.load.pending.age_s == 60.0
    assert record.load.pending.model_extra == {"issued_at": "2026-11-29T11:59:00+00:00"}
    assert record.load.roles["prefill"].engines[0].queued_prefill_tokens == 5


def test_what_cannot_be_read_is_unknown_not_an_error() -> None:
    load = {"estimated_ttft_ms": "fast", "roles": {"p": {"engines": [None, {"x": 1}]}}}
    record = TickDiagnostics.read({"throughput": "x", "load": load})
    assert record.throughput is None
    assert record.load.estimated_ttft_ms is None
    assert record.load.roles["p"].engines == []
    assert TickDiagnostics.read(["not", "a", "record"]) == TickDiagnostics()
