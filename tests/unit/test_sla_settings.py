"""Every `scaling:` field of a deployment reaches SLA scaling's settings, unchanged."""

from __future__ import annotations

from pathlib import Path

import yaml

from app.config import ScalingConfig, load_deployments
from app.planner_setup import sla_settings
from tests.support import demo_config

# Fields that choose or pace the algorithm rather than tune it: the worker reads them itself.
_NOT_SETTINGS = {"algorithm", "interval_s"}


def _plain(value: object) -> object:
    """A nested section (scale_to_zero) as the dict the file gives."""
    return value.model_dump() if hasattr(value, "model_dump") else value


def test_every_scaling_field_reaches_the_settings_with_its_value(tmp_path: Path) -> None:
    # A value unlike its default for every field, so that a field left out would keep the default.
    given = {
        "algorithm": "sla",
        "quantile": 0.95,
        "prefill_max_utilisation": 0.8,
        "decode_itl_margin": 0.9,
        "decode_peak_quantile": 0.97,
        "level_window_s": 30.0,
        "burst_window_s": 15.0,
        "trend_window_s": 90.0,
        "lookback_s": 400.0,
        "scale_down_window_s": 90.0,
        "scale_down_window_leads": 3.0,
        "startup_estimate_s": 45.0,
        "sizing": "attainment",
        "forecast_cap": 3.0,
        "trend": False,
        "history_s": 900.0,
        "growth_quantile": 0.8,
        "growth_neighbour_share": 0.5,
        "growth_regression": False,
        "cold_start_growth": 2.0,
        "dispersion_prior_s": 30.0,
        "latency_prior_records": 25.0,
        "latency_half_life_s": 300.0,
        "latency_caution_z": 1.0,
        "busy_check_min": 0.7,
        "quiet_fraction": 0.05,
        "quiet_keep_probability": 0.4,
        "scale_to_zero": {"enabled": True, "quiet_s": 300.0, "respect_return_forecast": True},
    }
    defaults = ScalingConfig()
    assert set(given) | {"interval_s"} == set(ScalingConfig.model_fields)
    assert all(given[k] != _plain(getattr(defaults, k)) for k in given)
    path = tmp_path / "deployments.yaml"
    # Scale to zero needs both minimums at 0 (app/config.py).
    zero_minimums = {
        "prefill": {"min_replicas": 0, "max_replicas": 8},
        "decode": {"min_replicas": 0, "max_replicas": 8},
    }
    path.write_text(yaml.safe_dump(demo_config(scaling=given, **zero_minimums)))
    deployment = load_deployments(path).deployments[0]

    settings = sla_settings(deployment, None)

    tuned = {k: v for k, v in given.items() if k not in _NOT_SETTINGS}
    assert {k: _plain(getattr(settings, k)) for k in tuned} == tuned
    assert (settings.ttft_target_ms, settings.itl_target_ms) == (500, 50)
