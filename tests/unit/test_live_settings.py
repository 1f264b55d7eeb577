"""Which settings change live, how a change merges over the stored ones, and how a bad one is
named (app/config/live.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from app.config import DeploymentConfig
from app.config.live import apply_overrides, live_values, merge_patch, sources_of
from app.core.errors import InvalidInputError


def deployment(**fields: Any) -> DeploymentConfig:
    return DeploymentConfig.model_validate(
        {
            "name": "demo",
            "connector": {"type": "virtual"},
            "sla": {"ttft_ms": 500, "itl_ms": 50},
            "prefill": {"min_replicas": 1, "max_replicas": 8},
            "decode": {"min_replicas": 1, "max_replicas": 8},
            **fields,
        }
    )


@dataclass(frozen=True)
class Merge:
    name: str
    stored: dict[str, Any]
    patch: dict[str, Any]
    merged: dict[str, Any]
    why: str


MERGES = [
    Merge(
        "a first change", {}, {"sla": {"ttft_ms": 400}}, {"sla": {"ttft_ms": 400}}, "a value sets the field"
    ),
    Merge(
        "a second change keeps the first",
        {"sla": {"ttft_ms": 400}},
        {"prefill": {"max_replicas": 4}},
        {"sla": {"ttft_ms": 400}, "prefill": {"max_replicas": 4}},
        "a merge patch names only what changes; the other stored overrides stay",
    ),
    Merge(
        "null returns a field to the file",
        {"sla": {"ttft_ms": 400, "itl_ms": 30}},
        {"sla": {"ttft_ms": None}},
        {"sla": {"itl_ms": 30}},
        "RFC 7386: null removes the member, so the file's value runs again",
    ),
    Merge(
        "a nested section",
        {},
        {"scaling": {"scale_to_zero": {"quiet_s": 900}}},
        {"scaling": {"scale_to_zero": {"quiet_s": 900}}},
        "scale to zero's settings are a section inside scaling",
    ),
]


@pytest.mark.parametrize("case", MERGES, ids=lambda c: c.name)
def test_a_change_merges_over_the_stored_overrides(case: Merge) -> None:
    assert merge_patch(case.stored, case.patch, deployment()) == case.merged, case.why


@dataclass(frozen=True)
class Refused:
    name: str
    patch: Any
    field: str
    message: str
    why: str


REFUSED = [
    Refused("not an object", [1], "body", "a JSON object", "a merge patch of a list means nothing here"),
    Refused("empty", {}, "body", "nothing to change", "an empty change would only bump the revision"),
    Refused(
        "unknown field",
        {"sla": {"ttft": 400}},
        "body.sla.ttft",
        "not a setting that changes live",
        "typos are errors",
    ),
    Refused(
        "not live",
        {"connector": {"type": "none"}},
        "body.connector",
        "not a setting that changes live",
        "the connector is a client built at start-up; changing it takes a restart",
    ),
    Refused(
        "a role the mode lacks",
        {"workers": {"max_replicas": 3}},
        "body.workers.max_replicas",
        "a disagg deployment has no workers role",
        "the mode decides the roles",
    ),
    Refused(
        "a section as a value", {"sla": 3}, "body.sla", "an object of the fields to change", "sections merge"
    ),
    Refused(
        "out of range",
        {"sla": {"ttft_ms": 0}},
        "body.sla.ttft_ms",
        "greater than 0",
        "as the file would refuse it",
    ),
    Refused(
        "min above max",
        {"prefill": {"min_replicas": 9}},
        "body.prefill.min_replicas",
        "min_replicas (9) is above max_replicas (8)",
        "the result is validated as a whole, against the file's other values",
    ),
    Refused(
        "a rule across sections",
        {"scaling": {"scale_to_zero": {"enabled": True}}},
        "body.scaling.scale_to_zero.enabled",
        "needs scaling.algorithm: sla",
        "the deployment's own rules apply to the changed whole",
    ),
    Refused(
        "an unknown choice",
        {"scaling": {"sizing": "fast"}},
        "body.scaling.sizing",
        "'headroom' or 'attainment'",
        "an enumerated setting names its choices",
    ),
]


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.name)
def test_a_bad_change_names_its_field(case: Refused) -> None:
    config = deployment()
    with pytest.raises(InvalidInputError) as caught:
        apply_overrides(config, merge_patch({}, case.patch, config))
    assert caught.value.field == case.field, case.why
    assert case.message in caught.value.detail, case.why


def test_the_running_values_and_where_each_comes_from() -> None:
    config = deployment()
    overrides = {"sla": {"ttft_ms": 400}, "decode": {"max_replicas": 3}}
    running = live_values(apply_overrides(config, overrides))
    assert running["sla"] == {"ttft_ms": 400, "itl_ms": 50, "attainment_target": 0.99}
    assert running["decode"] == {"min_replicas": 1, "max_replicas": 3}
    assert "workers" not in running  # a disagg deployment has no aggregated engines
    sources = sources_of(config, overrides)
    assert {p for p, s in sources.items() if s == "store"} == {"sla.ttft_ms", "decode.max_replicas"}
    assert sources["sla.itl_ms"] == "file"


def test_no_overrides_is_the_file_itself() -> None:
    config = deployment()
    assert apply_overrides(config, {}) is config
