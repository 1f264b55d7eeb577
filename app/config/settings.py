"""The service's own settings, from `PLANNER_*` environment variables (`Settings`): database,
deployments file, address, tokens, logging, leases and limits."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.config.base import REPO_ROOT, ConfigError
from app.validation_messages import message

# Named for the package: its warnings read `app.config: ...`, wherever in it they are raised.
log = logging.getLogger("app.config")


ApiRole = Literal["viewer", "orchestrator", "operator"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PLANNER_", extra="ignore")

    database_url: str = "sqlite:///planner.db"
    config: str = str(REPO_ROOT / "examples" / "planner.yaml")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    api_tokens: str = ""
    api_tokens_file: str | None = None
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning", "error"] = "INFO"
    # text: a line for people; json: one JSON object a line for log pipelines (app/logs.py).
    log_format: Literal["text", "json"] = "text"
    apply_migrations: bool = True
    # Folders POST /plan may read profiles from (comma-separated), besides configured profiles.
    profile_roots: str = str(REPO_ROOT / "data" / "profiles")
    # Demo and testing knob: the service's clock runs this many times faster than the wall clock
    # (`planner demo` sets it to its --speed). Intervals, timeouts and leases are in scaled seconds.
    time_scale: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    # The per-deployment worker lease, for several replicas on one PostgreSQL database
    # (docs/operations.md): the holder renews it every lease_renew_s, a standby asks as often and
    # at its expiry, so a replica that dies (even SIGKILLed) hands its deployments over within
    # lease_ttl_s. Seconds of the service's clock.
    lease_ttl_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    lease_renew_s: float = Field(default=10.0, gt=0, allow_inf_nan=False)

    @field_validator("lease_renew_s")
    @classmethod
    def _renewed_before_it_expires(cls, renew_s: float, info: ValidationInfo) -> float:
        ttl_s = info.data.get("lease_ttl_s")
        if ttl_s is not None and renew_s >= ttl_s:
            raise ValueError(f"must be shorter than PLANNER_LEASE_TTL_S ({ttl_s:g} s)")
        return renew_s

    # Demo knob: the service's clock is the one another process drives through this file
    # (`planner demo`'s simulated clock, app/workers/clock.py SharedClock); overrides time_scale.
    clock_file: str | None = None
    # A request body above this is refused with 413 before it is read (JSON bodies here are small).
    max_body_bytes: int = Field(default=1024 * 1024, ge=1)
    # Held GET /decisions/wait requests this process keeps at once, in total and per caller (one
    # token; all loopback callers when no tokens are set); beyond them it answers 429.
    max_held_longpolls: int = Field(default=1000, ge=1)
    max_held_longpolls_per_caller: int = Field(default=200, ge=1)
    # Days the tick records keep their traffic observations, which `planner replay --from-store`
    # replays (app/workers/retention.py); two weeks hold last week and the one before it.
    traffic_retention_days: float = Field(default=14.0, gt=0, le=3650, allow_inf_nan=False)

    @field_validator("database_url")
    @classmethod
    def _known_driver(cls, url: str) -> str:
        # Plain postgresql:// means psycopg 3 here (the only PostgreSQL driver we install).
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        if not (url.startswith("sqlite") or url.startswith("postgresql+psycopg://")):
            raise ValueError("must start with sqlite:/// or postgresql://")
        return url

    def tokens(self) -> dict[str, ApiRole]:
        """token → role, from PLANNER_API_TOKENS (`role:token,...`) and PLANNER_API_TOKENS_FILE."""
        entries = [e for e in self.api_tokens.split(",") if e.strip()]
        source = "PLANNER_API_TOKENS"
        if self.api_tokens_file:
            try:
                text = Path(self.api_tokens_file).read_text()
            except OSError as exc:
                raise ConfigError(
                    f"PLANNER_API_TOKENS_FILE: cannot read {self.api_tokens_file}: {exc}"
                ) from None
            entries += [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
            source = "PLANNER_API_TOKENS / PLANNER_API_TOKENS_FILE"
        tokens: dict[str, ApiRole] = {}
        for number, entry in enumerate(entries, start=1):
            role, sep, token = entry.strip().partition(":")
            if not sep or not token:
                # Never echo the entry: without a colon it is most likely a bare secret.
                raise ConfigError(f"{source}: entry {number} is not 'role:token'")
            if role not in ("viewer", "orchestrator", "operator"):
                raise ConfigError(f"{source}: role {role!r} is not one of viewer, orchestrator, operator")
            if len(token) < 8:
                raise ConfigError(f"{source}: the {role} token is shorter than 8 characters")
            tokens[token] = role  # type: ignore[assignment]
        return tokens

    def is_loopback_host(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def check_auth_exposure(self) -> None:
        """Without tokens the API is open, so it may only listen on loopback."""
        if not self.tokens():
            if not self.is_loopback_host():
                raise ConfigError(
                    f"PLANNER_HOST: refusing to listen on {self.host} without API tokens; "
                    "set PLANNER_API_TOKENS (role:token,...) or listen on 127.0.0.1"
                )
            log.warning(
                "no API tokens configured: the API is open to every local process, listening on %s only",
                self.host,
            )


def load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = "PLANNER_" + str(first["loc"][0]).upper() if first["loc"] else "PLANNER_*"
        raise ConfigError(f"{field}: {message(first)}") from None
