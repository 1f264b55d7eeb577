"""`ForwardPassPerfModelConfig` and `RustForwardPassPerfModel`, as ai-dynamo 1.6.1's planner
imports them from `aisimulate_core.sdk`, over aiconfigurator-core 0.12.0's compiled model."""

from __future__ import annotations

from copy import deepcopy
from dataclasses import asdict, dataclass, field
from typing import Any

from aiconfigurator_core.sdk import RustForwardPassPerfModel as _AicModel

__all__ = ["ForwardPassPerfModelConfig", "RustForwardPassPerfModel"]

# What Dynamo's planner passes as options (ais_adapter._build_options), and what
# aiconfigurator-core's model takes as its options JSON.
_OPTION_KEYS = (
    "max_observations",
    "min_observations",
    "bucket_count",
    "max_num_tokens",
    "max_batch_size",
    "max_kv_tokens",
    "min_faster_correction_factor",
    "max_slower_correction_factor",
)


@dataclass
class ForwardPassPerfModelConfig:
    """The estimator config Dynamo builds per role (fields it reads; extra keys are kept)."""

    model: str
    system: str
    backend: str = "vllm"
    worker_type: str = "decode"
    estimation_mode: str | None = None
    backend_version: str | None = None
    tp: int = 1
    pp: int = 1
    attention_dp: int = 1
    kv_block_size: int | None = None
    nextn: int = 0
    estimator_config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_legacy_engine_config(
        cls, legacy: dict[str, Any], worker_type: str, options: dict[str, Any] | None = None
    ) -> ForwardPassPerfModelConfig:
        """The legacy (engine config, options) pair as one config; the options become the
        `estimator_config`, the form aiconfigurator-core's model takes."""
        return cls(
            model=str(legacy.get("model_name", "")),
            system=str(legacy.get("system_name", "")),
            backend=str(legacy.get("backend", "vllm")),
            worker_type=worker_type,
            tp=int(legacy.get("tp_size", 1) or 1),
            pp=int(legacy.get("pp_size", 1) or 1),
            estimator_config={k: v for k, v in (options or {}).items() if k in _OPTION_KEYS},
        )


def _options(config: dict[str, Any]) -> dict[str, Any]:
    raw = config.get("estimator_config") or {}
    return {k: deepcopy(v) for k, v in raw.items() if k in _OPTION_KEYS and v is not None}


class RustForwardPassPerfModel:
    """aiconfigurator-core's forward-pass model behind aisimulate's one-argument constructors."""

    @staticmethod
    def best_available(config: dict[str, Any], options: dict[str, Any] | None = None) -> _AicModel:
        opts = {**_options(config), **(options or {})}
        if config.get("estimation_mode") == "fpm_regression" or config.get("system") == "unprofiled":
            return _AicModel.from_regression(opts)
        native = {k: v for k, v in config.items() if k != "estimator_config"}
        return _AicModel.best_available(native, opts)

    @staticmethod
    def from_regression(options: dict[str, Any] | None = None) -> _AicModel:
        return _AicModel.from_regression(options)

    @staticmethod
    def from_native(config: dict[str, Any], options: dict[str, Any] | None = None) -> _AicModel:
        native = {k: v for k, v in config.items() if k != "estimator_config"}
        return _AicModel.from_native(native, {**_options(config), **(options or {})})
