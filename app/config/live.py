"""The settings of a deployment that may change while it runs (`PATCH /deployments/{name}/settings`).

The deployments file gives every setting its value; the store may override the live ones. A
change is a JSON merge patch (RFC 7386) over the stored overrides: a value sets a field, `null`
returns it to the file's value. The result is validated as the file is (`DeploymentConfig`), so a
change that the file could not say is refused with the field it names.

What may change live is what the next tick can apply by reading new numbers: the SLA targets,
the replica bounds, the GPU budget, and how SLA scaling sizes. Not live: the connector, the
sources, the profile, the mode and the GPUs per engine (each is an object built at start-up:
a client, a subscriber, a fitted model), nor the algorithm and the tick interval (the learned
state and its windows are counted in ticks of one algorithm).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from app.config.deployment import DeploymentConfig
from app.core.errors import InvalidInputError
from app.core.types import ALL_ROLES

_ROLE_FIELDS = ("min_replicas", "max_replicas")
_SCALING_FIELDS = ("sizing", "trend", "startup_estimate_s", "scale_down_window_s", "forecast_cap")
_SCALE_TO_ZERO_FIELDS = ("enabled", "quiet_s", "respect_return_forecast")

# Dotted paths of every field a PATCH may set.
LIVE_FIELDS: tuple[str, ...] = (
    "sla.ttft_ms",
    "sla.itl_ms",
    "sla.attainment_target",
    *(f"{role}.{name}" for role in ALL_ROLES for name in _ROLE_FIELDS),
    "gpu_budget",
    *(f"scaling.{name}" for name in _SCALING_FIELDS),
    *(f"scaling.scale_to_zero.{name}" for name in _SCALE_TO_ZERO_FIELDS),
)
_SECTIONS = {path.rsplit(".", 1)[0] for path in LIVE_FIELDS if "." in path} | {"scaling.scale_to_zero"}


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path in _SECTIONS:
            flat.update(_flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, leaf = path.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def _field_of(path: str, config: DeploymentConfig) -> Any:
    node: Any = config
    for part in path.split("."):
        node = getattr(node, part)
    return node


def live_paths(config: DeploymentConfig) -> list[str]:
    """The live fields of this deployment (its mode's roles only)."""
    roles = set(config.roles)
    return [p for p in LIVE_FIELDS if p.split(".")[0] not in ALL_ROLES or p.split(".")[0] in roles]


def live_values(config: DeploymentConfig) -> dict[str, Any]:
    """The live fields' values, nested as in the deployments file."""
    return _nest({path: _field_of(path, config) for path in live_paths(config)})


def merge_patch(stored: dict[str, Any], patch: Any, config: DeploymentConfig) -> dict[str, Any]:
    """The stored overrides after `patch` (nested, as the file): unknown fields and non-objects
    are refused naming the field (`body.<path>`); `null` drops a field's override."""
    if not isinstance(patch, dict):
        raise InvalidInputError(
            "body", 'a JSON object of the settings to change, e.g. {"sla": {"ttft_ms": 400}}'
        )
    allowed = set(live_paths(config))
    merged = _flatten(stored)
    changes = _flatten(patch)
    if not changes:
        raise InvalidInputError("body", "nothing to change: name at least one live setting")
    for path, value in changes.items():
        if path not in allowed:
            raise InvalidInputError(f"body.{path}", _not_live(path, config))
        if value is None:
            merged.pop(path, None)
        else:
            merged[path] = value
    return _nest(merged)


def _not_live(path: str, config: DeploymentConfig) -> str:
    top = path.split(".")[0]
    if top in ALL_ROLES and top not in config.roles:
        return f"a {config.mode} deployment has no {top} role"
    if path in _SECTIONS:
        return "an object of the fields to change"
    return f"not a setting that changes live (live: {', '.join(live_paths(config))})"


def apply_overrides(config: DeploymentConfig, overrides: dict[str, Any]) -> DeploymentConfig:
    """The file's deployment with the stored overrides applied, validated as the file is.
    Raises InvalidInputError naming the first field the result gets wrong (`body.<path>`)."""
    if not overrides:
        return config
    data = config.model_dump(exclude_unset=False)
    for path, value in _flatten(overrides).items():
        *parents, leaf = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[leaf] = value
    try:
        return DeploymentConfig.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = ".".join(str(p) for p in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        # A rule across fields (min above max, scale to zero's minimums) names its field itself.
        field, _, rest = message.partition(": ")
        if not loc and rest and field in LIVE_FIELDS:
            loc, message = field, rest
        elif loc in ALL_ROLES and message.startswith("min_replicas"):
            loc = f"{loc}.min_replicas"
        return _raise(loc, message)


def running_config(
    config: DeploymentConfig, overrides: dict[str, Any]
) -> tuple[DeploymentConfig, str | None]:
    """What runs: the file's deployment with the stored overrides, or, when the file changed
    under them and no longer accepts them, the file's deployment and why."""
    try:
        return apply_overrides(config, overrides), None
    except InvalidInputError as exc:
        return config, f"{exc.field.removeprefix('body.')}: {exc.detail}"


def _raise(loc: str, message: str) -> DeploymentConfig:
    raise InvalidInputError(f"body.{loc}" if loc else "body", message)


def sources_of(config: DeploymentConfig, overrides: dict[str, Any]) -> dict[str, str]:
    """Per live field, where its value comes from: `store` (an override) or `file`."""
    stored = _flatten(overrides)
    return {path: "store" if path in stored else "file" for path in live_paths(config)}
