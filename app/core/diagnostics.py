"""The tick record: what one tick saw and decided, typed, written by the core and read back by the
store, `/metrics`, the HTML report and the replay outputs by attribute.

Stored as JSON with a `version`. Every field has a default and is read leniently, so a row of any
version renders: version 1 rows (before the record was typed, no `version` field), a newer
writer's unknown keys (kept as extras), and values that are not what they should be (a number
that is text, an engine row that is not a mapping) read as unknown (None, or left out) instead of
failing the page. The core's own sections are checked strictly by the tests instead: a field the
core writes and this model does not declare shows up in `model_extra` (tests/unit/test_diagnostics.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

# 2: typed (tick time as `at_s`, the load step's pending target as `issued_s`). 1: untyped dicts.
DIAGNOSTICS_VERSION = 2


def finite_number(value: Any) -> int | float | None:
    """A number a record may hold: an int or a finite float, never a bool; anything else is
    unknown (None). The readers of stored records use it for what is not a typed field."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _counts(value: Any) -> dict[str, int] | None:
    """A replica map {role: count}; anything else (or a non-integer count) is unknown."""
    if not isinstance(value, Mapping):
        return None
    out = {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}
    return out if len(out) == len(value) else None


def _mapping(value: Any) -> Any:
    """A section that is not a mapping (nor already the model) is unknown."""
    return value if isinstance(value, Mapping | BaseModel) else None


Num = Annotated[int | float | None, BeforeValidator(finite_number)]
Text = Annotated[str | None, BeforeValidator(_text)]
Flag = Annotated[bool | None, BeforeValidator(_flag)]
Counts = Annotated[dict[str, int] | None, BeforeValidator(_counts)]


class Record(BaseModel):
    # Keep what this version does not know (an older or newer writer's fields), never fail on it.
    model_config = ConfigDict(extra="allow")


def _section(model: type[Record]) -> Any:
    return Annotated[model | None, BeforeValidator(_mapping)]


def _sections(model: type[Record]) -> Any:
    """{name: section}, the sections that are not mappings left out."""

    def keep(value: Any) -> Any:
        if not isinstance(value, Mapping):
            return None
        return {str(k): v for k, v in value.items() if isinstance(v, Mapping | BaseModel)}

    return Annotated[dict[str, model] | None, BeforeValidator(keep)]


# --- throughput scaling --------------------------------------------------------------------------


class ObservedTraffic(Record):
    duration_s: Num = None
    num_req: Num = None
    isl: Num = None
    osl: Num = None
    ttft_ms: Num = None
    itl_ms: Num = None
    request_duration_s: Num = None
    queued_requests: Num = None  # the frontend's gauges at the window's end
    inflight_requests: Num = None


class Correction(Record):
    prefill: Num = None
    decode: Num = None
    notes: list[str] = Field(default_factory=list)


class Forecast(Record):
    num_req: Num = None
    isl: Num = None
    osl: Num = None
    notes: list[str] = Field(default_factory=list)


class Interpolated(Record):
    prefill_thpt_per_gpu: Num = None
    decode_thpt_per_gpu: Num = None
    expected_ttft_ms: Num = None
    expected_itl_ms: Num = None
    decode_kv_usage: Num = None


class ThroughputDiagnostics(Record):
    reason: Text = None
    detail: Text = None
    observed: _section(ObservedTraffic) = None
    observation_error: Text = None
    correction: _section(Correction) = None
    predicted: _section(Forecast) = None
    interpolated: _section(Interpolated) = None
    raw_replicas: Counts = None


# --- load scaling --------------------------------------------------------------------------------


class EngineRow(Record):
    engine: str
    heartbeat: Flag = None
    queued_prefill_tokens: Num = None
    scheduled_decode_kv_tokens: Num = None
    queued_decode_kv_tokens: Num = None
    estimated_ttft_ms: Num = None
    estimated_itl_ms: Num = None
    post_queued_prefill_tokens: Num = None
    post_ttft_ms: Num = None
    post_queue_ttft_ms: Num = None
    post_own_ttft_ms: Num = None
    post_queue_budget_ms: Num = None
    post_kv_tokens: Num = None
    post_itl_ms: Num = None


class LoadChecks(Record):
    consolidation_factor: Num = None
    max_kv_tokens: Num = None
    own_ttft_ms: Num = None
    queue_budget_ms: Num = None
    ttft_wants: Num = None
    itl_wants: Num = None


