"""What a deployment did, read back for `planner replay --from-store`: the configuration it ran
under, the traffic its ticks observed, the decisions it took; and the retention of the traffic.

Reading never writes: `open_read_only` opens SQLite with `mode=ro` (no journal mode switch, no
lock file; `immutable` when no planner is writing, so not even a -shm file appears) and
PostgreSQL sessions with `default_transaction_read_only`, so the database itself refuses a write.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, func, inspect, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from app.core.types import TrafficObservation
from app.store.models import Decision, DeploymentSettingsRow, DeploymentState, Tick

# A PostgreSQL server that does not answer within this is unreachable, not slow.
CONNECT_TIMEOUT_S = 10
# Ticks whose traffic one pruning statement clears: short transactions beside the workers' own.
PRUNE_BATCH = 500


class HistoryError(Exception):
    """The store cannot be replayed from; the message is one line."""


def open_read_only(url: str) -> Engine:
    """An engine on `url` that cannot write (see the module)."""
    parsed = make_url(url)
    if parsed.drivername.startswith("sqlite"):
        database = parsed.database
        if not database or database == ":memory:":
            raise HistoryError("an SQLite URL needs a database file (sqlite:///PATH)")
        # The file URI keeps SQLite from creating a missing file or writing to an existing one.
        # A database in WAL mode with no write-ahead log beside it has no writer: opened
        # immutable, SQLite adds no -wal or -shm file next to it either. With a log, a planner
        # serving on it may be writing: read-only then shares its -shm index (the database and
        # its log are not written), so that what is read is consistent.
        live = Path(database + "-wal").exists()
        options = "mode=ro" if live else "mode=ro&immutable=1"
        return create_engine(
            f"sqlite:///file:{database}?{options}&uri=true", connect_args={"check_same_thread": False}
        )
    if parsed.drivername.startswith("postgresql"):
        return create_engine(
            url,
            connect_args={
                "connect_timeout": CONNECT_TIMEOUT_S,
                "options": "-c default_transaction_read_only=on",
            },
        )
    raise HistoryError("the URL must start with sqlite:/// or postgresql://")


def schema_revision(session: Session) -> str | None:
    """The store's alembic revision; None when it was never migrated."""
    if not inspect(session.connection()).has_table("alembic_version"):
        return None
    return session.execute(text("SELECT version_num FROM alembic_version")).scalar()


def deployment_names(session: Session) -> list[str]:
    return list(session.scalars(select(DeploymentState.name).order_by(DeploymentState.name)))


def save_configs(session: Session, configs: dict[str, dict[str, Any]], now: datetime) -> None:
    """Record each deployment's configuration as this planner read it (rows exist already:
    `ensure_deployments`); an unchanged one keeps its row untouched."""
    for name, config in configs.items():
        state = session.get(DeploymentState, name)
        if state is not None and state.config != config:
            state.config = config
            state.config_saved_at = now


def stored_config(session: Session, deployment: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The deployment's stored configuration (None: no planner has saved one) and the live
    settings changed over the API since ({} when none were)."""
    state = session.get(DeploymentState, deployment)
    row = session.get(DeploymentSettingsRow, deployment)
    return (state.config if state else None), (dict(row.overrides) if row else {})


def tick_span(session: Session, deployment: str) -> tuple[datetime | None, datetime | None]:
    """The first and the last stored tick of the deployment."""
    first, last = session.execute(
        select(func.min(Tick.at), func.max(Tick.at)).where(Tick.deployment == deployment)
    ).one()
    return _aware(first), _aware(last)


@dataclass(frozen=True)
class ObservedTick:
    at: datetime
    observation: TrafficObservation | None  # None: the tick observed no traffic (or it was pruned)


def observed_traffic(
    session: Session, deployment: str, since: datetime, until: datetime
) -> list[ObservedTick]:
    """The deployment's ticks with `since <= at <= until`, oldest first, each with the traffic it
    observed (the record's `traffic.observed`, written by SLA scaling's ticks)."""
    query = (
        select(Tick.at, Tick.record["traffic"])
        .where(Tick.deployment == deployment, Tick.at >= since, Tick.at <= until)
        .order_by(Tick.at, Tick.id)
        .execution_options(yield_per=1000)
    )
    return [ObservedTick(_aware(at), _observation(traffic)) for at, traffic in session.execute(query)]


def decisions_until(
    session: Session, deployment: str, until: datetime
) -> list[tuple[datetime, dict[str, int]]]:
    """Every decision made up to `until`, oldest first, with its counts per role (the ones it
    sets: None counts leave the role out)."""
    rows = session.execute(
        select(Decision.created_at, Decision.num_prefill, Decision.num_decode)
        .where(Decision.deployment == deployment, Decision.created_at <= until)
        .order_by(Decision.decision_id)
    )
    out = []
    for at, prefill, decode in rows:
        counts = {role: n for role, n in (("prefill", prefill), ("decode", decode)) if n is not None}
        out.append((_aware(at), counts))
    return out


def prune_traffic(session: Session, before: datetime) -> int:
    """Clear the traffic observations of ticks older than `before` (the rest of each record
    stays); at most PRUNE_BATCH ticks per call, the caller commits. How many were cleared."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        has_traffic = text("jsonb_typeof(ticks.record -> 'traffic') = 'object'")
        cleared = func.jsonb_set(Tick.record, text("'{traffic}'"), text("'null'::jsonb"))
    else:
        has_traffic = text("json_type(ticks.record, '$.traffic') = 'object'")
        cleared = func.json_set(Tick.record, "$.traffic", func.json("null"))
    ids = select(Tick.id).where(Tick.at < before, has_traffic).order_by(Tick.id).limit(PRUNE_BATCH)
    result = session.execute(
        update(Tick)
        .where(Tick.id.in_(ids.scalar_subquery()))
        .values(record=cleared)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def _aware(at: datetime | None) -> datetime | None:
    if at is None:
        return None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _observation(traffic: Any) -> TrafficObservation | None:
    """The stored `traffic` section back as an observation (the open bucket is stored "+Inf");
    None when the tick has none or it does not read."""
    observed = traffic.get("observed") if isinstance(traffic, dict) else None
    if not isinstance(observed, dict):
        return None
    duration_s = _number(observed.get("duration_s"))
    if duration_s is None or duration_s <= 0:
        return None
    buckets = []
    for pair in observed.get("isl_buckets") or ():
        if not (isinstance(pair, list | tuple) and len(pair) == 2):
            continue
        bound = math.inf if pair[0] == "+Inf" else _number(pair[0])
        count = _number(pair[1])
        if bound is not None and count is not None:
            buckets.append((bound, count))
    return TrafficObservation(
        duration_s=duration_s,
        num_req=_number(observed.get("num_req")),
        isl=_number(observed.get("isl")),
        osl=_number(observed.get("osl")),
        isl_buckets=tuple(buckets),
    )
