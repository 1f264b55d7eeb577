"""A deployment's live settings: read them with their revision, change them with `If-Match`.

The deployments file is the default and the store the override (app/store/settings.py); the
worker applies a change from its next tick, in whichever process leads the deployment. A change
is a JSON merge patch of the fields that may change live (app/config/live.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path, Response
from sqlalchemy.orm import Session

from app.api.auth import Operator, Viewer
from app.api.deps import DeploymentsDep, NowDep, SessionDep, deployment_or_raise
from app.api.errors import problem_responses
from app.api.schemas import SettingsOut
from app.config import DeploymentConfig
from app.config.live import live_values, running_config, sources_of
from app.core.errors import InvalidInputError, PreconditionRequiredError
from app.store import settings as store

router = APIRouter(prefix="/deployments", tags=["deployments"])

_ETAG = {"ETag": {"description": "The settings' revision, quoted", "schema": {"type": "string"}}}
_PATCH_EXAMPLE = {"sla": {"ttft_ms": 400}, "prefill": {"max_replicas": 12}, "scaling": {"trend": None}}


def _out(session: Session, config: DeploymentConfig, response: Response) -> SettingsOut:
    stored = store.load(session, config.name)
    running, error = running_config(config, stored.overrides)
    response.headers["ETag"] = f'"{stored.revision}"'
    return SettingsOut(
        deployment=config.name,
        revision=stored.revision,
        settings=live_values(running),
        not_applied=error,
        sources=sources_of(config, stored.overrides),  # type: ignore[arg-type]
        overrides=stored.overrides,
        updated_at=stored.updated_at,
        updated_by=stored.updated_by,
    )


def _revision(if_match: str | None) -> int | None:
    """The revision `If-Match` names; None for `*` (any). Missing: 428."""
    if if_match is None:
        raise PreconditionRequiredError(
            "If-Match is required: the ETag of the settings this change is based on (GET them first), or *"
        )
    value = if_match.strip()
    if value == "*":
        return None
    value = value.removeprefix("W/").strip('"')
    if not value.isdigit():
        raise InvalidInputError("If-Match", f"not a revision of these settings: {if_match!r}")
    return int(value)


@router.get(
    "/{name}/settings",
    name="get_settings",
    response_model=SettingsOut,
    responses={200: {"headers": _ETAG}, **problem_responses(401, 403, 404, 422, 503)},
)
def get_settings(
    session: SessionDep,
    deployments: DeploymentsDep,
    response: Response,
    _: Viewer,
    name: Annotated[str, Path(max_length=63)],
) -> SettingsOut:
    """The live settings as the deployment runs them, each with where its value comes from."""
    return _out(session, deployment_or_raise(deployments, name, field="name"), response)


@router.patch(
    "/{name}/settings",
    name="change_settings",
    response_model=SettingsOut,
    responses={200: {"headers": _ETAG}, **problem_responses(400, 401, 403, 404, 412, 413, 422, 428, 503)},
)
def change_settings(
    session: SessionDep,
    deployments: DeploymentsDep,
    now: NowDep,
    response: Response,
    actor: Operator,
    name: Annotated[str, Path(max_length=63)],
    body: Annotated[
        dict[str, Any],
        Body(
            description="A JSON merge patch of the live settings: a value sets the field, null returns it "
            "to the deployments file's value. Live: sla.{ttft_ms,itl_ms,attainment_target}, "
            "<role>.{min_replicas,max_replicas}, gpu_budget, scaling.{sizing,trend,"
            "startup_estimate_s,scale_down_window_s,forecast_cap}, "
            "scaling.scale_to_zero.{enabled,quiet_s,respect_return_forecast}",
            examples=[_PATCH_EXAMPLE],
            media_type="application/merge-patch+json",
        ),
    ],
    if_match: Annotated[
        str | None, Header(description="The ETag of the settings this change is based on, or *")
    ] = None,
) -> SettingsOut:
    """Change live settings, validated as the deployments file is, audited, and applied from the
    deployment's next tick; kept across restarts."""
    config = deployment_or_raise(deployments, name, field="name")
    expected = _revision(if_match)
    store.change(session, config=config, patch=body, expected_revision=expected, actor=actor, now=now)
    session.commit()
    return _out(session, config, response)