class LoadRole(Record):
    reason: Text = None
    detail: Text = None
    current: Num = None
    load_wants: Num = None
    throughput_floor: Num = None
    final: Num = None
    engines: list[EngineRow] = Field(default_factory=list)
    checks: _section(LoadChecks) = None

    @field_validator("engines", mode="before")
    @classmethod
    def _named_rows(cls, rows: Any) -> list[Any]:
        """Rows an engine could not have sent (not a mapping, no name) are left out."""
        if not isinstance(rows, list):
            return []
        return [r for r in rows if isinstance(r, Mapping) and isinstance(r.get("engine"), str)]


class LoadTargets(Record):
    ttft_ms: Num = None
    itl_ms: Num = None
    sensitivity: Num = None


class RegressionState(Record):
    observations: Num = None
    min_observations: Num = None
    max_samples: Num = None
    ready: Flag = None
    not_ready_reason: Text = None
    # Keyed by the model's features (`<feature>_s`): a mapping, not fields.
    coefficients: dict[str, Any] | None = None
    averages: dict[str, Any] | None = None
    axis_bounds: dict[str, Any] | None = None
    buckets_in_use: Num = None
    heartbeats_ignored: Num = None
    invalid_ignored: Num = None


class PendingRole(Record):
    target: Num = None
    ready: Num = None


class LoadPending(Record):
    state: Text = None
    target: Counts = None
    issued_s: Num = None
    age_s: Num = None
    expiry_s: Num = None
    roles: _sections(PendingRole) = None


class LoadDiagnostics(Record):
    reason: Text = None
    detail: Text = None
    mode: Text = None
    current: Counts = None
    targets: _section(LoadTargets) = None
    throughput_floor: Counts = None
    kv_hit_rate: Num = None
    estimated_ttft_ms: Num = None
    estimated_itl_ms: Num = None
    models: _sections(RegressionState) = None
    pending: _section(LoadPending) = None
    roles: _sections(LoadRole) = None
    final: Counts = None


# --- SLA scaling ---------------------------------------------------------------------------------


class SlaDemand(Record):
    request_rate_s: Num = None
    token_rate_s: Num = None
    in_flight_mean: Num = None
    in_flight: Num = None
    dispersion: Num = None
    growth: list[float] | None = None  # (prompt tokens, decode requests)
    growth_learned: Flag = None
    growth_neighbours: list[float] | None = None
    growth_regression: list[float] | None = None
    growth_regression_ceiling: list[float] | None = None
    ramp_per_s: list[float] | None = None
    ramp_growth_per_s: list[float] | None = None  # a steady rise's growth rates (None: no ramp)
    surge: list[float] | None = None  # a rise under way: [lasted s, request rate carried to]
    isl_mean: Num = None
    isl_quantile: Num = None
    osl_mean: Num = None
    # The share of prompt tokens prefill computes (the rest read from a prefix cache), and whether
    # the tick had every prefill pass to measure it by (app/core/sla/computed.py).
    computed_share: Num = None
    computed_share_measured: Flag = None


class SlaRole(Record):
    reason: Text = None
    hold: Text = None
    needed: Num = None
    wish: Num = None
    # prefill (in prompt tokens; each prompt costs what its computed_share takes, computed.py)
    computed_share: Num = None
    utilisation: Num = None
    wait_s: Num = None
    service_s: Num = None
    capacity_tokens_s: Num = None
    queued_tokens: Num = None
    stuck_tokens: Num = None  # queued beyond what the engine holding them clears within the lead
    backlog_growth_tokens: Num = None  # what the queue gains before engines ordered now serve
    backlog_tokens_s: Num = None
    meets_target: Flag = None
    miss_share: Num = None  # of the servable requests, expected to miss the TTFT target
    unservable_share: Num = None  # requests whose prefill alone exceeds the target
    unservable_rate_s: Num = None
    longest_servable_tokens: Num = None
    # decode
    batch_limit: Num = None
    in_flight_at_target: Num = None
    backlog_in_flight: Num = None  # of those, the prompts prefill's backlog drain sends
    held_now: Num = None
    held_context_tokens: Num = None  # mean context of the requests decode holds now (FPM)
    window_context_tokens: Num = None  # ... held over the trend window: what the batch is sized at
    held_batch_limit: Num = None  # the batch at the held requests' own context
    floor_scale: Num = None  # the batch-weighted measured/profile decode time the floor scales by
    pace: Num = None  # Little's law's ITL over the target: 1, or a KV- or max_num_seqs-bound full engine's
    # attainment sizing (app/core/sla/decide.py)
    up: Num = None  # the count for the scenarios a lead ahead
    keep: Num = None  # the count for the scenarios from now to a lead ahead
    keep_held: Flag = None  # the keep horizon leans on the forecast's prior: nothing lowered
    needed_now: Num = None  # the count for the level now alone
    # expected attainment of the count over the up scenarios (queue model), of every request: a
    # prompt no count serves is a miss (prefill's unservable_share)
    attainment: Num = None
    attainment_one_fewer: Num = None  # ... of one engine fewer
    gpus_one_more: Num = None  # GPUs one more engine takes


