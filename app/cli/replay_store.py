"""`planner replay --from-store URL --deployment NAME`: read the deployment's history from its store,
read-only, and hand it to the replay (app/sim/replay/store_run.py). Every way the store, the
deployment or the window can be wrong is one ConfigError line, raised before anything is written.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from app.config import ConfigError, DeploymentConfig, format_validation_error
from app.config.live import apply_overrides
from app.core.errors import InvalidInputError
from app.sim.replay.config import ReplayConfig, SimulationConfig, load_replay_config, with_overrides
from app.sim.replay.from_store import StoredTick
from app.sim.replay.store_run import History, check_window, run_from_store
from app.store import history as store
from app.store.startup import redacted, sqlite_path

# The schema a replay reads: the deployment's stored configuration came with this revision.
NEEDED_REVISION = "0006_deployment_config"
FLAG = "--from-store"


def _one_line(exc: DBAPIError) -> str:
    return " ".join(str(exc.orig).split())


def _where(url: str) -> str:
    path = sqlite_path(url)
    return str(path.absolute()) if path is not None else redacted(url)


def _check_schema(session: Session, url: str) -> None:
    revision = store.schema_revision(session)
    if revision == NEEDED_REVISION:
        return
    from alembic.script import ScriptDirectory

    from app.store.db import alembic_config

    script = ScriptDirectory.from_config(alembic_config(url))
    known = {r.revision for r in script.walk_revisions()}
    if revision is None:
        raise ConfigError(f"{FLAG}: {_where(url)}: not a planner store (no alembic_version table)")
    if revision not in known:
        raise ConfigError(
            f"{FLAG}: {_where(url)}: schema revision {revision} is unknown to this planner (newer?); "
            f"replay needs {NEEDED_REVISION}"
        )
    # Older than the revision needed: one of its ancestors (a newer one passes).
    ancestors = {r.revision for r in script.iterate_revisions(NEEDED_REVISION, "base")} - {NEEDED_REVISION}
    if revision in ancestors:
        raise ConfigError(
            f"{FLAG}: {_where(url)}: the schema is at revision {revision}; replay needs revision "
            f"{NEEDED_REVISION} (run `planner db upgrade` on it, then let `planner serve` start once)"
        )


def _open(url: str) -> Any:
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        raise ConfigError(f"{FLAG}: {path.absolute()}: no such database file")
    try:
        return store.open_read_only(url)
    except store.HistoryError as exc:
        raise ConfigError(f"{FLAG}: {exc}") from None
    except (SQLAlchemyError, ValueError) as exc:
        # An unparsable URL or an unknown driver.
        raise ConfigError(f"{FLAG}: not a database URL ({type(exc).__name__}: {exc})") from None


def _deployment_config(session: Session, name: str) -> tuple[DeploymentConfig | None, str]:
    stored, overrides = store.stored_config(session, name)
    if stored is None:
        return None, "none stored"
    try:
        config = DeploymentConfig.model_validate(stored)
    except ValidationError as exc:
        why = format_validation_error(f"deployment {name!r}'s stored configuration", exc, DeploymentConfig)
        raise ConfigError(f"{FLAG}: {why}; give --config") from None
    try:
        return apply_overrides(config, overrides), "stored" + (" with live settings" if overrides else "")
    except InvalidInputError as exc:
        return config, f"stored (live settings not applied: {exc.detail})"


def read_history(args: argparse.Namespace) -> tuple[History, DeploymentConfig | None, str]:
    """The window's history and the stored configuration (None: none stored)."""
    url = args.from_store
    if args.since is not None and args.until is not None and args.since > args.until:
        raise ConfigError(f"--since: {args.since.isoformat()} is after --until {args.until.isoformat()}")
    engine = _open(url)
    try:
        with Session(engine) as session:
            try:
                session.execute(text("SELECT 1"))
            except DBAPIError as exc:
                raise ConfigError(f"{FLAG}: {_where(url)}: cannot open the store: {_one_line(exc)}") from None
            try:
                _check_schema(session, url)
                return _read(session, args)
            except DBAPIError as exc:
                raise ConfigError(f"{FLAG}: {_where(url)}: cannot read the store: {_one_line(exc)}") from None
    finally:
        engine.dispose()


