"""Request and response bodies. Field names are part of the contract (product.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

NonNegative = Annotated[int, Field(ge=0, le=100_000)]
MAX_ID = 2**31 - 1  # ids are 32-bit integer columns


def _no_nul(text: str) -> str:
    # PostgreSQL text cannot hold NUL; refuse it here rather than fail in the database.
    if "\x00" in text:
        raise ValueError("must not contain NUL characters")
    return text


Text = Annotated[str, AfterValidator(_no_nul)]
_MAX_EXPIRY_S = 30 * 24 * 3600


class _In(BaseModel):
    # Unknown fields are an error: a misspelt `num_prefil` must not silently do nothing.
    model_config = ConfigDict(extra="forbid")


class FieldError(BaseModel):
    field: str = Field(description="The bad field: `body.num_prefill`, `query.timeout_s`, `deployment`")
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details, sent as `application/problem+json`."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldError] | None = None


class DecisionOut(BaseModel):
    id: int
    deployment: str
    num_prefill: int | None
    num_decode: int | None
    num_workers: int | None
    source: Literal["throughput", "load", "sla", "override"]
    reasons: list[str]
    created_at: datetime
    status: Literal["pending", "succeeded", "failed", "superseded", "expired", "shadow"]
    status_reason: str | None
    completed_at: datetime | None
    observed: dict[str, int] | None
    message: str | None
    remove: dict[str, list[str]] | None = Field(
        default=None,
        description=(
            "Per role this decision lowers: the ready engines (worker ids, as their forward-pass "
            "metrics name them) to remove, first choice first: idle ones, then those with the "
            "least work in flight. Engines still starting are not named and go before them. A "
            "hint: an orchestrator that cannot choose which engines stop may ignore it."
        ),
    )
    tick_id: int | None
    override_id: int | None


class DecisionPage(BaseModel):
    items: list[DecisionOut]
    next_cursor: int | None = Field(description="Pass as `cursor` for the next page; null at the end")


class Observed(_In):
    prefill: NonNegative | None = None
    decode: NonNegative | None = None
    workers: NonNegative | None = None


class CompleteIn(_In):
    status: Literal["succeeded", "failed"]
    observed: Observed | None = None
    message: Text | None = Field(default=None, max_length=4000)


class ProgressIn(_In):
    observed: Observed
    message: Text | None = Field(default=None, max_length=4000)


class _OverrideIn(_In):
    deployment: Text = Field(min_length=1, max_length=63)
    reason: Text = Field(min_length=1, max_length=2000)
    expires_in_s: float | None = Field(default=None, gt=0, le=_MAX_EXPIRY_S, allow_inf_nan=False)


class PinIn(_OverrideIn):
    action: Literal["pin"]
    num_prefill: NonNegative | None = None
    num_decode: NonNegative | None = None
    num_workers: NonNegative | None = None


class BoundsIn(_OverrideIn):
    action: Literal["bounds"]
    min_prefill: NonNegative | None = None
    max_prefill: NonNegative | None = None
    min_decode: NonNegative | None = None
    max_decode: NonNegative | None = None
    min_workers: NonNegative | None = None
    max_workers: NonNegative | None = None


class PauseIn(_OverrideIn):
    action: Literal["pause"]


class ResumeIn(_OverrideIn):
    action: Literal["resume"]


OverrideIn = Annotated[PinIn | BoundsIn | PauseIn | ResumeIn, Field(discriminator="action")]


class OverrideOut(BaseModel):
    id: int
    deployment: str
    action: Literal["pin", "bounds", "pause", "resume"]
    params: dict[str, int]
    reason: str
    created_at: datetime
    created_by: str
    expires_at: datetime | None
    ended_at: datetime | None
    ended_reason: str | None
    active: bool


class OverrideCreated(OverrideOut):
    decision: DecisionOut | None = Field(description="The decision a pin created, if it created one")
    decision_outcome: str | None = Field(description="Why a pin did or did not create a decision")


class TickOut(BaseModel):
    id: int
    deployment: str
    at: datetime
    decision_id: int | None
    record: dict[str, Any]


class TickPage(BaseModel):
    items: list[TickOut]
    next_cursor: int | None


class CostBucket(BaseModel):
    start: datetime = Field(description="The hour's or day's start (UTC)")
    gpu_hours: float
    cost: float


class CostOut(BaseModel):
    """A deployment's cost over the range's ticks, first to last (docs/operations.md, "Cost")."""

    deployment: str
    ticks: int = Field(description="Ticks read: the latest of the range, at most 200 000")
    ticks_in_range: int
    first_tick: datetime | None
    last_tick: datetime | None
    cost_per_gpu_hour: float | None = Field(description="The last tick's price of a GPU-hour")
    gpu_hours: dict[str, float] = Field(description="GPU-hours billed per role")
    gpu_hours_total: float
    cost: float = Field(description="Cost billed: GPU-hours times the price of each tick (currency-neutral)")
    billed_s: float = Field(description="Time billed between the ticks")
    unobserved_s: float = Field(
        description="Time between ticks not billed: counts unknown, or a gap of over 900 s"
    )
    idle_gpu_hours: float = Field(description="GPU-hours of engines ready with no work (from their FPM)")
    idle_share: float | None = Field(
        description="Of the GPU-hours whose engines' FPM the ticks read, the idle share (null: never read)"
    )
    peak_engines: dict[str, int] = Field(description="The history's peak: most engines billed per role")
    static_gpu_hours: float = Field(description="Each role's peak held all the billed time")
    static_cost: float
    saving: float = Field(description="static_cost - cost")
    saving_share: float | None = Field(description="saving / static_cost")
    per_hour: list[CostBucket]
    per_day: list[CostBucket]


class ShadowSideOut(BaseModel):
    """One side of the comparison over the window (docs/shadow.md, "The report")."""

    engine_hours: dict[str, float] = Field(
        description="Engine-hours per role, each tick's counts until the next"
    )
    gpu_hours: dict[str, float] = Field(description="GPU-hours per role (engine-hours times GPUs per engine)")
    gpu_hours_total: float
    cost: float = Field(description="GPU-hours times each tick's cost_per_gpu_hour")
    billed_s: float = Field(
        description="Time the engine-hours cover: between ticks whose counts were known, gaps of up to 900 s"
    )
    mean_predicted_attainment: dict[str, float | None] = Field(
        description="Per role, the mean over the ticks that predicted one of the predicted SLO "
        "attainment of this side's count (the planner's model, not a measurement; null: never "
        "predicted)"
    )


class ShadowOut(BaseModel):
    """What a shadow deployment's planner would have ordered beside what ran (docs/shadow.md)."""

    deployment: str
    window_s: float
    since: datetime
    until: datetime
    ticks: int = Field(description="Shadow ticks in the window")
    compared: int = Field(description="Of those, ticks where both sides' counts were known for every role")
    first_tick: datetime | None
    last_tick: datetime | None
    agreement_exact: float | None = Field(
        description="Share of the compared ticks where every role's counts were equal (null: none compared)"
    )
    agreement_within_one: float | None = Field(
        description="Share of the compared ticks where every role's counts were within one engine"
    )
    incumbent: ShadowSideOut = Field(description="What ran: the incumbent autoscaler's counts")
    planner: ShadowSideOut = Field(description="What the planner would have ordered")
    caveat: str = Field(description="What the predicted attainment is, and is not")
    note: str | None = Field(description="Said of an empty window")


