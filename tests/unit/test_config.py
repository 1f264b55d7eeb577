"""The deployments file and the service settings: a bad value is one ConfigError naming the field."""

from __future__ import annotations

import copy
import logging
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from app.config import ConfigError, DeploymentConfig, Settings, load_deployments, load_settings
from tests.support import REPO_ROOT, demo_config

# --- the deployments file -------------------------------------------------------------------------


def test_shipped_example_loads() -> None:
    loaded = load_deployments(REPO_ROOT / "examples" / "planner.yaml")
    assert [d.name for d in loaded.deployments] == ["demo"]
    demo = loaded.deployments[0]
    assert (demo.mode, demo.connector.type, demo.roles) == ("disagg", "virtual", ("prefill", "decode"))
    assert demo.connector.ack_timeout_s == 1800
    assert (demo.sla.ttft_ms, demo.sla.itl_ms) == (500, 50)
    assert (demo.prefill.min_replicas, demo.prefill.max_replicas) == (1, 8)
    assert (demo.decode.min_replicas, demo.decode.max_replicas) == (1, 8)


def test_minimal_file_takes_defaults(tmp_path: Path) -> None:
    path = tmp_path / "minimal.yaml"
    path.write_text(
        "deployments:\n  - name: a1\n    connector: {type: none}\n    sla: {ttft_ms: 200, itl_ms: 20}\n"
    )
    d = load_deployments(path).deployments[0]
    assert (d.name, d.mode, d.connector.type, d.connector.ack_timeout_s) == ("a1", "disagg", "none", 1800.0)
    assert d.tick_interval_s == 180.0


@pytest.mark.parametrize(
    ("connector", "shadow", "awaits_ack"),
    [
        ({"type": "virtual"}, False, True),
        ({"type": "virtual", "mode": "shadow"}, True, False),
        ({"type": "kubernetes", "dgd_name": "x", "mode": "shadow"}, True, False),
        ({"type": "none"}, False, False),
    ],
    ids=["virtual_control_by_default", "virtual_shadow", "kubernetes_shadow", "none"],
)
def test_connector_mode(connector: dict[str, Any], shadow: bool, awaits_ack: bool) -> None:
    """Shadow mode is off by default; a shadow decision is awaited by nobody."""
    d = DeploymentConfig.model_validate({**demo_config()["deployments"][0], "connector": connector})
    assert (d.shadow, d.awaits_ack) == (shadow, awaits_ack)