class LatencyModel(Record):
    """One role's learned iteration cost (app/core/sla/latency.py)."""

    records: Num = None  # forward passes learned from, ever
    weight: Num = None  # their weight now, faded
    coefficients: list[float] | None = None  # ms per (1, scaled features)
    range: list[float] | None = None  # the largest scaled features of the data
    packs_prompts: Flag = None  # prefill
    learned_now: Num = None


class CapacityCheck(Record):
    busy: Num = None  # prefill engines' measured busy share over the tick
    model_busy: Num = None  # the share the model says the same work takes
    # Without every record (check_saturated): what saturated engines served, per engine, and the
    # model's capacity for the mix.
    served_tokens_s: Num = None
    model_tokens_s: Num = None
    checked: Flag = None
    correction: Num = None


class QuietPeriod(Record):
    age_s: Num = None
    periods_seen: Num = None
    return_probability: Num = None
    keep: Flag = None
    return_wish: Counts = None
    keep_engine_s: Num = None  # engine-seconds the kept engines cost over the horizon
    release_risk_requests: Num = None  # requests expected to meet too few engines if let go


class ScaleToZeroDiagnostics(Record):
    quiet_s: Num = None  # the configured quiet period
    quiet_for_s: Num = None  # since a request was last seen (arriving, queued or in flight)
    asleep: Flag = None  # at zero after this tick
    event: Text = None  # scaled_to_zero or wake_up on the tick that did it
    return_likely: Flag = None  # the quiet-period outlook expects a return within a lead
    queued_requests: Num = None  # the frontend's gauges this tick read
    inflight_requests: Num = None


class ForecastHorizon(Record):
    """One horizon's demand scenarios (app/core/sla/forecast.py), as quantiles."""

    q: list[float] | None = None  # the quantiles reported
    tokens_s: list[float] | None = None  # prompt tokens per second at each
    flight: list[float] | None = None  # requests in decode at the ITL target at each
    pairs: Num = None  # history pairs the scenarios rest on
    prior: Num = None  # scenarios from the prior (too few pairs yet)
    shift_tokens_s: Num = None  # the calibration the scenarios were moved by (prompt tokens/s)
    shift_flight: Num = None  # and requests in decode
    scored: Num = None  # past forecasts of this horizon the calibration scored


class SlaForecast(Record):
    """Attainment sizing's forecast: both horizons and the target it sizes for."""

    horizon_s: Num = None
    attainment_target: Num = None
    up: _section(ForecastHorizon) = None
    keep: _section(ForecastHorizon) = None


class SlaDiagnostics(Record):
    reason: Text = None
    detail: Text = None
    scale: dict[str, float] | None = None
    scale_samples: dict[str, int] | None = None
    lead_s: Num = None
    lead_measured: Flag = None
    ready: Counts = None  # engines serving when the tick ran
    expected: Counts = None  # engines the planner last ordered (starting ones included)
    demand: _section(SlaDemand) = None
    roles: _sections(SlaRole) = None
    scale_down_window_s: Num = None
    latency: _sections(LatencyModel) = None
    capacity_check: _section(CapacityCheck) = None
    # Per role, an order whose engines did not come within the bound (app/core/sla/shortfall.py).
    capacity_unavailable: dict[str, dict[str, float | int]] | None = None
    quiet: _section(QuietPeriod) = None
    zero: _section(ScaleToZeroDiagnostics) = None
    forecast: _section(SlaForecast) = None  # attainment sizing only


