"""Per-tick diagnostics records, and the report page over them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse

from app.api.auth import Viewer
from app.api.convert import tick_out
from app.api.deps import DeploymentsDep, SessionDep, deployment_or_raise
from app.api.errors import problem_responses
from app.api.schemas import MAX_ID, CostBucket, CostOut, TickPage
from app.config import DeploymentConfig, DeploymentsFile
from app.core.cost.account import sample_from_json
from app.core.cost.report import Bucket, cost_report
from app.core.errors import InvalidInputError
from app.reports.diagnostics.page import render_diagnostics_report
from app.store import ticks as store

# The reference's DiagnosticsRecorder keeps at most 50 000 snapshots; so does one report (2.9 days
# at 5 s ticks), which bounds its size and the time to build it.
MAX_REPORT_TICKS = 50_000
# The cost report reads only each tick's `cost` section (a few hundred bytes): 200 000 ticks are
# 11.6 days at 5 s ticks, a year at the throughput step's 180 s.
MAX_COST_TICKS = 200_000

router = APIRouter(tags=["diagnostics"])


# A time may be given either way; pydantic reads a number as Unix time (seconds; above 2e10,
# milliseconds), and the schema says so, so that neither form surprises a client.
_TIME_FORMS = "ISO 8601 with a time zone (2026-11-29T18:00:00Z) or Unix time in seconds (1795975200)"
_TIME_SCHEMA = {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "number"}, {"type": "null"}]}
Since = Annotated[
    datetime | None, Query(description=f"Inclusive; {_TIME_FORMS}", json_schema_extra=_TIME_SCHEMA)
]
Until = Annotated[
    datetime | None, Query(description=f"Exclusive; {_TIME_FORMS}", json_schema_extra=_TIME_SCHEMA)
]


def _utc(field: str, value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise InvalidInputError(field, "needs a time zone, e.g. 2026-11-29T18:00:00Z")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidInputError(field, "is outside the range of representable UTC times") from None


def _range(since: datetime | None, until: datetime | None) -> tuple[datetime | None, datetime | None]:
    since, until = _utc("since", since), _utc("until", until)
    if since is not None and until is not None and until <= since:
        raise InvalidInputError("until", "must be after since")
    return since, until


@router.get(
    "/diagnostics",
    name="list_diagnostics",
    response_model=TickPage,
    responses=problem_responses(401, 403, 404, 422, 503),
)
def list_diagnostics(
    session: SessionDep,
    deployments: DeploymentsDep,
    _: Viewer,
    deployment: Annotated[str | None, Query(max_length=63)] = None,
    since: Since = None,
    until: Until = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="The newest this many ticks of the range")] = 100,
    cursor: Annotated[
        int | None,
        Query(ge=0, le=MAX_ID, description="next_cursor of the previous page: the ticks before those"),
    ] = None,
) -> TickPage:
    """The newest `limit` ticks of the range, oldest first. `next_cursor` (when older ticks
    remain) is the id of the oldest one shown; pass it as `cursor` for the page before."""
    if deployment is not None:
        deployment_or_raise(deployments, deployment)
    since, until = _range(since, until)
    rows = store.list_ticks(
        session, deployment=deployment, since=since, until=until, before=cursor, limit=limit + 1
    )
    more = len(rows) > limit
    rows = rows[len(rows) - limit :] if more else rows
    return TickPage(items=[tick_out(t) for t in rows], next_cursor=rows[0].id if more else None)


def _report_deployment(deployments: DeploymentsFile, name: str | None) -> DeploymentConfig:
    """A report covers one deployment; the name may be left out only when there is one."""
    if name is not None:
        return deployment_or_raise(deployments, name)
    if len(deployments.deployments) == 1:
        return deployments.deployments[0]
    raise InvalidInputError(
        "deployment", "required: a report covers one deployment and several are configured"
    )


@router.get(
    "/diagnostics/report",
    name="diagnostics_report",
    response_class=HTMLResponse,
    responses={
        200: {"description": "A self-contained HTML page (plotly.js inline)", "content": {"text/html": {}}},
        **problem_responses(401, 403, 404, 422, 503),
    },
)
def diagnostics_report(
    session: SessionDep,
    deployments: DeploymentsDep,
    _: Viewer,
    deployment: Annotated[
        str | None, Query(max_length=63, description="Required when more than one deployment is configured")
    ] = None,
    since: Since = None,
    until: Until = None,
) -> HTMLResponse:
    """The stored ticks of one deployment as the reference's diagnostics report: replicas, load,
    latencies against the SLA, per-engine queues and the decisions by reason, on one time axis.
    At most the latest 50 000 ticks of the range (the page says when it shows fewer)."""
    config = _report_deployment(deployments, deployment)
    since, until = _range(since, until)
    total, ticks = store.latest_ticks(session, config.name, since, until, MAX_REPORT_TICKS)
    page = render_diagnostics_report(
        config.name,
        ticks,
        sla=(config.sla.ttft_ms, config.sla.itl_ms),
        since=since,
        until=until,
        ticks_in_range=total,
    )
    return HTMLResponse(page)


def _buckets(buckets: list[Bucket]) -> list[CostBucket]:
    return [
        CostBucket(start=datetime.fromtimestamp(b.start_s, UTC), gpu_hours=b.gpu_hours, cost=b.cost)
        for b in buckets
    ]


@router.get(
    "/diagnostics/cost",
    name="diagnostics_cost",
    response_model=CostOut,
    responses=problem_responses(401, 403, 404, 422, 503),
)
def diagnostics_cost(
    session: SessionDep,
    deployments: DeploymentsDep,
    _: Viewer,
    deployment: Annotated[
        str | None, Query(max_length=63, description="Required when more than one deployment is configured")
    ] = None,
    since: Since = None,
    until: Until = None,
) -> CostOut:
    """What one deployment's engines cost over the range's stored ticks: GPU-hours per role and
    cost, per hour and per day (UTC), the idle share, and the saving against the static
    allocation the same history's peak would have needed. At most the latest 200 000 ticks."""
    config = _report_deployment(deployments, deployment)
    since, until = _range(since, until)
    total, rows = store.latest_ticks(session, config.name, since, until, MAX_COST_TICKS, section="cost")
    samples = (s for at, section in rows if (s := sample_from_json(at.timestamp(), section)) is not None)
    report = cost_report(samples)

    def time(at_s: float | None) -> datetime | None:
        return datetime.fromtimestamp(at_s, UTC) if at_s is not None else None

    return CostOut(
        deployment=config.name,
        ticks=report.ticks,
        ticks_in_range=total,
        first_tick=time(report.first_s),
        last_tick=time(report.last_s),
        cost_per_gpu_hour=report.cost_per_gpu_hour,
        gpu_hours=report.gpu_hours,
        gpu_hours_total=report.total_gpu_hours,
        cost=report.cost,
        billed_s=report.billed_s,
        unobserved_s=report.unobserved_s,
        idle_gpu_hours=report.idle_gpu_hours,
        idle_share=report.idle_share,
        peak_engines=report.peak_engines,
        static_gpu_hours=report.static_gpu_hours,
        static_cost=report.static_cost,
        saving=report.saving,
        saving_share=report.saving_share,
        per_hour=_buckets(report.per_hour),
        per_day=_buckets(report.per_day),
    )
