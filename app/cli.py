"""The `planner` command line: serve, db upgrade, openapi, plan, replay, demo.

A bad setting, deployments file or flag, and any start-up failure of `serve` and `db upgrade` (the
database, the port), ends the command with one line `planner: error: ...` naming the field, the
file or the URL, and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from app.config import REPO_ROOT, ConfigError, Settings, load_deployments, load_settings
from app.logs import configure_logging, escape_controls

# Where /proc does not say when the process started (`_process_started_s`), the command's
# wall time counts from here.
MODULE_LOADED_S = time.perf_counter()

OPENAPI_PATH = REPO_ROOT / "openapi" / "openapi.json"

log = logging.getLogger("planner")


def _fail(message: str, code: int = 2) -> int:
    # The message may quote a file's content or a URL: it stays one line, escapes visible.
    print(f"planner: error: {escape_controls(message)}", file=sys.stderr)
    return code


def _start_up_failure(settings: Settings, exc: Exception) -> str:
    """One line for whatever stopped `serve` or `db upgrade` from starting."""
    from app.store.startup import describe_database_error

    described = describe_database_error(exc, settings.database_url)
    if described is not None:
        return described
    if isinstance(exc, ConfigError):
        return str(exc)
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"start-up failed: {exc.strerror or exc}{where}"
    return f"start-up failed: {type(exc).__name__}: {exc} (PLANNER_LOG_LEVEL=DEBUG shows where)"


def _prepare_database(settings: Settings, revision: str | None) -> None:
    """Check the database in seconds, then migrate it (`revision`; None: do not migrate)."""
    from app.store.db import upgrade
    from app.store.startup import check_database

    check_database(settings.database_url, migrate=revision is not None)
    if revision is not None:
        upgrade(settings.database_url, revision)


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    from app.main import create_app
    from app.serving import StartupError, listen, serve

    deployments = load_deployments(settings.config)
    settings.check_auth_exposure()
    try:
        # Profiles and warm-up traces load here: a broken file stops start-up before the
        # database is touched.
        app = create_app(settings, deployments=deployments)
        _prepare_database(settings, "head" if settings.apply_migrations else None)
        sock = listen(settings.host, settings.port)
    except (ConfigError, StartupError):
        raise
    except Exception as exc:
        log.debug("start-up failed", exc_info=True)
        raise StartupError(_start_up_failure(settings, exc)) from None
    host, port = sock.getsockname()[:2]
    log.info("listening on http://%s:%d", host if ":" not in host else f"[{host}]", port)
    serve(
        app,
        sock,
        log_level=settings.log_level,
        describe=lambda exc: _start_up_failure(settings, exc),
    )
    return 0


def cmd_db_upgrade(settings: Settings, args: argparse.Namespace) -> int:
    from app.serving import StartupError

    try:
        _prepare_database(settings, args.revision)
    except ConfigError:
        raise
    except Exception as exc:
        log.debug("upgrade failed", exc_info=True)
        raise StartupError(_start_up_failure(settings, exc)) from None
    print(f"database at {args.revision}: {_redacted(settings.database_url)}")
    return 0


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def openapi_document(settings: Settings) -> str:
    from app.config import DeploymentsFile
    from app.main import create_app

    # The schema does not depend on which deployments are configured.
    placeholder = DeploymentsFile.model_validate(
        {"deployments": [{"name": "x", "connector": {"type": "none"}, "sla": {"ttft_ms": 1, "itl_ms": 1}}]}
    )
    app = create_app(settings, deployments=placeholder, run_workers=False)
    return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"


def cmd_openapi(settings: Settings, args: argparse.Namespace) -> int:
    path = Path(args.output)
    document = openapi_document(settings)
    if args.check:
        current = path.read_text() if path.exists() else ""
        if current != document:
            return _fail(f"{path} is out of date with the app; run `planner openapi` and commit it", 1)
        print(f"{path} matches the app")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document)
    print(f"wrote {path}")
    return 0


# --- planner plan: the what-if calculation ------------------------------------------------------

DEFAULT_PROFILE = REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"


# Sane upper bounds of the flags: far beyond any real deployment, and low enough that the
# arithmetic downstream (replica counts, trace expansion) stays finite and fits in memory.
MAX_RPS = 1e6  # requests/s
MAX_TOKENS = 1e7  # tokens of one request (ISL, OSL)
MAX_LATENCY_MS = 3.6e6  # an hour: a TTFT or ITL target beyond it is a unit mistake
MAX_GPUS_PER_ENGINE = 1024
MAX_REPLICAS = 100_000
MAX_RATE_SCALE = 1000.0  # K requests per trace request: the expanded trace is held in memory
MAX_SCALE = 1000.0  # --truth-scale, --speed
MAX_DELAY_S = 86_400.0  # a day


def _number(  # type: ignore[no-untyped-def]
    *, minimum: float, inclusive: bool, integer: bool = False, maximum: float | None = None
):
    """An argparse type: a finite number above (or at) `minimum` and at most `maximum`, with a
    message naming the rule."""
    import math

    rule = f"{'>=' if inclusive else '>'} {minimum:g}"
    if maximum is not None:
        rule += f" and <= {maximum:g}"
    kind = "an integer" if integer else "a number"

    def parse(text: str) -> float | int:
        try:
            value: float | int = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {kind} {rule}, got {text!r}") from None
        if (
            not math.isfinite(value)
            or value < minimum
            or (value == minimum and not inclusive)
            or (maximum is not None and value > maximum)
        ):
            raise argparse.ArgumentTypeError(f"must be {kind} {rule}, got {text!r}")
        return value

    return parse


def _modes(text: str) -> tuple[str, ...]:
    """An argparse type: `load,throughput`, `load` or `throughput`."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    if not modes or set(modes) - {"load", "throughput"} or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"expected load,throughput | load | throughput, got {text!r}")
    return modes


