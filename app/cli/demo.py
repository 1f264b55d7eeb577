"""`planner demo`: the service against a simulated cluster, sped up."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli.common import MAX_RATE_SCALE, MAX_SCALE, MODES_HELP, modes, number, one_line_error
from app.config import Settings


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from app.sim.demo.plan import DemoOptions
    from app.sim.demo.run import run_demo

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
            store=Path(args.store) if args.store else None,
            log_level=settings.log_level,
        )
    )


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from app.sim.demo.plan import DEFAULT_PORT, DEFAULT_RATE_SCALE, DEFAULT_SPEED, DEFAULT_TRACE
    from app.sim.replay.config import DEFAULT_REPLAY_CONFIG

    demo = sub.add_parser(
        "demo",
        help="the service against a simulated cluster, sped up",
        description="Start `planner serve` (SQLite in a temporary directory, or --store) and a simulated "
        "cluster replaying a request trace: the planner scrapes the simulated frontend's /metrics, "
        "engines publish ForwardPassMetrics over ZMQ, and an orchestrator long-polls the decisions "
        "and acknowledges them once the engines are up. Ctrl-C stops everything.",
    )
    demo.error = one_line_error  # type: ignore[method-assign]
    positive = number(minimum=0, inclusive=False)
    scale = number(minimum=0, inclusive=False, maximum=MAX_SCALE)
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
        type=number(minimum=0, inclusive=False, maximum=MAX_RATE_SCALE),
        default=DEFAULT_RATE_SCALE,
        help="replay the trace at K times its request rate (default: %(default)g)",
    )
    demo.add_argument(
        "--port",
        type=number(minimum=1, inclusive=True, integer=True, maximum=65535),
        default=DEFAULT_PORT,
        help="the planner service's port on 127.0.0.1 (default: %(default)s)",
    )
    demo.add_argument("--modes", type=modes, help=MODES_HELP)
    demo.add_argument("--exit-at-end", action="store_true", help="stop when the trace has been served")
    demo.add_argument(
        "--duration-s", type=positive, default=None, help="stop after this many simulated seconds"
    )
    demo.add_argument(
        "--store",
        metavar="PATH",
        help="the planner's SQLite database at PATH (a new file), kept after the demo: "
        "`planner replay --from-store sqlite:///PATH` replays its traffic (default: a temporary file)",
    )
    demo.set_defaults(func=cmd_demo)
