"""The fleet section of the deployments file: several deployments under one GPU budget per GPU
type, each a member with a priority, a guarantee and its hardware variants (`FleetConfig`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from app.config.base import Strict
from app.core.types import Role


class VariantConfig(Strict):
    """One kind of engine a deployment may run (app/core/fleet/variants.py, docs/fleet.md). The
    first variant listed is the deployment's own hardware: its profile and GPUs per engine
    default to the deployment's, and must equal them when given."""

    name: str | None = Field(default=None, description="how grants name it (default: its gpu_type)")
    gpu_type: str = Field(description="which budget of fleet.budget_gpus its engines draw on")
    gpus_per_engine: dict[Role, Annotated[int, Field(ge=1)]] | None = Field(
        default=None, description="GPUs per engine, per role (default: the deployment's)"
    )
    profile: str | None = Field(
        default=None,
        description="its profiling-results folder, relative to this file (default: the deployment's)",
    )
    latency_scale: float = Field(
        default=1.0,
        gt=0,
        description="multiplies the profile's latencies: a GPU without a profile of its own, read as "
        "a scaled one (docs/fleet.md)",
    )
    price_per_gpu_hour: float = Field(gt=0, description="what one of its GPUs costs per hour")

    @property
    def label(self) -> str:
        return self.name or self.gpu_type


class CapacityShape(Strict):
    """The request shape a variant's capacity per engine is read at."""

    isl_tokens: float = Field(default=3000.0, gt=0, description="prompt length (tokens)")
    osl_tokens: float = Field(default=150.0, gt=0, description="output length (tokens)")


class FleetMemberConfig(Strict):
    """One deployment's place in the fleet (app/core/fleet/step.py, docs/fleet.md)."""

    priority: int = Field(default=0, description="higher is served first, and takes from lower at once")
    gpu_type: str | None = Field(default=None, description="which budget it draws on (default: the only one)")
    guaranteed_gpus: int = Field(default=0, ge=0, description="GPUs it gets whenever it wishes them")
    max_gpus: int | None = Field(
        default=None, ge=1, description="GPUs it may hold at most (default: the budget)"
    )
    variants: list[VariantConfig] = Field(
        default_factory=list,
        description="hardware variants (its own first), grown cheapest per unit of capacity first",
    )
    capacity_at: CapacityShape = Field(
        default_factory=CapacityShape, description="the request shape variants' capacities are read at"
    )

    @model_validator(mode="after")
    def _variant_names_unique(self) -> FleetMemberConfig:
        seen: set[str] = set()
        for i, v in enumerate(self.variants):
            if v.label in seen:
                raise ValueError(f"variants.{i}.name: {v.label!r} appears twice (name the variants)")
            seen.add(v.label)
        return self

    @model_validator(mode="after")
    def _guarantee_within_max(self) -> FleetMemberConfig:
        if self.max_gpus is not None and self.guaranteed_gpus > self.max_gpus:
            raise ValueError(f"guaranteed_gpus ({self.guaranteed_gpus}) is above max_gpus ({self.max_gpus})")
        return self


class FleetConfig(Strict):
    """Several deployments under one GPU budget per GPU type: the fleet step between their planners
    and the cluster. Deployments not listed under `deployments` have priority 0 and no guarantee."""

    budget_gpus: dict[str, Annotated[int, Field(ge=1)]] = Field(
        min_length=1, description="total GPUs per GPU type, e.g. {h200: 24}"
    )
    interval_s: float = Field(default=5.0, gt=0, description="how often the fleet step grants (s)")
    margin: float = Field(
        default=0.2, ge=0, description="a move between equal priorities must gain 1 + margin times its cost"
    )
    hold_s: float = Field(
        default=120.0, ge=0, description="... and both grants must have been unchanged this long (s)"
    )
    deployments: dict[str, FleetMemberConfig] = Field(
        default_factory=dict, description="per deployment: priority, gpu_type, guaranteed_gpus, max_gpus"
    )

    def member(self, name: str) -> FleetMemberConfig:
        found = self.deployments.get(name, FleetMemberConfig())
        if found.gpu_type is None:
            found = found.model_copy(update={"gpu_type": next(iter(self.budget_gpus))})
        return found