MODES_HELP = (
    "the seed algorithm's modes for this run: load,throughput | load | throughput (default: the file's); "
    "replay: with --policy seed; demo: runs the seed instead of SLA scaling"
)


def _one_line_error(message: str) -> None:
    # argparse's own errors print the usage first; here a bad flag is one line naming it.
    print(f"planner: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def cmd_plan(settings: Settings, args: argparse.Namespace) -> int:
    from app.core.errors import ProfileError
    from app.core.perf.interpolation import PerfModel
    from app.core.seed.replicas import what_if
    from app.sources.profile_files import load_profile

    try:
        model = PerfModel.from_profile(load_profile(args.profile))
    except ProfileError as exc:
        return _fail(f"--profile: {exc}")
    result = {
        "profile": str(args.profile),
        **what_if(
            model=model,
            rps=args.rps,
            isl=args.isl,
            osl=args.osl,
            ttft_ms=args.ttft_ms,
            itl_ms=args.itl_ms,
            prefill_gpus=args.prefill_gpus,
            decode_gpus=args.decode_gpus,
            min_replicas=args.min_replicas,
        ),
    }
    if args.json:
        print(json.dumps(result))
        return 0

    def verdict(met: bool) -> str:
        return "meets" if met else "MISSES"

    print(f"profile  {args.profile}")
    print(f"load     {args.rps:g} req/s, ISL {args.isl:g}, OSL {args.osl:g} tokens")
    print()
    print(f"{'role':<8} {'replicas':>8} {'GPUs/engine':>11} {'tok/s/GPU':>10}  expected latency")
    r = result
    print(
        f"{'prefill':<8} {r['num_prefill']:>8} {args.prefill_gpus:>11} {r['prefill_thpt_per_gpu']:>10.1f}"
        f"  TTFT {result['expected_ttft_ms']:.1f} ms ({verdict(result['ttft_met'])} {args.ttft_ms:g} ms)"
    )
    print(
        f"{'decode':<8} {r['num_decode']:>8} {args.decode_gpus:>11} {r['decode_thpt_per_gpu']:>10.1f}"
        f"  ITL {result['expected_itl_ms']:.1f} ms ({verdict(result['itl_met'])} {args.itl_ms:g} ms)"
        f" at {result['decode_kv_usage']:.0%} KV usage"
    )
    print()
    print(f"prefill: {result['prefill_reason']}")
    print(f"decode: {result['decode_reason']}")
    return 0


def _process_started_s() -> float:
    """When this process started, on the `time.perf_counter` clock: from /proc on Linux, so that
    the interpreter's start-up and the imports count too; elsewhere when this module loaded."""
    try:
        # Field 22 of /proc/self/stat, after the parenthesised command name: the start time in
        # clock ticks since boot; /proc/uptime is the time since boot now, on the same clock.
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        age_s = uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return MODULE_LOADED_S
    now = time.perf_counter()
    # The module's own mark bounds the age from below; anything odd falls back to it.
    return min(MODULE_LOADED_S, now - age_s) if 0 <= age_s < 86_400 else MODULE_LOADED_S


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from app.sim.fleet import is_fleet_file, run_fleet_command
    from app.sim.replay import check_output_folder, run_command

    if args.config and is_fleet_file(args.config):
        # A fleet file names one trace per deployment itself (docs/fleet.md).
        if args.trace is not None or args.workload is not None:
            raise ConfigError("--trace/--workload: a fleet file gives each deployment its trace")
        check_output_folder(Path(args.out))
        return run_fleet_command(args)
    if args.trace is None and args.workload is None:
        raise ConfigError("one of the arguments --trace --workload is required")
    # Before anything that takes time: a bad --out fails now, not after the whole replay.
    check_output_folder(Path(args.out))
    if args.workload is not None:
        args.trace = str(_write_workload(args.workload, Path(args.out)))
    return run_command(args, started_s=_process_started_s())


def _write_workload(name: str, out: Path) -> Path:
    """The named workload as a Mooncake trace `<out>/<name>.jsonl`, which the replay then reads
    like any trace (and which repeats the run with --trace). Arrival times are relative to its
    first request, as for every trace file."""
    from app.sim.workload import WORKLOADS, build_workload

    if name not in WORKLOADS:
        raise ConfigError(f"--workload: unknown workload {name!r} (choose from {', '.join(WORKLOADS)})")
    requests = build_workload(name)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.jsonl"
    with path.open("w") as stream:
        for r in requests:
            record = {
                "timestamp": r.arrival_s * 1000.0,
                "input_length": r.isl_tokens,
                "output_length": r.osl_tokens,
            }
            stream.write(json.dumps(record) + "\n")
    return path


def _add_replay(sub: argparse._SubParsersAction) -> None:
    replay = sub.add_parser(
        "replay",
        help="score a policy on a trace in a simulated cluster",
        description="Replay a trace (Mooncake JSONL, Azure CSV or Dynamo request trace), or a named "
        "workload of the decision-quality benchmark, through the simulated cluster under one policy; "
        "write summary.json, requests.csv, replicas.csv, decisions.csv and report.html to --out.",
    )
    replay.error = _one_line_error  # type: ignore[method-assign]
    latency = _number(minimum=0, inclusive=False, maximum=MAX_LATENCY_MS)
    scale = _number(minimum=0, inclusive=False, maximum=MAX_SCALE)
    gpus = _number(minimum=1, inclusive=True, integer=True, maximum=MAX_GPUS_PER_ENGINE)
    # Not required by argparse: a fleet file (--config with a `fleet:` section) names its traces.
    source = replay.add_mutually_exclusive_group()
    source.add_argument("--trace", help="request trace file")
    source.add_argument(
        "--workload",
        metavar="NAME",
        help="a workload of the decision-quality benchmark by name (app/sim/workload.py WORKLOADS), "
        "written to --out as NAME.jsonl and replayed from there",
    )
    replay.add_argument("--out", required=True, help="output directory")
    replay.add_argument("--config", help="replay file (default: examples/replay.yaml)")
    replay.add_argument("--deployment", help="deployment of the replay file (default: its only one)")
    replay.add_argument(
        "--policy",
        default="planner",
        choices=("planner", "seed", "static", "reactive", "oracle"),
        help="planner: SLA scaling; seed: the reference's throughput and load modes (default: planner)",
    )
    replay.add_argument("--profile", help="the planner's profile directory (overrides the file)")
    replay.add_argument("--prefill-gpus", type=gpus, help="GPUs per prefill engine")
    replay.add_argument("--decode-gpus", type=gpus, help="GPUs per decode engine")
    replay.add_argument("--ttft-ms", type=latency, help="TTFT target (ms)")
    replay.add_argument("--itl-ms", type=latency, help="ITL target (ms)")
    replay.add_argument(
        "--startup-delay-s",
        type=_number(minimum=0, inclusive=True, maximum=MAX_DELAY_S),
        help="engine start-up delay (s)",
    )
    replay.add_argument("--truth-scale", type=scale, help="the world's latencies are the truth profile's x X")
    replay.add_argument("--truth-profile", help="the world's profile (default: the planner's)")
    replay.add_argument(
        "--truth",
        metavar="NAME[,NAME...]",
        help="the world's latency shape: profile (default), smooth, one-prompt, prefix-cost, "
        "rising-decode, combined with commas (docs in app/sim/truth.py)",
    )
    replay.add_argument(
        "--rate-scale",
        type=_number(minimum=0, inclusive=False, maximum=MAX_RATE_SCALE),
        help="K requests per trace request, arrivals +-0.5 s (--rate-spread-s)",
    )
    replay.add_argument(
        "--rate-spread-s",
        metavar="SECONDS",
        type=_number(minimum=0, inclusive=True, maximum=MAX_DELAY_S),
        help="with --rate-scale: each copy arrives within +-SECONDS of its request (default: 0.5). "
        "Clustered copies make one-second bursts that more users at the same rate may not; a wider "
        "window spreads each request's copies over it",
    )
    replay.add_argument("--modes", type=_modes, help=MODES_HELP)
    replay.add_argument(
        "--scale-to-zero",
        metavar="QUIET_S",
        dest="scale_to_zero_quiet_s",
        type=_number(minimum=0, inclusive=False, maximum=MAX_DELAY_S),
        default=None,
        help="let the deployment run no engine after QUIET_S seconds without a request (min_replicas 0; "
        "docs/scaling.md); summary.json then reports each wake-up",
    )
    replay.add_argument(
        "--zero-return-forecast",
        dest="scale_to_zero_forecast",
        action="store_true",
        help="with --scale-to-zero: also stay awake while the learned quiet periods expect a return "
        "within a lead (scale_to_zero.respect_return_forecast)",
    )
    replay.add_argument("--seed", type=_number(minimum=0, inclusive=True, integer=True), help="default: 0")
    replay.add_argument(
        "--fleet-policy",
        choices=("fleet", "equal", "fcfs", "oracle"),
        default="fleet",
        help="a fleet file only: fleet (the fleet step), equal (static equal shares), fcfs "
        "(independent planners clipped first come first served) or oracle (every future known, "
        "fitted to the budget by the fleet step); default: fleet",
    )
    replay.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (by default a line every 10%% of the trace or 5 s of wall time)",
    )
    replay.set_defaults(func=cmd_replay)