def _read(session: Session, args: argparse.Namespace) -> tuple[History, DeploymentConfig | None, str]:
    name = args.deployment
    names = store.deployment_names(session)
    if name is None:
        if len(names) != 1:
            raise ConfigError(
                f"--deployment: required, the store holds {len(names)} ({', '.join(names) or 'none'})"
            )
        name = names[0]
    if name not in names:
        raise ConfigError(
            f"--deployment: no deployment {name!r} in the store (have: {', '.join(names) or 'none'})"
        )
    first, last = store.tick_span(session, name)
    if first is None or last is None:
        raise ConfigError(f"--deployment: {name!r} has no stored ticks")
    since, until = args.since or first, args.until or last
    ticks = store.observed_traffic(session, name, since, until)
    observed = [t for t in ticks if t.observation is not None]
    span = f"stored ticks of {name!r} span {first.isoformat()} to {last.isoformat()}"
    if not observed:
        raise ConfigError(
            f"--since/--until: no traffic stored for {name!r} between {since.isoformat()} and "
            f"{until.isoformat()} ({span}; older traffic is pruned after PLANNER_TRAFFIC_RETENTION_DAYS)"
        )
    first_obs = observed[0].observation
    assert first_obs is not None
    start = observed[0].at.timestamp() - first_obs.duration_s
    decisions = store.decisions_until(session, name, until)
    before = [counts for at, counts in decisions if at.timestamp() < start]
    inside = [(at.timestamp() - start, counts) for at, counts in decisions if at.timestamp() >= start]
    if before:
        initial = dict(before[-1])
    elif inside:
        initial = dict(inside[0][1])
    else:
        raise ConfigError(
            f"--deployment: {name!r} has no decision up to {until.isoformat()}: nothing ran to replay"
        )
    history = History(
        deployment=name,
        start=datetime.fromtimestamp(start, UTC),
        ticks=[
            StoredTick(t.at.timestamp() - start, t.observation) for t in ticks if t.at.timestamp() > start
        ],
        decisions=inside,
        initial=initial,
        end_s=observed[-1].at.timestamp() - start,
        source={
            "store": _where(args.from_store),
            "since": since.isoformat(),
            "until": until.isoformat(),
            "window_start": datetime.fromtimestamp(start, UTC).isoformat(),
        },
    )
    config, origin = _deployment_config(session, name)
    history.source["settings"] = "--config" if args.config else origin
    return history, config, origin


def replay_config(args: argparse.Namespace, stored: DeploymentConfig | None, name: str) -> ReplayConfig:
    """The planner's deployment (the stored one, or --config's) and the simulated world (the
    --config file's `simulation:` section, else the defaults), with the flags over them."""
    if args.config:
        config = load_replay_config(args.config, _pick(args.config, name))
    elif stored is None:
        raise ConfigError(
            f"{FLAG}: deployment {name!r}: the store holds no configuration for it (written by "
            "`planner serve` from schema 0006 on); give --config with its deployments file"
        )
    else:
        if stored.mode != "disagg":
            raise ConfigError(
                f"{FLAG}: deployment {name!r}: mode {stored.mode}: the simulator models disagg only"
            )
        if not stored.profile:
            raise ConfigError(
                f"{FLAG}: deployment {name!r}: no profile stored (the simulator's truth); give --config"
            )
        config = ReplayConfig(
            path=Path.cwd() / "stored-config", deployment=stored, simulation=SimulationConfig()
        )
    return with_overrides(
        config,
        profile=args.profile,
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        startup_delay_s=args.startup_delay_s,
        truth_scale=args.truth_scale,
        truth_profile=args.truth_profile,
        truth=args.truth,
        seed=args.seed,
        prefill_gpus=args.prefill_gpus,
        decode_gpus=args.decode_gpus,
        removal_grace_s=args.removal_grace_s,
        removal_hints=args.removal_hints,
    )


def _pick(path: str, name: str) -> str | None:
    """The file's deployment of the store's name when it has one, else its only one."""
    from app.config import read_yaml_mapping

    raw = read_yaml_mapping(Path(path), what="replay file", hint="")
    names = [d.get("name") for d in raw.get("deployments") or () if isinstance(d, dict)]
    return name if name in names else None


def run_from_store_command(args: argparse.Namespace, *, started_s: float) -> int:
    """`planner replay --from-store`: the store, the window and the settings are checked (they
    read in a moment) before the output folder is created, so that bad input leaves nothing."""
    from app.sim.replay.run import check_output_folder

    for flag, value in (("--trace", args.trace), ("--workload", args.workload)):
        if value is not None:
            raise ConfigError(f"{flag}: --from-store replays the store's traffic; give one or the other")
    if args.policy != "planner" or args.modes is not None:
        raise ConfigError("--policy/--modes: --from-store replays planner, recorded, peak, static and oracle")
    # The stored traffic is replayed as it came, on one deployment.
    for flag, given in (
        ("--rate-scale", args.rate_scale is not None),
        ("--rate-spread-s", args.rate_spread_s is not None),
        ("--scale-to-zero", args.scale_to_zero_quiet_s is not None),
        ("--zero-return-forecast", args.scale_to_zero_forecast),
        ("--fleet-policy", args.fleet_policy != "fleet"),
    ):
        if given:
            raise ConfigError(f"{flag}: not with --from-store (the stored traffic replays as it came)")
    history, stored, _ = read_history(args)
    config = replay_config(args, stored, history.deployment)
    check_window(history)
    check_output_folder(Path(args.out))
    comparison = run_from_store(
        config, history, Path(args.out), started_s=started_s, quiet=bool(getattr(args, "quiet", False))
    )
    wall_s = time.perf_counter() - started_s
    for name, row in comparison["policies"].items():
        print(
            f"{name}: SLO attainment {row['slo_attainment']:.1%}, "
            f"{row['window_engine_hours']:.2f} engine-hours in the window, {row['gpu_hours']:.2f} GPU-hours "
            f"in all (cost {row['cost']:.2f}), {row['scaling_actions']} scaling actions"
        )
    stored = comparison["stored"]
    print(
        f"stored decisions: {stored['engine_hours']:.2f} engine-hours in the window; "
        f"{comparison['requests']} requests rebuilt from the store; {wall_s:.1f} s wall in all"
    )
    out = Path(args.out)
    print(f"wrote {out / 'comparison.json'}, {out / 'per_minute.csv'} and a folder per policy in {out}")
    return 0