class AuditOut(BaseModel):
    id: int
    at: datetime
    actor_role: str
    actor: str
    action: str
    deployment: str
    details: dict[str, Any]


class RoleSummary(BaseModel):
    gpus_per_engine: int
    min_replicas: int
    max_replicas: int


class WorkerState(BaseModel):
    running: bool
    leader: bool = Field(description="This process holds the deployment's lease and runs its ticks")
    lease_checked_at: datetime | None
    interval_s: float
    last_tick_at: datetime | None = Field(description="Last tick this process ran")
    last_error: str | None


GrantReasonOut = Literal["wish_met", "cut_budget", "cut_max_share", "held"]


class FleetCutOut(BaseModel):
    by: str = Field(description="A deployment holding GPUs of the type the cut deployment wanted")
    why: str = Field(description="Why it keeps them: higher priority, guarantee, marginal value, hysteresis")
    gpus: int = Field(description="GPUs it holds of the type")


class FleetRoleOut(BaseModel):
    wish: int = Field(description="Engines the deployment's planner wished (its proposal within its bounds)")
    granted: int = Field(description="Engines the fleet step granted: the role's maximum at the next tick")
    cut: bool = Field(description="Granted fewer engines than wished")
    reason: GrantReasonOut
    detail: str


class FleetMemberOut(BaseModel):
    deployment: str
    gpu_type: str
    priority: int
    guaranteed_gpus: int = Field(description="Configured guarantee: GPUs it gets whenever it wishes them")
    max_gpus: int | None = Field(description="Configured max share (None: up to the budget)")
    wish_gpus: int
    granted_gpus: int
    used_gpus: int | None = Field(description="GPUs of its latest decision (replicas x GPUs per engine)")
    cut: bool = Field(description="Any role granted fewer engines than it wished")
    roles: dict[str, FleetRoleOut]
    cut_by: list[FleetCutOut] = Field(description="Who holds the GPUs it wanted, and why (empty unless cut)")
    grant_changes: int = Field(description="Fleet steps that changed its grant since the fleet state began")
    granted_at: datetime | None = Field(description="When the fleet step that gave this grant ran")