# --- planner demo: the service against a simulated cluster ----------------------------------------


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from app.sim.demo import DemoOptions, run_demo

    return run_demo(
        DemoOptions(
            config=Path(args.config),
            trace=Path(args.trace),
            speed=args.speed,
            rate_scale=args.rate_scale,
            port=args.port,
            exit_at_end=args.exit_at_end,
            duration_s=args.duration_s,
            modes=args.modes,
            log_level=settings.log_level,
        )
    )


def _add_demo(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from app.sim.config import DEFAULT_REPLAY_CONFIG
    from app.sim.demo import DEFAULT_PORT, DEFAULT_RATE_SCALE, DEFAULT_SPEED, DEFAULT_TRACE

    demo = sub.add_parser(
        "demo",
        help="the service against a simulated cluster, sped up",
        description="Start `planner serve` (SQLite in a temporary directory) and a simulated "
        "cluster replaying a request trace: the planner scrapes the simulated frontend's /metrics, "
        "engines publish ForwardPassMetrics over ZMQ, and an orchestrator long-polls the decisions "
        "and acknowledges them once the engines are up. Ctrl-C stops everything.",
    )
    demo.error = _one_line_error  # type: ignore[method-assign]
    positive = _number(minimum=0, inclusive=False)
    scale = _number(minimum=0, inclusive=False, maximum=MAX_SCALE)
    demo.add_argument("--trace", default=str(DEFAULT_TRACE), help="request trace (default: %(default)s)")
    demo.add_argument(
        "--config",
        default=str(DEFAULT_REPLAY_CONFIG),
        help="replay file: deployment and simulation (default: %(default)s)",
    )
    demo.add_argument(
        "--speed",
        type=scale,
        default=DEFAULT_SPEED,
        help="simulated seconds per wall second (default: %(default)g)",
    )
    demo.add_argument(
        "--rate-scale",
        type=_number(minimum=0, inclusive=False, maximum=MAX_RATE_SCALE),
        default=DEFAULT_RATE_SCALE,
        help="replay the trace at K times its request rate (default: %(default)g)",
    )
    demo.add_argument(
        "--port",
        type=_number(minimum=1, inclusive=True, integer=True, maximum=65535),
        default=DEFAULT_PORT,
        help="the planner service's port on 127.0.0.1 (default: %(default)s)",
    )
    demo.add_argument("--modes", type=_modes, help=MODES_HELP)
    demo.add_argument("--exit-at-end", action="store_true", help="stop when the trace has been served")
    demo.add_argument(
        "--duration-s", type=positive, default=None, help="stop after this many simulated seconds"
    )
    demo.set_defaults(func=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="planner", description=__doc__.splitlines()[0])
    # One line per command in `planner --help` (a help text longer than about 54 characters
    # would wrap on an 80-column terminal).
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    sub.add_parser(
        "serve",
        help="run the API and the per-deployment workers",
        description="Run the HTTP API and one worker per deployment; settings come from the "
        "PLANNER_* variables (docs/configuration.md).",
    ).set_defaults(func=cmd_serve)

    db = sub.add_parser("db", help="database maintenance: `db upgrade` migrates")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_sub.add_parser("upgrade", help="apply migrations (PLANNER_DATABASE_URL)")
    upgrade.add_argument("revision", nargs="?", default="head")
    upgrade.set_defaults(func=cmd_db_upgrade)

    openapi = sub.add_parser("openapi", help="write or check the committed openapi/openapi.json")
    openapi.add_argument("--check", action="store_true", help="fail if the committed file differs")
    openapi.add_argument("--output", default=str(OPENAPI_PATH))
    openapi.set_defaults(func=cmd_openapi)

    plan = sub.add_parser(
        "plan",
        help="what-if: replicas for a profile and a steady load",
        description="Prefill and decode replicas for a steady load, from a profile's interpolated "
        "throughput (the throughput formula of the planner, before bounds, budget and overrides).",
    )
    plan.error = _one_line_error  # type: ignore[method-assign]
    plan.add_argument(
        "--profile", default=str(DEFAULT_PROFILE), help="profile directory (default: %(default)s)"
    )
    tokens = _number(minimum=0, inclusive=False, maximum=MAX_TOKENS)
    latency = _number(minimum=0, inclusive=False, maximum=MAX_LATENCY_MS)
    rps = _number(minimum=0, inclusive=True, maximum=MAX_RPS)
    plan.add_argument("--rps", required=True, type=rps, help="requests/s")
    plan.add_argument("--isl", required=True, type=tokens, help="mean input tokens per request")
    plan.add_argument("--osl", required=True, type=tokens, help="mean output tokens per request")
    plan.add_argument("--ttft-ms", required=True, type=latency, help="TTFT target (ms)")
    plan.add_argument("--itl-ms", required=True, type=latency, help="ITL target (ms)")
    gpus = _number(minimum=1, inclusive=True, integer=True, maximum=MAX_GPUS_PER_ENGINE)
    plan.add_argument("--prefill-gpus", type=gpus, default=1, help="GPUs per prefill engine")
    plan.add_argument("--decode-gpus", type=gpus, default=1, help="GPUs per decode engine")
    plan.add_argument(
        "--min-replicas",
        type=_number(minimum=0, inclusive=True, integer=True, maximum=MAX_REPLICAS),
        default=1,
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.set_defaults(func=cmd_plan)
    _add_replay(sub)
    _add_demo(sub)
    return parser


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the command the arguments chose (`db upgrade`'s for `db upgrade`)."""
    for dest in ("command", "db_command"):
        commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, dest, None)
        if not commands or name is None:
            break
        parser = commands[0].choices[name]
    return parser


def main(argv: list[str] | None = None) -> int:
    from app.serving import StartupError

    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # Named by the command they were given to, with its usage, not the top level's.
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        settings = load_settings()
        configure_logging(settings.log_level, settings.log_format)
        return args.func(settings, args)
    except (ConfigError, StartupError) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
