"""What one SLA scaling tick costs, per sizing, side by side on the same replays.

Each sizing (`scaling.sizing`: headroom, attainment) steers the same world through the same
workloads; every call of the planner's tick (`EmbeddedPlanner.on_tick`: the whole core, learning
included) is timed with `time.perf_counter`, and so is the replay's wall time. Run both in one
process so that the machine's other jobs weigh on both alike.

    .venv/bin/python -m bench.sla_tick_cost [--workloads azure-conv-x30,code-bursts-spread] [--delay 120]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from app.sim.replay.config import DEFAULT_REPLAY_CONFIG, load_replay_config, with_overrides
from app.sim.replay.run import build_world, make_policy, run_policy
from app.sim.world.workload import build_workload

SIZINGS = ("headroom", "attainment")


def timed_run(name: str, delay_s: float, sizing: str) -> dict[str, float]:
    config = with_overrides(load_replay_config(DEFAULT_REPLAY_CONFIG), startup_delay_s=delay_s)
    scaling = config.deployment.scaling.model_copy(update={"sizing": sizing})
    config = dataclasses.replace(config, deployment=config.deployment.model_copy(update={"scaling": scaling}))
    world = build_world(config, build_workload(name))
    policy = make_policy("planner", world)
    times_ms: list[float] = []
    on_tick = policy.planner.on_tick

    def measured(tick_input):  # the planner's own tick, nothing of the simulator
        started = time.perf_counter()
        out = on_tick(tick_input)
        times_ms.append((time.perf_counter() - started) * 1000)
        return out

    policy.planner.on_tick = measured
    started = time.perf_counter()
    run_policy(world, policy, trace_name=name)
    wall_s = time.perf_counter() - started
    ordered = sorted(times_ms)
    return {
        "ticks": len(times_ms),
        "median_ms": statistics.median(times_ms),
        "p99_ms": ordered[int(0.99 * (len(ordered) - 1))],
        "planner_s": sum(times_ms) / 1000,
        "replay_wall_s": wall_s,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="azure-conv-x30,code-bursts-spread")
    parser.add_argument("--delay", type=float, default=120.0)
    args = parser.parse_args(argv)
    print("| workload | sizing | ticks | median ms | p99 ms | planner s | replay wall s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.workloads.split(","):
        for sizing in SIZINGS:
            r = timed_run(name, args.delay, sizing)
            print(
                f"| {name} | {sizing} | {r['ticks']} | {r['median_ms']:.2f} | {r['p99_ms']:.2f} "
                f"| {r['planner_s']:.1f} | {r['replay_wall_s']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