# --- shadow mode ---------------------------------------------------------------------------------


class ShadowRole(Record):
    """One role beside the incumbent autoscaler (app/core/shadow.py)."""

    incumbent: Num = None  # engines the incumbent runs: the DGD's replicas, the orchestrator's report
    incumbent_ready: Num = None  # of those, ready
    planner: Num = None  # what the planner would have ordered (its target, else its last order)
    wish: Num = None  # SLA scaling's wish, before bounds and overrides
    # Predicted share of requests within target under the tick's observed demand (the planner's
    # model, not a measurement); None when the model cannot say.
    attainment_incumbent: Num = None
    attainment_planner: Num = None


class ShadowDiagnostics(Record):
    caveat: Text = None
    roles: _sections(ShadowRole) = None


# --- the tick ------------------------------------------------------------------------------------


class StageRecord(Record):
    stage: Text = None
    replicas: Counts = None
    reason: Text = None


class TickDiagnostics(Record):
    version: int = 1
    at: Text = None  # ISO time, set by the shell (the service's clock); the core speaks seconds
    at_s: Num = None
    deployment: Text = None
    latest_decision_id: int | None = None
    latest_decision_status: Text = None
    overrides: dict[str, int | None] | None = None
    bounds: dict[str, dict[str, int]] | None = None
    stages: list[StageRecord] = Field(default_factory=list)
    target: Counts = None
    # Per role the target lowers, the ready engines to remove, first choice first
    # (app/core/victims.py).
    remove: dict[str, list[str]] | None = None
    throughput: _section(ThroughputDiagnostics) = None
    load: _section(LoadDiagnostics) = None
    sla: _section(SlaDiagnostics) = None
    # Written by the shells around the tick: the FPM subscribers' counters or the embedder's
    # summary, what SLA scaling observed, the protocol's verdict and the decision it stored.
    fpm: dict[str, Any] | None = None
    traffic: dict[str, Any] | None = None
    expired_decision_id: int | None = None
    # The fleet grant this tick ran under (app/core/fleet/grants.py `grant_record`); None
    # without a fleet.
    fleet: dict[str, Any] | None = None
    # The revision of the live settings the tick decided under (0: the deployments file's).
    settings_revision: int | None = None
    # The signals the tick assessed (read or not) and those unavailable (app/workers/signals.py).
    signals: dict[str, Any] | None = None
    # Where the ready counts came from: the connector, or the orchestrator's freshest report.
    ready_source: Text = None
    # What the engines cost from this tick on and the running account up to it (app/core/cost),
    # written by the shells around the tick: its sample (`billed`, `idle`, `gpus_per_engine`,
    # `cost_per_gpu_hour`) and `totals`; read leniently by app/core/cost/account.py.
    cost: dict[str, Any] | None = None
    # Shadow mode: what the incumbent ran beside what the planner would have ordered.
    shadow: _section(ShadowDiagnostics) = None
    verdict: Text = None
    decision_id: int | None = None

    @field_validator("stages", mode="before")
    @classmethod
    def _stage_rows(cls, rows: Any) -> list[Any]:
        return [r for r in rows if isinstance(r, Mapping | BaseModel)] if isinstance(rows, list) else []

    @field_validator("latest_decision_id", "expired_decision_id", "decision_id", mode="before")
    @classmethod
    def _decision_id(cls, value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def as_json(self) -> dict[str, Any]:
        """The stored form, JSON-ready. Every top-level field is written (a section that did not
        run reads as null); within a section, only what the step wrote."""
        record = self.model_dump(mode="json", exclude={"throughput", "load", "sla", "stages"})
        record["stages"] = [s.model_dump(mode="json") for s in self.stages]
        for name in ("throughput", "load", "sla"):
            section = getattr(self, name)
            record[name] = None if section is None else section.model_dump(mode="json", exclude_unset=True)
        return record

    @classmethod
    def read(cls, record: Any) -> TickDiagnostics:
        """A stored record of any version as the model; what cannot be read is unknown."""
        if not isinstance(record, Mapping):
            return cls()
        try:
            return cls.model_validate(record)
        except ValidationError:
            # A top-level field of an unexpected type: keep the sections that do read.
            fields = {}
            for name, value in record.items():
                try:
                    cls.model_validate({name: value})
                except ValidationError:
                    continue
                fields[name] = value
            return cls.model_validate(fields)