class FleetBudgetOut(BaseModel):
    gpu_type: str
    budget_gpus: int
    granted_gpus: int = Field(description="Sum of the grants; never above the budget")
    used_gpus: int = Field(description="Sum of the GPUs of the deployments' latest decisions")
    free_gpus: int = Field(description="Budget left after the grants")


class FleetMoveOut(BaseModel):
    at: datetime
    gpu_type: str
    taker: str
    taker_role: str
    donor: str
    donor_role: str
    gpus: int
    reason: Literal["priority", "value"]
    gain_per_gpu: float
    loss_per_gpu: float


class FleetOut(BaseModel):
    stepped_at: datetime | None = Field(description="When the last fleet step ran (None: not yet)")
    interval_s: float
    margin: float
    hold_s: float
    leader: bool = Field(description="This process holds the fleet lease and runs the fleet step")
    last_error: str | None = Field(
        description="This process's last fleet step failure, if the last one failed"
    )
    budgets: list[FleetBudgetOut]
    members: list[FleetMemberOut]
    moves: list[FleetMoveOut] = Field(description="The last GPU moves between deployments, newest last")


class DeploymentOut(BaseModel):
    name: str
    mode: Literal["disagg", "agg", "prefill", "decode"]
    connector: str
    shadow: bool = Field(
        description="Shadow mode (connector.mode: shadow): what runs is read, nothing is written "
        "(GET /deployments/{name}/shadow)"
    )
    sla: dict[str, float]
    roles: dict[str, RoleSummary]
    ready: dict[str, int] | None = Field(description="Replicas the orchestrator last reported running")
    desired: dict[str, int] | None = Field(description="Replicas of the latest decision")
    last_decision: DecisionOut | None
    active_overrides: list[OverrideOut]
    paused: bool
    worker: WorkerState
    fleet: FleetMemberOut | None = Field(
        default=None,
        description="Its fleet grant, whether it is cut and why (None: no fleet, or no step yet)",
    )


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    ready: bool
    database: str
    deployments: dict[str, list[str]] = Field(description="Per deployment, what keeps it from being ready")


class SettingsOut(BaseModel):
    deployment: str
    revision: int = Field(
        description="The settings' revision; the ETag header carries it, and a PATCH names it in If-Match"
    )
    settings: dict[str, Any] = Field(
        description="The live settings as the deployment runs them, nested as in the deployments file"
    )
    sources: dict[str, Literal["file", "store"]] = Field(
        description="Per live field (dotted path): `file` (the deployments file's value) or `store` "
        "(changed over the API)"
    )
    overrides: dict[str, Any] = Field(description="The changes stored over the file, nested as in the file")
    not_applied: str | None = Field(
        default=None,
        description="Why the stored changes do not run, if they do not: the deployments file changed "
        "under them and no longer accepts them, so the file's values run (null: they run)",
    )
    updated_at: datetime | None = Field(description="When the last change was stored; null if never")
    updated_by: str | None = Field(description="Who stored the last change (the token's fingerprint)")
