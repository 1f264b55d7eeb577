"""A deployment's live settings in the store: the overrides of the deployments file's values an
operator made over the API, their revision, and the audit row of every change.

The file stays the default; the store holds only what was changed, nested as in the file
(app/config/live.py says which fields may change and how a change merges). Every planner process
reads the same row, so a change reaches whichever process leads the deployment at its next tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from app.config.deployment import DeploymentConfig
from app.config.live import apply_overrides, live_values, merge_patch, running_config
from app.core.errors import PreconditionFailedError
from app.store.decisions import lock_deployment
from app.store.models import DeploymentSettingsRow
from app.store.overrides import Actor, audit


@dataclass(frozen=True)
class StoredSettings:
    """What the store says about a deployment's live settings (revision 0: nothing changed)."""

    revision: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)
    updated_at: datetime | None = None
    updated_by: str | None = None


def load(session: Session, deployment: str) -> StoredSettings:
    row = session.get(DeploymentSettingsRow, deployment)
    if row is None:
        return StoredSettings()
    return StoredSettings(row.revision, dict(row.overrides), row.updated_at, row.updated_by)


def effective(session: Session, config: DeploymentConfig) -> DeploymentConfig:
    """The deployment as it runs: the file's values with the stored overrides applied (the
    file's alone if it no longer accepts them, as the worker does)."""
    return running_config(config, load(session, config.name).overrides)[0]


def change(
    session: Session,
    *,
    config: DeploymentConfig,
    patch: Any,
    expected_revision: int | None,
    actor: Actor,
    now: datetime,
) -> StoredSettings:
    """Apply a merge patch to the stored overrides if the revision is still `expected_revision`
    (None: any), validate the result against the file, store it as the next revision and audit
    it; the caller commits. Raises PreconditionFailedError on a stale revision and
    InvalidInputError naming the field on a bad change."""
    name = config.name
    lock_deployment(session, name)  # two operators at once: the second sees the first's revision
    row = session.get(DeploymentSettingsRow, name)
    current = StoredSettings() if row is None else StoredSettings(row.revision, dict(row.overrides))
    if expected_revision is not None and expected_revision != current.revision:
        raise PreconditionFailedError(
            f"the settings of {name!r} are at revision {current.revision}, not {expected_revision}; "
            "read them again (GET) and retry with the new ETag"
        )
    overrides = merge_patch(current.overrides, patch, config)
    before = live_values(running_config(config, current.overrides)[0])
    after = live_values(apply_overrides(config, overrides))
    revision = current.revision + 1
    if row is None:
        row = DeploymentSettingsRow(deployment=name)
        session.add(row)
    row.revision, row.overrides, row.updated_at, row.updated_by = revision, overrides, now, actor.name
    audit(
        session,
        actor=actor,
        action="settings.change",
        deployment=name,
        now=now,
        details={"revision": revision, "patch": patch, "before": before, "after": after},
    )
    return StoredSettings(revision, overrides, now, actor.name)
