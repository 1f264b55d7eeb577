"""The deployments file as a whole (`DeploymentsFile`: its deployments and their fleet) and how it
is read and validated (`load_deployments`: one `ConfigError` naming the file and the field)."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from app.config.base import ConfigError, Strict
from app.config.deployment import DeploymentConfig
from app.config.fleet import FleetConfig, FleetMemberConfig
from app.validation_messages import describe_validation_error


class DeploymentsFile(Strict):
    deployments: list[DeploymentConfig] = Field(min_length=1)
    fleet: FleetConfig | None = Field(default=None, description="a shared GPU budget (docs/fleet.md)")

    @field_validator("deployments")
    @classmethod
    def _unique_names(cls, deployments: list[DeploymentConfig]) -> list[DeploymentConfig]:
        seen: set[str] = set()
        for d in deployments:
            if d.name in seen:
                raise ValueError(f"deployment name {d.name!r} appears twice")
            seen.add(d.name)
        return deployments

    @model_validator(mode="after")
    def _fleet_matches_the_deployments(self) -> DeploymentsFile:
        fleet = self.fleet
        if fleet is None:
            return self
        names = {d.name for d in self.deployments}
        for name, entry in fleet.deployments.items():
            where = f"fleet.deployments.{name}"
            if name not in names:
                raise ValueError(f"{where}: no deployment named {name!r} (have: {', '.join(sorted(names))})")
            if entry.gpu_type is None and len(fleet.budget_gpus) > 1:
                raise ValueError(f"{where}.gpu_type: required with several GPU types in fleet.budget_gpus")
            if entry.gpu_type is not None and entry.gpu_type not in fleet.budget_gpus:
                types = ", ".join(fleet.budget_gpus)
                raise ValueError(f"{where}.gpu_type: {entry.gpu_type!r} has no budget (have: {types})")
            if entry.variants:
                _check_variants(where, entry, fleet, self.get(name))  # type: ignore[arg-type]
        if len(fleet.budget_gpus) > 1:
            missing = sorted(names - set(fleet.deployments))
            if missing:
                raise ValueError(f"fleet.deployments.{missing[0]}: gpu_type required with several GPU types")
        for gpu_type, budget in fleet.budget_gpus.items():
            # Guarantees are promises: all of them at once must fit the budget.
            guaranteed = sum(
                fleet.member(n).guaranteed_gpus for n in names if fleet.member(n).gpu_type == gpu_type
            )
            if guaranteed > budget:
                raise ValueError(
                    f"fleet.budget_gpus.{gpu_type}: {budget} GPUs, but the guarantees add up to {guaranteed}"
                )
        return self

    def get(self, name: str) -> DeploymentConfig | None:
        return next((d for d in self.deployments if d.name == name), None)


def _check_variants(
    where: str, entry: FleetMemberConfig, fleet: FleetConfig, deployment: DeploymentConfig
) -> None:
    """A variant draws on a budgeted GPU type, and the first one is the deployment's own
    hardware: the planner's wish is in engines of its own profile."""
    types = ", ".join(fleet.budget_gpus)
    for i, v in enumerate(entry.variants):
        if v.gpu_type not in fleet.budget_gpus:
            raise ValueError(f"{where}.variants.{i}.gpu_type: {v.gpu_type!r} has no budget (have: {types})")
        if v.gpus_per_engine is not None:
            extra = sorted(set(v.gpus_per_engine) - set(deployment.roles))
            if extra:
                raise ValueError(
                    f"{where}.variants.{i}.gpus_per_engine: {', '.join(extra)} is not a role of "
                    f"mode {deployment.mode} (roles: {', '.join(deployment.roles)})"
                )
    first = entry.variants[0]
    own_type = entry.gpu_type or next(iter(fleet.budget_gpus))
    if first.gpu_type != own_type:
        raise ValueError(
            f"{where}.variants.0.gpu_type: {first.gpu_type!r}, but the deployment's gpu_type is "
            f"{own_type!r} (the first variant is the deployment's own hardware)"
        )
    own_gpus = {r: deployment.role(r).gpus_per_engine for r in deployment.roles}
    if first.gpus_per_engine is not None and {**own_gpus, **first.gpus_per_engine} != own_gpus:
        raise ValueError(
            f"{where}.variants.0.gpus_per_engine: {first.gpus_per_engine}, but the deployment's "
            f"engines use {own_gpus} (the first variant is the deployment's own hardware)"
        )
    if first.profile is not None and first.profile != deployment.profile:
        raise ValueError(
            f"{where}.variants.0.profile: {first.profile!r}, but the deployment's profile is "
            f"{deployment.profile!r} (the first variant is the deployment's own hardware)"
        )
    if first.latency_scale != 1.0:
        raise ValueError(f"{where}.variants.0.latency_scale: the deployment's own hardware is not scaled")
    if deployment.profile is None and any(v.profile is None for v in entry.variants):
        i = next(i for i, v in enumerate(entry.variants) if v.profile is None)
        raise ValueError(f"{where}.variants.{i}.profile: required (the deployment has no profile)")
    # One price for the deployment's own engines: the first variant's, which the cost account
    # bills them at unless the deployment names the same one.
    price = first.price_per_gpu_hour
    if "cost_per_gpu_hour" in deployment.model_fields_set and deployment.cost_per_gpu_hour != price:
        raise ValueError(
            f"deployments.{deployment.name}.cost_per_gpu_hour: {deployment.cost_per_gpu_hour:g}, but "
            f"{where}.variants.0.price_per_gpu_hour is {price:g} (the first variant is the deployment's "
            "own hardware; give the price once)"
        )
    deployment.cost_per_gpu_hour = price


def format_validation_error(source: str, err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """The first problem, an unknown key before anything else (app/validation_messages.py)."""
    return describe_validation_error(source, err, model)


def load_deployments(path: str | Path) -> DeploymentsFile:
    path = Path(path)
    return validate_deployments(read_yaml_mapping(path), str(path))


def validate_deployments(raw: dict, source: str) -> DeploymentsFile:
    try:
        return DeploymentsFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc, DeploymentsFile)) from None


def read_yaml_mapping(
    path: Path, *, what: str = "deployments file", hint: str = " (set PLANNER_CONFIG)"
) -> dict:
    """A YAML file's top-level mapping; every failure is one ConfigError naming the file."""
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found{hint}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with a 'deployments' list")
    return raw
