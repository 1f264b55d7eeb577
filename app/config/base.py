"""What every part of the configuration shares: the error a bad setting raises, the strict model
every section of the deployments file is, and where the repository is."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]


class ConfigError(Exception):
    """A setting or the deployments file is invalid; the message names the field."""


class Strict(BaseModel):
    # A typo in the YAML must be an error, not a silently ignored key.
    model_config = ConfigDict(extra="forbid")