def _mutated(mutate: Callable[[dict[str, Any]], None]) -> str:
    config = copy.deepcopy(demo_config())
    mutate(config)
    return yaml.safe_dump(config, sort_keys=False)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set a dotted path under deployments[0]: _set("sla.ttft_ms", -1)."""

    def mutate(config: dict[str, Any]) -> None:
        node = config["deployments"][0]
        *parents, last = path.split(".")
        for key in parents:
            node = node[key]
        node[last] = value

    return mutate


def _duplicate(config: dict[str, Any]) -> None:
    config["deployments"].append(copy.deepcopy(config["deployments"][0]))


@dataclass(frozen=True)
class BadFileCase:
    name: str
    why: str
    content: str | bytes | None  # None: the file does not exist
    # Text the message must hold after "<file>: "; the file name is checked for every case.
    expected: list[str]


BAD_FILE_CASES = [
    BadFileCase(
        "not_yaml",
        "a syntax error names the line",
        "deployments: [\n  - name: x\n  bad: : :",
        ["line 2", "not valid YAML"],
    ),
    BadFileCase("missing_file", "the path is wrong", None, ["not found", "PLANNER_CONFIG"]),
    BadFileCase("empty_file", "an empty file is not a mapping", "", ["expected a mapping", "deployments"]),
    BadFileCase("top_level_list", "a list is not a mapping", "- name: demo\n", ["expected a mapping"]),
    BadFileCase("top_level_scalar", "a string is not a mapping", "demo\n", ["expected a mapping"]),
    BadFileCase(
        "no_deployments",
        "an empty list manages nothing",
        "deployments: []\n",
        ["deployments:", "at least 1 item"],
    ),
    BadFileCase(
        "typo_in_sla",
        "a typo must not be silently ignored",
        _mutated(_set("sla.ttft_msec", 500)),
        ["deployments[0].sla: unknown key 'ttft_msec' (did you mean 'ttft_ms'?)"],
    ),
    BadFileCase(
        "typo_at_deployment_level",
        "a misspelt top-level key of a deployment",
        _mutated(_set("min_replica", 1)),
        ["deployments[0]: unknown key 'min_replica' (known keys: name, mode, connector, sla, "],
    ),
    BadFileCase(
        "negative_ttft",
        "latency targets are positive",
        _mutated(_set("sla.ttft_ms", -5)),
        ["deployments[0].sla.ttft_ms:", "greater than 0"],
    ),
    BadFileCase(
        "zero_itl",
        "zero is not a target either",
        _mutated(_set("sla.itl_ms", 0)),
        ["deployments[0].sla.itl_ms:", "greater than 0"],
    ),
    BadFileCase(
        "missing_sla",
        "the SLA is required",
        _mutated(lambda c: c["deployments"][0].pop("sla")),
        ["deployments[0].sla:", "Field required"],
    ),
    BadFileCase(
        "min_above_max",
        "bounds that admit nothing",
        _mutated(_set("prefill.min_replicas", 9)),
        ["deployments[0].prefill:", "min_replicas (9) is above max_replicas (8)"],
    ),
    BadFileCase(
        "negative_min_replicas",
        "counts are not negative",
        _mutated(_set("decode.min_replicas", -1)),
        ["deployments[0].decode.min_replicas:", "greater than or equal to 0"],
    ),
    BadFileCase(
        "duplicate_names",
        "two deployments may not share a name",
        _mutated(_duplicate),
        ["deployments:", "'demo' appears twice"],
    ),
    BadFileCase(
        "kubernetes_connector_without_dgd",
        "the Kubernetes connector must be told which DynamoGraphDeployment it scales",
        _mutated(_set("connector", {"type": "kubernetes"})),
        # The path as the file spells it, without pydantic's union tag (`connector.kubernetes`).
        ["deployments[0].connector.dgd_name:", "Field required"],
    ),
    BadFileCase(
        "kubernetes_request_timeout_zero",
        "an API call that may not take any time can never answer",
        _mutated(_set("connector", {"type": "kubernetes", "dgd_name": "llm", "request_timeout_s": 0})),
        ["deployments[0].connector.request_timeout_s:", "greater than 0"],
    ),
    BadFileCase(
        "kubernetes_request_timeout_not_a_number",
        "a timeout is a number of seconds",
        _mutated(_set("connector", {"type": "kubernetes", "dgd_name": "llm", "request_timeout_s": "soon"})),
        ["deployments[0].connector.request_timeout_s:", "number"],
    ),
    BadFileCase(
        "unknown_connector",
        "connectors are virtual, none and kubernetes",
        _mutated(_set("connector", {"type": "slurm"})),
        ["deployments[0].connector:", "'slurm'", "'virtual', 'none', 'kubernetes'"],
    ),
    BadFileCase(
        "connector_typo",
        "unknown connector settings are rejected",
        _mutated(_set("connector", {"type": "virtual", "ack_timeout": 5})),
        ["deployments[0].connector: unknown key 'ack_timeout' (did you mean 'ack_timeout_s'?)"],
    ),
    BadFileCase(
        "bad_name_uppercase",
        "names are DNS labels",
        _mutated(_set("name", "Demo_1")),
        ["deployments[0].name:", "should match pattern"],
    ),
    BadFileCase(
        "bad_name_trailing_dash",
        "a DNS label does not end with a dash",
        _mutated(_set("name", "demo-")),
        ["deployments[0].name:", "should match pattern"],
    ),
    BadFileCase(
        "bad_mode",
        "modes are a closed set",
        _mutated(_set("mode", "split")),
        ["deployments[0].mode:", "'disagg', 'agg', 'prefill' or 'decode'"],
    ),
    BadFileCase(
        "sensitivity_above_one",
        "sensitivity is a fraction",
        _mutated(_set("load", {"sensitivity": 1.5})),
        ["deployments[0].load.sensitivity:", "less than or equal to 1"],
    ),
    BadFileCase(
        "sla_scaling_in_agg_mode",
        "SLA scaling sizes prefill and decode; aggregated workers keep the seed",
        _mutated(lambda c: (_set("mode", "agg")(c), _set("scaling", {"algorithm": "sla"})(c))),
        ["deployments[0]:", "scaling.algorithm: sla sizes prefill and decode engines; mode agg needs"],
    ),
    BadFileCase(
        "sla_unknown_algorithm",
        "algorithms are a closed set",
        _mutated(_set("scaling", {"algorithm": "magic"})),
        ["deployments[0].scaling.algorithm:", "'sla' or 'seed'"],
    ),
    BadFileCase(
        "none_connector_has_no_mode",
        "shadow mode reads what runs through the virtual or Kubernetes connector; the advisory "
        "connector reads nothing to compare with, so a mode there is refused, not ignored",
        _mutated(_set("connector", {"type": "none", "mode": "shadow"})),
        ["deployments[0].connector: unknown key 'mode'"],
    ),
    BadFileCase(
        "unknown_connector_mode",
        "the modes are a closed set",
        _mutated(_set("connector", {"type": "virtual", "mode": "spy"})),
        ["deployments[0].connector.mode:", "'control' or 'shadow'"],
    ),
    BadFileCase(
        "not_utf8",
        "undecodable bytes are a bad file, not a traceback",
        b"deployments:\n  - name: \xff\xfe\n",
        ["deployments"],
    ),
]


@pytest.mark.parametrize("case", BAD_FILE_CASES, ids=lambda c: c.name)
def test_bad_deployments_file(case: BadFileCase, tmp_path: Path) -> None:
    path = tmp_path / f"{case.name}.yaml"
    if isinstance(case.content, bytes):
        path.write_bytes(case.content)
    elif case.content is not None:
        path.write_text(case.content)
    with pytest.raises(ConfigError) as info:
        load_deployments(path)
    message = str(info.value)
    assert message.startswith(f"{path}:"), case.why
    for part in case.expected:
        assert part in message, f"{case.why}: {part!r} not in {message!r}"
    assert "\n" not in message


def test_directory_instead_of_file(tmp_path: Path) -> None:
    """PLANNER_CONFIG pointing at a directory is a bad setting: one ConfigError, not an OSError."""
    with pytest.raises(ConfigError) as info:
        load_deployments(tmp_path)
    assert str(info.value).startswith(f"{tmp_path}:")


def test_only_the_first_of_several_errors_is_detailed(tmp_path: Path) -> None:
    def two_errors(config: dict[str, Any]) -> None:
        config["deployments"][0]["sla"] = {"ttft_ms": -1, "itl_ms": -1}

    path = tmp_path / "two.yaml"
    path.write_text(_mutated(two_errors))
    with pytest.raises(ConfigError) as info:
        load_deployments(path)
    assert str(info.value) == (
        f"{path}: deployments[0].sla.ttft_ms: Input should be greater than 0 (and 1 more)"
    )


def test_an_unknown_key_is_named_not_the_key_it_hides(tmp_path: Path) -> None:
    """`ttft:` for `ttft_ms:` was reported as "ttft_ms: Field required", the typo unmentioned.
    Now the unknown key comes first, with the key it probably meant; the missing key it explains
    is not counted as a second problem, but an unrelated one is."""

    def typo(config: dict[str, Any]) -> None:
        config["deployments"][0]["sla"] = {"ttft": 500, "itl_ms": 50}

    path = tmp_path / "typo.yaml"
    path.write_text(_mutated(typo))
    with pytest.raises(ConfigError) as info:
        load_deployments(path)
    assert str(info.value) == f"{path}: deployments[0].sla: unknown key 'ttft' (did you mean 'ttft_ms'?)"

    def typo_and_more(config: dict[str, Any]) -> None:
        config["deployments"][0]["sla"] = {"ttft": 500, "itl_ms": -1}

    path.write_text(_mutated(typo_and_more))
    with pytest.raises(ConfigError) as info:
        load_deployments(path)
    assert str(info.value) == (
        f"{path}: deployments[0].sla: unknown key 'ttft' (did you mean 'ttft_ms'?) (and 1 more)"
    )


# --- settings -------------------------------------------------------------------------------------


def settings(**given: Any) -> Settings:
    """Every field explicit, so PLANNER_* variables of the environment cannot leak in."""
    fields: dict[str, Any] = {
        "database_url": "sqlite:///unused.db",
        "config": "unused.yaml",
        "host": "127.0.0.1",
        "port": 8080,
        "api_tokens": "",
        "api_tokens_file": None,
        "log_level": "INFO",
    }
    fields.update(given)
    return Settings(**fields)


@dataclass(frozen=True)
class TokensCase:
    name: str
    why: str
    api_tokens: str
    file_text: str | None
    expected: dict[str, str]


TOKENS_CASES = [
    TokensCase("none", "no tokens: an open API", "", None, {}),
    TokensCase("one", "role:token", "viewer:abcdefgh", None, {"abcdefgh": "viewer"}),
    TokensCase(
        "several",
        "comma separated",
        "viewer:abcdefgh,orchestrator:orch-1234,operator:op-secret",
        None,
        {"abcdefgh": "viewer", "orch-1234": "orchestrator", "op-secret": "operator"},
    ),
    TokensCase(
        "spaces_and_empty_entries",
        "whitespace and stray commas are tolerated",
        " viewer:abcdefgh , ,operator:op-secret,",
        None,
        {"abcdefgh": "viewer", "op-secret": "operator"},
    ),
    TokensCase(
        "colon_in_token",
        "only the first colon separates",
        "operator:ab:cd:ef:gh",
        None,
        {"ab:cd:ef:gh": "operator"},
    ),
    TokensCase(
        "file_only",
        "one entry a line; comments and blank lines skipped",
        "",
        "# planner tokens\n\nviewer:abcdefgh\n  # indented comment\noperator:op-secret\n",
        {"abcdefgh": "viewer", "op-secret": "operator"},
    ),
    TokensCase(
        "env_and_file",
        "both sources are merged",
        "orchestrator:orch-1234",
        "viewer:abcdefgh\n",
        {"orch-1234": "orchestrator", "abcdefgh": "viewer"},
    ),
]


@pytest.mark.parametrize("case", TOKENS_CASES, ids=lambda c: c.name)
def test_tokens(case: TokensCase, tmp_path: Path) -> None:
    tokens_file = None
    if case.file_text is not None:
        tokens_file = tmp_path / "tokens"
        tokens_file.write_text(case.file_text)
    s = settings(api_tokens=case.api_tokens, api_tokens_file=str(tokens_file) if tokens_file else None)
    assert s.tokens() == case.expected, case.why


@dataclass(frozen=True)
class BadTokensCase:
    name: str
    why: str
    api_tokens: str
    file_text: str | None
    expected: str  # the exact message
    secret: str | None = None  # a secret that must not be echoed


BAD_TOKENS_CASES = [
    BadTokensCase(
        "bad_role",
        "roles are viewer, orchestrator, operator",
        "admin:abcdefgh",
        None,
        "PLANNER_API_TOKENS: role 'admin' is not one of viewer, orchestrator, operator",
        secret="abcdefgh",
    ),
    BadTokensCase(
        "empty_token",
        "a role without a token",
        "viewer:",
        None,
        "PLANNER_API_TOKENS: entry 1 is not 'role:token'",
    ),
    BadTokensCase(
        "short_token",
        "tokens have at least 8 characters",
        "operator:x7Qz",
        None,
        "PLANNER_API_TOKENS: the operator token is shorter than 8 characters",
        secret="x7Qz",
    ),
    BadTokensCase(
        "bad_line_in_file",
        "the message names both sources when a file is given",
        "",
        "viewer:abcdefgh\nroot:abcdefgh\n",
        "PLANNER_API_TOKENS / PLANNER_API_TOKENS_FILE: role 'root' is not one of viewer, "
        "orchestrator, operator",
    ),
]


@pytest.mark.parametrize("case", BAD_TOKENS_CASES, ids=lambda c: c.name)
def test_bad_tokens(case: BadTokensCase, tmp_path: Path) -> None:
    tokens_file = None
    if case.file_text is not None:
        tokens_file = tmp_path / "tokens"
        tokens_file.write_text(case.file_text)
    s = settings(api_tokens=case.api_tokens, api_tokens_file=str(tokens_file) if tokens_file else None)
    with pytest.raises(ConfigError) as info:
        s.tokens()
    assert str(info.value) == case.expected, case.why
    if case.secret:
        assert case.secret not in str(info.value)


def test_missing_colon_names_the_setting_without_echoing_the_secret() -> None:
    """An entry without a colon is most likely a bare token; error messages end up in logs."""
    with pytest.raises(ConfigError) as info:
        settings(api_tokens="s3cr3t-t0ken-value").tokens()
    message = str(info.value)
    assert message.startswith("PLANNER_API_TOKENS: ")
    assert "role:token" in message
    assert "s3cr3t-t0ken-value" not in message


def test_unreadable_tokens_file(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-file"
    with pytest.raises(ConfigError) as info:
        settings(api_tokens_file=str(missing)).tokens()
    assert str(info.value).startswith(f"PLANNER_API_TOKENS_FILE: cannot read {missing}: ")


@dataclass(frozen=True)
class ExposureCase:
    name: str
    why: str
    host: str
    api_tokens: str
    refused: bool


EXPOSURE_CASES = [
    ExposureCase("loopback_v4_open", "an open API on loopback is allowed", "127.0.0.1", "", False),
    ExposureCase("loopback_v4_other", "all of 127/8 is loopback", "127.0.0.2", "", False),
    ExposureCase("loopback_v6_open", "::1 is loopback", "::1", "", False),
    ExposureCase("localhost_open", "localhost resolves to loopback", "localhost", "", False),
    ExposureCase("all_interfaces_open", "an open API on every interface is refused", "0.0.0.0", "", True),
    ExposureCase("all_interfaces_v6_open", "the IPv6 wildcard too", "::", "", True),
    ExposureCase("lan_address_open", "a private address is not loopback", "10.0.0.5", "", True),
    ExposureCase(
        "hostname_open",
        "a name other than localhost is not known to be loopback",
        "planner.internal",
        "",
        True,
    ),
    ExposureCase(
        "all_interfaces_with_tokens", "with tokens any host is fine", "0.0.0.0", "viewer:abcdefgh", False
    ),
    ExposureCase("lan_with_tokens", "with tokens any host is fine", "10.0.0.5", "operator:op-secret", False),
]


@pytest.mark.parametrize("case", EXPOSURE_CASES, ids=lambda c: c.name)
def test_check_auth_exposure(case: ExposureCase) -> None:
    s = settings(host=case.host, api_tokens=case.api_tokens)
    if case.refused:
        with pytest.raises(ConfigError) as info:
            s.check_auth_exposure()
        assert str(info.value).startswith(
            f"PLANNER_HOST: refusing to listen on {case.host} without API tokens"
        )
        assert "PLANNER_API_TOKENS" in str(info.value)
    else:
        assert s.check_auth_exposure() is None, case.why


def test_open_api_on_loopback_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="app.config"):
        settings(host="127.0.0.1").check_auth_exposure()
    assert [r.getMessage() for r in caplog.records] == [
        "no API tokens configured: the API is open to every local process, listening on 127.0.0.1 only"
    ]


@dataclass(frozen=True)
class UrlCase:
    name: str
    why: str
    given: str
    expected: str | None  # None: rejected


URL_CASES = [
    UrlCase(
        "postgresql_plain",
        "plain postgresql means psycopg 3",
        "postgresql://u:p@h/db",
        "postgresql+psycopg://u:p@h/db",
    ),
    UrlCase(
        "postgres_short",
        "the postgres:// alias too",
        "postgres://u:p@h:5433/db",
        "postgresql+psycopg://u:p@h:5433/db",
    ),
    UrlCase(
        "psycopg_explicit",
        "already explicit: unchanged",
        "postgresql+psycopg://u:p@h/db",
        "postgresql+psycopg://u:p@h/db",
    ),
    UrlCase("sqlite_file", "SQLite unchanged", "sqlite:///planner.db", "sqlite:///planner.db"),
    UrlCase("sqlite_memory", "in-memory SQLite unchanged", "sqlite://", "sqlite://"),
    UrlCase("mysql", "no MySQL driver is installed", "mysql://u:p@h/db", None),
    UrlCase("asyncpg", "only psycopg 3 is installed", "postgresql+asyncpg://u:p@h/db", None),
    UrlCase("bare_path", "a file path is not a URL", "/var/lib/planner.db", None),
]


@pytest.mark.parametrize("case", URL_CASES, ids=lambda c: c.name)
def test_database_url(case: UrlCase) -> None:
    if case.expected is None:
        with pytest.raises(ValidationError) as info:
            settings(database_url=case.given)
        assert [e["loc"] for e in info.value.errors()] == [("database_url",)], case.why
    else:
        assert settings(database_url=case.given).database_url == case.expected, case.why


@pytest.fixture
def planner_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A clean PLANNER_* environment for load_settings."""
    import os

    for key in list(os.environ):
        if key.startswith("PLANNER_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_load_settings_names_the_variable(planner_env: pytest.MonkeyPatch) -> None:
    planner_env.setenv("PLANNER_DATABASE_URL", "mysql://u:p@h/db")
    with pytest.raises(ConfigError) as info:
        load_settings()
    # The validator's own sentence, without pydantic's "Value error, " before it.
    assert str(info.value) == "PLANNER_DATABASE_URL: must start with sqlite:/// or postgresql://"


def test_load_settings_bad_port(planner_env: pytest.MonkeyPatch) -> None:
    planner_env.setenv("PLANNER_PORT", "70000")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == "PLANNER_PORT: Input should be less than or equal to 65535"


def test_load_settings_reads_the_environment(planner_env: pytest.MonkeyPatch) -> None:
    planner_env.setenv("PLANNER_DATABASE_URL", "postgres://u:p@h/db")
    planner_env.setenv("PLANNER_HOST", "0.0.0.0")
    planner_env.setenv("PLANNER_PORT", "9090")
    planner_env.setenv("PLANNER_API_TOKENS", "viewer:abcdefgh")
    s = load_settings()
    assert (s.database_url, s.host, s.port, s.tokens()) == (
        "postgresql+psycopg://u:p@h/db",
        "0.0.0.0",
        9090,
        {"abcdefgh": "viewer"},
    )


@pytest.mark.parametrize(
    ("given", "expected"),
    [("0", None), ("-2", None), ("nan", None), ("inf", None), ("fast", None), ("1", 1.0), ("25.5", 25.5)],
)
def test_time_scale(planner_env: pytest.MonkeyPatch, given: str, expected: float | None) -> None:
    """PLANNER_TIME_SCALE (the demo's accelerated clock) is a finite number > 0."""
    planner_env.setenv("PLANNER_TIME_SCALE", given)
    if expected is None:
        with pytest.raises(ConfigError) as info:
            load_settings()
        assert str(info.value).startswith("PLANNER_TIME_SCALE: ")
    else:
        assert load_settings().time_scale == expected


def test_time_scale_defaults_to_real_time(planner_env: pytest.MonkeyPatch) -> None:
    assert load_settings().time_scale == 1.0


@pytest.mark.parametrize(
    ("ttl", "renew", "error"),
    [
        (None, None, None),  # the defaults: 30 and 10
        ("4", "1", None),
        ("10", "10", "PLANNER_LEASE_RENEW_S: must be shorter than PLANNER_LEASE_TTL_S (10 s)"),
        (None, "45", "PLANNER_LEASE_RENEW_S: must be shorter than PLANNER_LEASE_TTL_S (30 s)"),
        ("0", None, "PLANNER_LEASE_TTL_S: Input should be greater than 0"),
        (None, "-1", "PLANNER_LEASE_RENEW_S: Input should be greater than 0"),
    ],
)
def test_lease_settings(
    planner_env: pytest.MonkeyPatch, ttl: str | None, renew: str | None, error: str | None
) -> None:
    """The worker lease (failover between replicas): renewed before it can expire."""
    for name, value in (("PLANNER_LEASE_TTL_S", ttl), ("PLANNER_LEASE_RENEW_S", renew)):
        if value is not None:
            planner_env.setenv(name, value)
    if error is not None:
        with pytest.raises(ConfigError) as info:
            load_settings()
        assert str(info.value) == error
    else:
        s = load_settings()
        assert (s.lease_ttl_s, s.lease_renew_s) == (float(ttl or 30), float(renew or 10))


def _undescribed(model: type, path: str) -> list[str]:
    """Every field of the deployments file, at any depth, that has no description."""
    missing = []
    for name, info in model.model_fields.items():
        where = f"{path}.{name}"
        if not info.description:
            missing.append(where)
        stack = [info.annotation]
        while stack:
            kind = stack.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                missing += _undescribed(kind, where)
            else:
                stack.extend(typing.get_args(kind))
    return missing


def test_every_field_of_the_deployments_file_is_described() -> None:
    """The descriptions live in one place, beside the fields (pydantic `Field(description=...)`)."""
    assert _undescribed(DeploymentConfig, "deployments[]") == []
