"""`planner demo`: the real service against a simulated cluster, in accelerated real time.

The demo process runs:
- the simulated cluster (`app/sim/world/cluster.py`) replaying a trace, in a thread of its own
  (`app/sim/demo/realtime.py`) that advances it in bounded slices on the **simulated clock**: a
  `SharedClockWriter` file the planner service reads too (`PLANNER_CLOCK_FILE`), running
  --speed simulated seconds per wall second, slower (said once in the log) while the simulator
  cannot keep up, so the planner always sees the traffic the trace has;
- the simulated frontend's `/metrics` (and the demo's `/status`) on a loopback port, in a thread
  of its own, answered from the simulator's latest snapshot, so a slow step never delays them;
- one ZMQ publisher per engine sending its ForwardPassMetrics every iteration
  (`sources.fpm_endpoints`);
- an orchestrator that long-polls the planner for decisions, orders the engines, and
  acknowledges once they are up (the event loop of the main thread).

The planner itself is `planner serve` in a child process with an SQLite database in a temporary
directory (or at --store's path, kept for `planner replay --from-store`) and a deployments file
generated from the replay config; on the shared clock its 5 s ticks and its ack timeout pass in
simulated seconds, and every time its API shows is simulated:
`SIM_EPOCH` (2000-01-01T00:00:00Z) is the start of the trace.

Output: the URLs to open (the dashboard first), a status line every STATUS_EVERY_S wall seconds,
a summary when the trace or --duration-s ends, or when the demo stops before (Ctrl-C, SIGTERM, a
failure), and at exit one JSON line (`{"demo": "stopped", ...}`) with the final state.

Here: the entry point and the signal handling. The options, defaults and plan are
app/sim/demo/plan.py; one run, `Demo`, is app/sim/demo/harness.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys

from app.config import ConfigError
from app.sim.demo.harness import Demo
from app.sim.demo.plan import SIM_COST_ENV, DemoOptions, DemoPlan, check_port_free, prepare


def run_demo(options: DemoOptions) -> int:
    """`planner demo`: validate, then run until the end or Ctrl-C / SIGTERM. The exit status."""
    # One line per long-poll would bury the status lines.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    cost = os.environ.get(SIM_COST_ENV)
    if cost:
        try:
            options = dataclasses.replace(options, sim_cost_s=float(cost))
        except ValueError:
            raise ConfigError(f"{SIM_COST_ENV}: not a number: {cost!r}") from None
    plan = prepare(options)  # ConfigError: the caller prints one line and exits 2
    check_port_free(options.port)
    return asyncio.run(_main(plan))


async def _main(plan: DemoPlan) -> int:
    demo = Demo(plan)
    task = asyncio.create_task(demo.run())
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            demo.stop_signal = signal.Signals(signum).name
            print(f"\n{demo.stop_signal}: stopping the demo ...", file=sys.stderr, flush=True)
            task.cancel()
        else:
            print("still stopping (the service gets SIGKILL after 10 s) ...", file=sys.stderr, flush=True)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await task
    except asyncio.CancelledError:
        return 0
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
