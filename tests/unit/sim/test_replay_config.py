"""The replay file: a deployments file plus a `simulation:` section, and the flags over it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.config import ConfigError
from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides

ROOT = Path(__file__).resolve().parents[3]


def _write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "replay.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _raw() -> dict:
    return yaml.safe_load(DEFAULT_REPLAY_CONFIG.read_text())


def test_the_shipped_file_has_the_benchmark_targets() -> None:
    config = load_replay_config(DEFAULT_REPLAY_CONFIG)
    assert (config.deployment.sla.ttft_ms, config.deployment.sla.itl_ms) == (1000, 30)
    assert config.simulation.startup_delay_s == 120
    assert (
        config.resolve(config.deployment.profile)
        == ROOT / "examples" / "../data/profiles/h200-llama3.1-8b-fp8"
    )
    assert config.resolve(config.deployment.profile).resolve() == ROOT / "data/profiles/h200-llama3.1-8b-fp8"


def test_a_bad_simulation_field_is_named(tmp_path: Path) -> None:
    raw = _raw()
    raw["simulation"]["startup_delay_s"] = -1
    with pytest.raises(ConfigError, match=r"replay.yaml: simulation.startup_delay_s: "):
        load_replay_config(_write(tmp_path, raw))
    raw = _raw()
    raw["simulation"]["typo"] = 1
    with pytest.raises(ConfigError, match=r"simulation: unknown key 'typo' \(known keys: "):
        load_replay_config(_write(tmp_path, raw))


def test_a_bad_deployment_field_is_named_as_planner_serve_names_it(tmp_path: Path) -> None:
    raw = _raw()
    raw["deployments"][0]["sla"]["ttft_ms"] = 0
    with pytest.raises(ConfigError, match=r"deployments\[0\]\.sla\.ttft_ms"):
        load_replay_config(_write(tmp_path, raw))


def test_deployment_choice(tmp_path: Path) -> None:
    raw = _raw()
    second = dict(raw["deployments"][0], name="other")
    raw["deployments"].append(second)
    path = _write(tmp_path, raw)
    with pytest.raises(ConfigError, match="2 deployments .*pick one with --deployment"):
        load_replay_config(path)
    assert load_replay_config(path, "other").deployment.name == "other"
    with pytest.raises(ConfigError, match="no deployment named 'nope'"):
        load_replay_config(path, "nope")


def test_only_disaggregated_deployments_with_a_profile(tmp_path: Path) -> None:
    raw = _raw()
    raw["deployments"][0]["mode"] = "agg"
    raw["deployments"][0]["scaling"] = {"algorithm": "seed"}  # SLA scaling refuses agg itself
    with pytest.raises(ConfigError, match="mode agg: the simulator models disaggregated serving only"):
        load_replay_config(_write(tmp_path, raw))
    raw = _raw()
    del raw["deployments"][0]["profile"]
    with pytest.raises(ConfigError, match="profile: required for replay"):
        load_replay_config(_write(tmp_path, raw))


def test_a_missing_file_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"nope.yaml: replay file not found$"):
        load_replay_config("nope.yaml")


def test_flags_override_single_fields_and_keep_the_rest() -> None:
    config = load_replay_config(DEFAULT_REPLAY_CONFIG)
    changed = with_overrides(
        config, ttft_ms=500, prefill_gpus=2, startup_delay_s=30, truth_scale=1.2, seed=7, rate_scale=30
    )
    d = changed.deployment
    assert (d.sla.ttft_ms, d.sla.itl_ms) == (500, 30)
    assert (d.prefill.gpus_per_engine, d.decode.gpus_per_engine) == (2, 1)
    assert d.prefill.max_replicas == config.deployment.prefill.max_replicas
    sim = changed.simulation
    assert (sim.startup_delay_s, sim.truth_scale, sim.seed, sim.rate_scale) == (30, 1.2, 7, 30)
    assert sim.reactive == config.simulation.reactive
    assert with_overrides(config) == config
