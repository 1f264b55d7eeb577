"""Contract test: docker-compose.yml is a valid Compose file and wires the stack together.

No Docker engine is available in CI, so the file is validated against the official
Compose Specification JSON schema vendored in tests/contract/data/ (see its README.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
SCHEMA_FILE = Path(__file__).parent / "data" / "compose-spec.json"


@pytest.fixture(scope="module")
def compose() -> dict:
    with COMPOSE_FILE.open(encoding="utf-8") as f:
        data = yaml.safe_load(f)
    assert isinstance(data, dict), "docker-compose.yml must be a mapping"
    return data


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # ["KEY=value", ...] form
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def test_compose_file_matches_compose_spec_schema(compose: dict) -> None:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    validator = validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.absolute_path))
    assert not errors, "docker-compose.yml violates the Compose spec:\n" + "\n".join(
        f"  at {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors
    )


def test_no_obsolete_version_key(compose: dict) -> None:
    assert "version" not in compose


def test_services_present(compose: dict) -> None:
    assert {"planner", "postgres", "prometheus"} <= set(compose["services"])


def test_planner_uses_postgres_service(compose: dict) -> None:
    services = compose["services"]
    planner = services["planner"]
    env = _environment(planner)

    url = urlsplit(env["PLANNER_DATABASE_URL"])
    assert url.scheme == "postgresql+psycopg"
    assert url.hostname == "postgres"
    assert url.port in (None, 5432)

    pg_env = _environment(services["postgres"])
    assert url.username == pg_env["POSTGRES_USER"]
    assert url.password == pg_env["POSTGRES_PASSWORD"]
    assert url.path.lstrip("/") == pg_env["POSTGRES_DB"]

    depends = planner["depends_on"]
    assert isinstance(depends, dict), "planner must wait for postgres to be healthy"
    assert depends["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in services["postgres"]

    # Binding 0.0.0.0 without tokens is refused by the app.
    assert env.get("PLANNER_HOST") == "0.0.0.0"
    assert env.get("PLANNER_API_TOKENS")
    assert env["PLANNER_CONFIG"].startswith("/srv/planner/"), "config must come from the image's repo copy"


def _bind_mount_sources(service: dict) -> dict[str, Path]:
    """Map container path -> host path for the service's relative bind mounts."""
    mounts: dict[str, Path] = {}
    for vol in service.get("volumes", []):
        if isinstance(vol, str):
            source, target = vol.split(":")[:2]
        else:
            source, target = vol.get("source", ""), vol["target"]
        if source.startswith((".", "/")):
            mounts[target] = (REPO / source).resolve() if source.startswith(".") else Path(source)
    return mounts


def test_prometheus_config_exists_and_scrapes_planner(compose: dict) -> None:
    prometheus = compose["services"]["prometheus"]
    mounts = _bind_mount_sources(prometheus)
    config_path = mounts.get("/etc/prometheus/prometheus.yml")
    assert config_path is not None, "prometheus.yml must be mounted at /etc/prometheus/prometheus.yml"
    assert config_path.is_file(), f"{config_path} does not exist"

    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    jobs = [
        job
        for job in config["scrape_configs"]
        if any("planner:8080" in sc.get("targets", []) for sc in job.get("static_configs", []))
    ]
    assert jobs, "no scrape job targets planner:8080"
    job = jobs[0]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    interval = job.get("scrape_interval", config.get("global", {}).get("scrape_interval"))
    assert interval == "15s"
