"""Service settings (environment) and the deployments file (YAML), both validated at start-up.

Settings come from `PLANNER_*` variables (`settings.py`); the deployments file lists what the
planner manages: each deployment (`deployment.py`) and the fleet over them (`fleet.py`), read
and validated as one file (`files.py`). A bad value stops start-up with one message that names
the field (`ConfigError`, `base.py`).
"""

from app.config.base import REPO_ROOT, ConfigError, Strict
from app.config.deployment import (
    ConnectorConfig,
    DeploymentConfig,
    FpmDiscoveryConfig,
    KubernetesConnectorConfig,
    LoadConfig,
    NoneConnectorConfig,
    PredictorConfig,
    PrometheusSource,
    RoleConfig,
    ScalingConfig,
    SlaTargets,
    SourcesConfig,
    ThroughputConfig,
    VirtualConnectorConfig,
)
from app.config.files import (
    DeploymentsFile,
    format_validation_error,
    load_deployments,
    read_yaml_mapping,
    validate_deployments,
)
from app.config.fleet import CapacityShape, FleetConfig, FleetMemberConfig, VariantConfig
from app.config.settings import ApiRole, Settings, load_settings

__all__ = [
    "REPO_ROOT",
    "ApiRole",
    "CapacityShape",
    "ConfigError",
    "ConnectorConfig",
    "DeploymentConfig",
    "DeploymentsFile",
    "FleetConfig",
    "FleetMemberConfig",
    "FpmDiscoveryConfig",
    "KubernetesConnectorConfig",
    "LoadConfig",
    "NoneConnectorConfig",
    "PredictorConfig",
    "PrometheusSource",
    "RoleConfig",
    "ScalingConfig",
    "Settings",
    "SlaTargets",
    "SourcesConfig",
    "Strict",
    "ThroughputConfig",
    "VariantConfig",
    "VirtualConnectorConfig",
    "format_validation_error",
    "load_deployments",
    "load_settings",
    "read_yaml_mapping",
    "validate_deployments",
]
