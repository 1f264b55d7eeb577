"""POST /plan: the what-if calculation. For a profile (or a deployment's profile) and a steady load,
the replicas the throughput formula gives, with the interpolated figures. Creates nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, ConfigDict, Field

from app.api.auth import Viewer
from app.api.deps import DeploymentsDep, deployment_or_raise
from app.api.errors import problem_responses
from app.api.schemas import Text
from app.core.errors import InvalidInputError, ProfileError
from app.core.perf.interpolation import PerfModel
from app.core.seed.replicas import what_if
from app.sources.profile_files import load_profile

router = APIRouter(tags=["plan"])


class PlanIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    profile: Text | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="A profile directory on the planner's host (relative paths: its working directory)",
    )
    deployment: Text | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description="A configured deployment: its profile, SLA and GPUs per engine are the defaults",
    )
    rps: float = Field(description="Requests per second", ge=0, le=1e7, allow_inf_nan=False)
    isl: float = Field(description="Mean input tokens per request", gt=0, le=1e8, allow_inf_nan=False)
    osl: float = Field(description="Mean output tokens per request", gt=0, le=1e8, allow_inf_nan=False)
    ttft_ms: float | None = Field(
        default=None, gt=0, le=1e7, allow_inf_nan=False, description="TTFT target (default: the SLA)"
    )
    itl_ms: float | None = Field(
        default=None, gt=0, le=1e7, allow_inf_nan=False, description="ITL target (default: the SLA)"
    )
    prefill_gpus: int | None = Field(default=None, ge=1, le=1024, description="GPUs per prefill engine")
    decode_gpus: int | None = Field(default=None, ge=1, le=1024, description="GPUs per decode engine")
    min_replicas: int = Field(default=1, ge=0, le=100_000)


class PlanOut(BaseModel):
    profile: str
    deployment: str | None
    rps: float
    isl: float
    osl: float
    ttft_ms: float
    itl_ms: float
    prefill_gpus: int
    decode_gpus: int
    min_replicas: int
    num_prefill: int
    num_decode: int
    prefill_thpt_per_gpu: float = Field(description="Prefill tokens/s/GPU at the ISL")
    decode_thpt_per_gpu: float = Field(description="Output tokens/s/GPU at the chosen decode cell")
    expected_ttft_ms: float = Field(description="TTFT of one request alone at the ISL (no queueing)")
    expected_itl_ms: float = Field(description="ITL at the chosen decode cell")
    decode_kv_usage: float = Field(description="KV cache fraction in use at the chosen decode cell")
    decode_context_tokens: float = Field(description="isl + osl/2")
    ttft_met: bool
    itl_met: bool
    prefill_reason: str
    decode_reason: str


def _check_allowed(request: Request, path: Path) -> None:
    """A viewer may not make the planner read arbitrary folders: only those under the profile
    roots (PLANNER_PROFILE_ROOTS, and the folders of configured profiles)."""
    try:
        resolved = path.resolve()
    except (OSError, ValueError, RuntimeError):
        raise InvalidInputError("body.profile", f"{path}: not a usable path") from None
    roots: list[Path] = request.app.state.profile_roots
    if not any(resolved.is_relative_to(root) for root in roots):
        raise InvalidInputError(
            "body.profile", f"{path} is outside the allowed profile folders (PLANNER_PROFILE_ROOTS)"
        )


def _cached_model(request: Request, path: Path, field: str) -> PerfModel:
    """Interpolation grids are built once per profile directory and kept in app.state."""
    cache: dict[str, PerfModel] | None = getattr(request.app.state, "plan_models", None)
    if cache is None:
        cache = request.app.state.plan_models = {}
    try:
        key = str(path.resolve())
    except (OSError, ValueError, RuntimeError):
        key = str(path)
    model = cache.get(key)
    if model is None:
        try:
            model = PerfModel.from_profile(load_profile(path))
        except ProfileError as exc:
            raise InvalidInputError(field, str(exc)) from None
        cache[key] = model
    return model


def _required(value: float | None, field: str) -> float:
    if value is None:
        raise InvalidInputError(field, "required when planning for a profile (a deployment supplies its SLA)")
    return value


@router.post(
    "/plan",
    name="plan",
    response_model=PlanOut,
    responses=problem_responses(
        400,
        401,
        403,
        404,
        413,
        422,
        _404="unknown deployment",
        _422="bad input, or a broken profile (names file and key)",
    ),
)
def plan(
    request: Request, deployments: DeploymentsDep, _: Viewer, body: Annotated[PlanIn, Body()]
) -> PlanOut:
    if (body.profile is None) == (body.deployment is None):
        given = "both" if body.profile is not None else "neither"
        raise InvalidInputError("body.profile", f"give exactly one of profile or deployment ({given} given)")

    if body.deployment is not None:
        config = deployment_or_raise(deployments, body.deployment, field="body.deployment")
        if not config.profile:
            raise InvalidInputError(
                "body.deployment", f"deployment {config.name!r} has no profile configured"
            )
        profile = config.profile
        # The model the deployment's worker already loaded (its paths resolved like the service's);
        # else the configured path, loaded here.
        worker = getattr(request.app.state, "workers", {}).get(config.name)
        model = getattr(getattr(worker, "planner", None), "model", None)
        if not isinstance(model, PerfModel):
            model = _cached_model(request, Path(profile), "body.deployment")
        ttft_ms = body.ttft_ms if body.ttft_ms is not None else config.sla.ttft_ms
        itl_ms = body.itl_ms if body.itl_ms is not None else config.sla.itl_ms
        prefill_gpus = body.prefill_gpus or config.prefill.gpus_per_engine
        decode_gpus = body.decode_gpus or config.decode.gpus_per_engine
    else:
        profile = str(body.profile)
        _check_allowed(request, Path(profile))
        ttft_ms = _required(body.ttft_ms, "body.ttft_ms")
        itl_ms = _required(body.itl_ms, "body.itl_ms")
        prefill_gpus = body.prefill_gpus or 1
        decode_gpus = body.decode_gpus or 1
        model = _cached_model(request, Path(profile), "body.profile")

    return PlanOut(
        profile=profile,
        deployment=body.deployment,
        **what_if(
            model=model,
            rps=body.rps,
            isl=body.isl,
            osl=body.osl,
            ttft_ms=ttft_ms,
            itl_ms=itl_ms,
            prefill_gpus=prefill_gpus,
            decode_gpus=decode_gpus,
            min_replicas=body.min_replicas,
        ),
    )
