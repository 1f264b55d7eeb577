"""The `planner` command line: serve, db upgrade, openapi.

A bad setting or deployments file ends the command with one line naming the field and a
non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from app.config import REPO_ROOT, ConfigError, Settings, load_deployments, load_settings

OPENAPI_PATH = REPO_ROOT / "openapi" / "openapi.json"

log = logging.getLogger("planner")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Alembic announces every plugin it loads at INFO; only the migration steps are news.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def _fail(message: str, code: int = 2) -> int:
    print(f"planner: error: {message}", file=sys.stderr)
    return code


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app
    from app.store.db import upgrade

    deployments = load_deployments(settings.config)
    settings.check_auth_exposure()
    # Profiles and warm-up traces load here: a broken file stops start-up before the database is touched.
    app = create_app(settings, deployments=deployments)
    if settings.apply_migrations:
        upgrade(settings.database_url)
    log.info("listening on http://%s:%d", settings.host, settings.port)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
        # Held long-polls (up to 300 s) must not keep a stopping planner alive; orchestrators
        # poll again and another process (or this one, restarted) answers.
        timeout_graceful_shutdown=5,
    )
    return 0


def cmd_db_upgrade(settings: Settings, args: argparse.Namespace) -> int:
    from app.store.db import upgrade

    upgrade(settings.database_url, args.revision)
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


def _number(*, minimum: float, inclusive: bool, integer: bool = False):  # type: ignore[no-untyped-def]
    """An argparse type: a finite number above (or at) `minimum`, with a message naming the rule."""
    import math

    rule = f"{'>=' if inclusive else '>'} {minimum:g}"
    kind = "an integer" if integer else "a number"

    def parse(text: str) -> float | int:
        try:
            value: float | int = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {kind} {rule}, got {text!r}") from None
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
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


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from app.sim.fleet import is_fleet_file, run_fleet_command
    from app.sim.replay import run_command

    if args.config and is_fleet_file(args.config):
        # A fleet file names one trace per deployment itself (docs/fleet.md).
        if args.trace is not None or args.workload is not None:
            raise ConfigError("--trace/--workload: a fleet file gives each deployment its trace")
        return run_fleet_command(args)
    if args.trace is None and args.workload is None:
        raise ConfigError("one of the arguments --trace --workload is required")
    if args.workload is not None:
        args.trace = str(_write_workload(args.workload, Path(args.out)))
    return run_command(args)


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
        help="replay a request trace through a simulated cluster steered by a policy",
        description="Replay a trace (Mooncake JSONL, Azure CSV or Dynamo request trace), or a named "
        "workload of the decision-quality benchmark, through the simulated cluster under one policy; "
        "write summary.json, requests.csv, replicas.csv, decisions.csv and report.html to --out.",
    )
    replay.error = _one_line_error  # type: ignore[method-assign]
    positive = _number(minimum=0, inclusive=False)
    non_negative = _number(minimum=0, inclusive=True)
    gpus = _number(minimum=1, inclusive=True, integer=True)
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
    replay.add_argument("--ttft-ms", type=positive, help="TTFT target (ms)")
    replay.add_argument("--itl-ms", type=positive, help="ITL target (ms)")
    replay.add_argument("--startup-delay-s", type=non_negative, help="engine start-up delay (s)")
    replay.add_argument(
        "--truth-scale", type=positive, help="the world's latencies are the truth profile's x X"
    )
    replay.add_argument("--truth-profile", help="the world's profile (default: the planner's)")
    replay.add_argument(
        "--truth",
        metavar="NAME[,NAME...]",
        help="the world's latency shape: profile (default), smooth, one-prompt, prefix-cost, "
        "rising-decode, combined with commas (docs in app/sim/truth.py)",
    )
    replay.add_argument("--rate-scale", type=positive, help="K requests per trace request, arrivals +-0.5 s")
    replay.add_argument("--modes", type=_modes, help=MODES_HELP)
    replay.add_argument("--seed", type=_number(minimum=0, inclusive=True, integer=True), help="default: 0")
    replay.add_argument(
        "--fleet-policy",
        choices=("fleet", "equal", "fcfs"),
        default="fleet",
        help="a fleet file only: fleet (the fleet step), equal (static equal shares) or fcfs "
        "(independent planners clipped first come first served); default: fleet",
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
        help="the service against a simulated cluster replaying a trace, in accelerated real time",
        description="Start `planner serve` (SQLite in a temporary directory) and a simulated "
        "cluster replaying a request trace: the planner scrapes the simulated frontend's /metrics, "
        "engines publish ForwardPassMetrics over ZMQ, and an orchestrator long-polls the decisions "
        "and acknowledges them once the engines are up. Ctrl-C stops everything.",
    )
    demo.error = _one_line_error  # type: ignore[method-assign]
    positive = _number(minimum=0, inclusive=False)
    demo.add_argument("--trace", default=str(DEFAULT_TRACE), help="request trace (default: %(default)s)")
    demo.add_argument(
        "--config",
        default=str(DEFAULT_REPLAY_CONFIG),
        help="replay file: deployment and simulation (default: %(default)s)",
    )
    demo.add_argument(
        "--speed",
        type=positive,
        default=DEFAULT_SPEED,
        help="simulated seconds per wall second (default: %(default)g)",
    )
    demo.add_argument(
        "--rate-scale",
        type=positive,
        default=DEFAULT_RATE_SCALE,
        help="replay the trace at K times its request rate (default: %(default)g)",
    )
    demo.add_argument(
        "--port",
        type=_number(minimum=1, inclusive=True, integer=True),
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
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("serve", help="run the API and the per-deployment workers").set_defaults(func=cmd_serve)

    db = sub.add_parser("db", help="database maintenance")
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
        help="what-if: the replicas the throughput formula gives for a profile and a load",
        description="Prefill and decode replicas for a steady load, from a profile's interpolated "
        "throughput (the throughput formula of the planner, before bounds, budget and overrides).",
    )
    plan.error = _one_line_error  # type: ignore[method-assign]
    plan.add_argument(
        "--profile", default=str(DEFAULT_PROFILE), help="profile directory (default: %(default)s)"
    )
    positive = _number(minimum=0, inclusive=False)
    plan.add_argument("--rps", required=True, type=_number(minimum=0, inclusive=True), help="requests/s")
    plan.add_argument("--isl", required=True, type=positive, help="mean input tokens per request")
    plan.add_argument("--osl", required=True, type=positive, help="mean output tokens per request")
    plan.add_argument("--ttft-ms", required=True, type=positive, help="TTFT target (ms)")
    plan.add_argument("--itl-ms", required=True, type=positive, help="ITL target (ms)")
    gpus = _number(minimum=1, inclusive=True, integer=True)
    plan.add_argument("--prefill-gpus", type=gpus, default=1, help="GPUs per prefill engine")
    plan.add_argument("--decode-gpus", type=gpus, default=1, help="GPUs per decode engine")
    plan.add_argument("--min-replicas", type=_number(minimum=0, inclusive=True, integer=True), default=1)
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.set_defaults(func=cmd_plan)
    _add_replay(sub)
    _add_demo(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
        _setup_logging(settings.log_level)
        return args.func(settings, args)
    except ConfigError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from sqlalchemy.exc import OperationalError

        if isinstance(exc, OperationalError):
            first_line = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc.orig)
            return _fail(f"PLANNER_DATABASE_URL: cannot reach the database: {first_line}", 1)
        raise


if __name__ == "__main__":
    sys.exit(main())
