"""What a deployment may say about SLA scaling: a few settings, each reaching the decision
unchanged; the model's parameters are not the deployments file's to set."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.config import ConfigError, ScalingConfig, SlaTargets, load_deployments
from app.core.sla.settings import BURST_TICKS, LEVEL_TICKS, TREND_TICKS, SlaModel
from app.planner_setup import sla_settings
from tests.support import demo_config

# Fields that choose or pace the algorithm rather than tune it: the worker reads them itself.
_NOT_SETTINGS = {"algorithm", "interval_s"}
# Scale to zero needs both minimums at 0 (app/config/deployment.py).
_ZERO_MINIMUMS = {
    "prefill": {"min_replicas": 0, "max_replicas": 8},
    "decode": {"min_replicas": 0, "max_replicas": 8},
}


def _plain(value: object) -> object:
    """A nested section (scale_to_zero) as the dict the file gives."""
    return value.model_dump() if hasattr(value, "model_dump") else value


def _load(tmp_path: Path, **config: object):
    path = tmp_path / "deployments.yaml"
    path.write_text(yaml.safe_dump(demo_config(**config)))
    return load_deployments(path).deployments[0]


def test_a_deployment_has_at_most_ten_sla_settings() -> None:
    # The targets, the interval and the scaling: section's SLA fields: what a user reads and sets.
    user_facing = set(SlaTargets.model_fields) | set(ScalingConfig.model_fields) - {"algorithm"}
    assert len(user_facing) <= 10, sorted(user_facing)
    assert "attainment_target" in user_facing


def test_every_scaling_field_reaches_the_settings_with_its_value(tmp_path: Path) -> None:
    # A value unlike its default for every field, so that a field left out would keep the default.
    given = {
        "algorithm": "sla",
        "scale_down_window_s": 90.0,
        "startup_estimate_s": 45.0,
        "sizing": "attainment",
        "forecast_cap": 3.0,
        "trend": False,
        "scale_to_zero": {"enabled": True, "quiet_s": 300.0, "respect_return_forecast": True},
    }
    defaults = ScalingConfig()
    assert set(given) | {"interval_s"} == set(ScalingConfig.model_fields)
    assert all(given[k] != _plain(getattr(defaults, k)) for k in given)
    deployment = _load(
        tmp_path,
        scaling=given,
        sla={"ttft_ms": 500, "itl_ms": 50, "attainment_target": 0.95},
        **_ZERO_MINIMUMS,
    )

    settings = sla_settings(deployment, None)

    tuned = {k: v for k, v in given.items() if k not in _NOT_SETTINGS}
    assert {k: _plain(getattr(settings, k)) for k in tuned} == tuned
    assert (settings.ttft_target_ms, settings.itl_target_ms, settings.attainment_target) == (500, 50, 0.95)
    # One target: the prompts' quantile and decode's peak quantile are the attainment target.
    assert (settings.quantile, settings.decode_peak_quantile) == (0.95, 0.95)


@pytest.mark.parametrize(
    "interval_s, why",
    [
        (5.0, "the default interval: 10 s bursts, a 20 s level window, a 60 s trend"),
        (1.0, "a fast tick reads its windows over as many counts, five times shorter"),
        (30.0, "a slow tick cannot read a burst shorter than its own counts"),
    ],
)
def test_the_windows_count_ticks(tmp_path: Path, interval_s: float, why: str) -> None:
    deployment = _load(tmp_path, scaling={"algorithm": "sla", "interval_s": interval_s})

    settings = sla_settings(deployment, None)

    windows = (settings.burst_window_s, settings.level_window_s, settings.trend_window_s)
    assert windows == (BURST_TICKS * interval_s, LEVEL_TICKS * interval_s, TREND_TICKS * interval_s), why
    # Every other parameter of the model is its documented default.
    rest = set(SlaModel.model_fields) - {"burst_window_s", "level_window_s", "trend_window_s"}
    assert {k: getattr(settings, k) for k in rest} == {k: getattr(SlaModel(), k) for k in rest}, why


def test_the_default_windows_are_the_models_defaults_at_the_default_interval() -> None:
    # A test or the ablation bench building SlaModel() reads the same windows as a deployment
    # ticking at the default interval.
    at_default = SlaModel.for_interval(ScalingConfig().interval_s)
    assert at_default == SlaModel()


@pytest.mark.parametrize(
    "field, why",
    [
        ("growth_quantile", "a parameter of the forecast, not the deployment's"),
        ("quantile", "the attainment target is the one share a deployment states"),
        ("level_window_s", "the windows follow the interval"),
    ],
)
def test_a_model_parameter_in_the_file_is_refused_by_name(tmp_path: Path, field: str, why: str) -> None:
    with pytest.raises(ConfigError) as raised:
        _load(tmp_path, scaling={"algorithm": "sla", field: 0.5})
    message = str(raised.value)
    assert "deployments[0].scaling" in message and f"unknown key '{field}'" in message, why
