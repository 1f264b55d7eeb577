"""The demo's simulator thread: the simulated cluster advanced on the simulated clock, in bounded
slices, by one thread that owns it.

- **Bounded slices.** Each step simulates at most `SLICE_SIM_S` simulated seconds, so no step can
  grow with the one before it (a step that has to catch up a long way is cut into many short
  ones), and the counters the planner scrapes move in small steps.
- **The clock follows the simulator.** Simulated time is a `SharedClockWriter` (app/workers/clock.py)
  that the planner service reads too, so both see the same seconds. The clock runs at --speed, or
  at `CAPACITY_MARGIN` of what the simulator achieves (simulated seconds per wall second of its
  recent slices) when that is less, the first time with one warning in the log; more than
  `MAX_LAG_SIM_S` behind, the clock is held back until the simulator has caught up. The planner
  then sees the traffic the trace has, at a lower wall rate, instead of a cluster that goes quiet
  while its clock runs on.
- **Nobody else touches the cluster.** The frontend's `/metrics`, the demo's `/status` and the
  orchestrator read the latest `SimSnapshot` (published after every slice, an immutable object);
  the orchestrator orders engines through `order`, which the thread applies before its next
  slice. The engines' FPM go out over ZMQ from this thread (their sockets are not shared).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.sim.demo.live import FpmPublisher
from app.sim.world.cluster import ROLES, Cluster
from app.workers.clock import SharedClockWriter

log = logging.getLogger(__name__)

STEP_S = 0.02  # wall seconds the thread waits when it has caught up with the clock
# A slice simulates at most this many simulated seconds: a tenth of the planner's 5 s tick, so the
# counters the planner scrapes move smoothly, whatever the speed.
SLICE_SIM_S = 0.5
CONTROL_S = 0.5  # wall seconds between adjustments of the clock's rate to the simulator's capacity
# Behind the clock by more than this many simulated seconds: hold the clock back (half the
# simulator's capacity) until it has caught up. Under half of the planner's 5 s tick, so its windows
# see the traffic of their own seconds.
MAX_LAG_SIM_S = 2.0
# The clock runs at this share of the simulator's capacity (simulated seconds per wall second of
# its recent slices) when that is below --speed.
CAPACITY_MARGIN = 0.8
CAPACITY_WEIGHT = 0.2  # of a new slice in the capacity's moving average
MIN_SLICE_FOR_CAPACITY_S = 0.05  # simulated seconds: shorter slices measure overheads only
MAX_SPEEDUP = 1.5  # per CONTROL_S
MIN_RATE_SHARE = 0.001  # of --speed: the slowest the clock goes
DRAIN_EVERY_S = 1.0  # wall seconds between emptying the XPUB sockets' subscription queues
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class SimSnapshot:
    """The cluster after one slice, for readers in other threads."""

    sim_s: float
    metrics: bytes  # the frontend's Prometheus text exposition
    targets: dict[str, int]
    ready: dict[str, int]
    billed: dict[str, int]
    starting: dict[str, int]  # ordered, not serving yet
    draining: dict[str, int]
    orders_applied: int  # sequence number of the last order applied
    requests_total: int
    arrived: int
    completed: int
    fpm_sent: int
    fpm_dropped: int
    fpm_unplaced: int
    clock_rate: float
    busy_s: float  # wall seconds spent simulating (inside Cluster.run_until)
    ended: str | None = None  # "end_of_trace" or "duration", once reached
    summary: dict[str, Any] | None = field(default=None, compare=False)


class SimulationThread:
    """Runs the cluster in its own thread (see the module docstring); `start`, then `stop`."""

    def __init__(
        self,
        cluster: Cluster,
        publisher: FpmPublisher,
        clock: SharedClockWriter,
        *,
        speed: float,
        duration_s: float | None = None,
        summarize: Callable[[Cluster, str], dict[str, Any]] | None = None,
        step_cost_s: float = 0.0,
    ) -> None:
        self.cluster = cluster
        self.publisher = publisher
        self.clock = clock
        self.speed = float(speed)
        self.duration_s = duration_s
        self._summarize = summarize
        # Test knob: extra wall seconds (slept, no CPU) per simulated second, a deliberately slow
        # simulator (PLANNER_DEMO_SIM_COST).
        self.step_cost_s = step_cost_s
        self._orders: queue.SimpleQueue[tuple[int, dict[str, int]]] = queue.SimpleQueue()
        self._order_seq = 0
        self._order_lock = threading.Lock()
        self._applied = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.busy_s = 0.0
        self.longest_slice_s = 0.0  # wall seconds of the slowest slice
        self.slowdowns = 0  # times the clock was slowed
        self.capacity: float | None = None  # simulated s per wall s of the recent slices
        self._holding = False  # the clock held back until the simulator catches up
        self.slowest_rate = self.speed  # the slowest rate the clock was set to (not its start-up pace)
        self._ended: str | None = None
        self._summary: dict[str, Any] | None = None
        self.snapshot = self._take_snapshot()

    # --- for other threads ------------------------------------------------------------------

    def order(self, targets: Mapping[str, int]) -> int:
        """Ask for `targets` engines (applied before the next slice); the order's number, which
        `SimSnapshot.orders_applied` reaches once it is applied."""
        with self._order_lock:
            self._order_seq += 1
            self._orders.put((self._order_seq, dict(targets)))
            return self._order_seq

    def ready_counts(self) -> tuple[int, dict[str, int]]:
        snapshot = self.snapshot
        return snapshot.orders_applied, snapshot.ready

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="simulator", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Stop after the current slice (orders still queued are applied first); False if the
        thread did not stop within `timeout_s`."""
        self._stop.set()
        if self._thread is None:
            self._apply_orders()
            self.snapshot = self._take_snapshot()
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # --- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        cluster = self.cluster
        control_wall = time.monotonic()
        drained_at = 0.0
        try:
            while not self._stop.is_set():
                self._apply_orders()
                target = self.clock.sim_s()
                if self.duration_s is not None:
                    target = min(target, self.duration_s)
                if target > cluster.now:
                    self._slice(min(target, cluster.now + SLICE_SIM_S))
                lag_s = max(0.0, target - cluster.now)
                self._hold_back(lag_s)
                wall = time.monotonic()
                if wall - drained_at > DRAIN_EVERY_S:
                    self.publisher.drain_subscriptions()
                    drained_at = wall
                self._check_end()
                self.snapshot = self._take_snapshot()
                if wall - control_wall >= CONTROL_S:
                    self._follow_capacity(lag_s)
                    control_wall = wall
                if lag_s <= 0:
                    self._stop.wait(STEP_S)
        except BaseException as exc:  # the demo's main loop reports it and stops
            log.exception("the simulator failed")
            self.error = exc
        finally:
            with contextlib.suppress(Exception):
                self._apply_orders()
                self.snapshot = self._take_snapshot()

    def _slice(self, until_s: float) -> None:
        cluster = self.cluster
        started, from_s = time.monotonic(), cluster.now
        cluster.run_until(until_s)
        if self.step_cost_s > 0:
            time.sleep((until_s - from_s) * self.step_cost_s)
        took_s = time.monotonic() - started
        self.busy_s += took_s
        self.longest_slice_s = max(self.longest_slice_s, took_s)
        self.publisher.release_stopped({e.id for role in ROLES for e in cluster.engines(role)})
        simulated_s = until_s - from_s
        if simulated_s >= MIN_SLICE_FOR_CAPACITY_S and took_s > 0:
            capacity = simulated_s / took_s
            previous = self.capacity
            self.capacity = (
                capacity
                if previous is None
                else (1 - CAPACITY_WEIGHT) * previous + CAPACITY_WEIGHT * capacity
            )

    def _active(self) -> bool:
        return not (self.duration_s is not None and self.cluster.now >= self.duration_s)

    def _hold_back(self, lag_s: float) -> None:
        """More than MAX_LAG_SIM_S behind: the clock runs at half the simulator's capacity until
        the simulator has caught up."""
        if not self._active():
            return  # the simulation is over; the clock runs on for the planner
        if lag_s > MAX_LAG_SIM_S and not self._holding:
            capacity = self.capacity if self.capacity is not None else self.clock.rate
            self._set_rate(min(self.clock.rate, capacity) * 0.5, lag_s)
            self._holding = True
        elif self._holding and lag_s <= MAX_LAG_SIM_S / 4:
            self._holding = False

    def _follow_capacity(self, lag_s: float) -> None:
        """The clock at --speed, or at CAPACITY_MARGIN of the simulator's capacity when that is
        less; faster again only once the simulator has caught up, at most MAX_SPEEDUP at a time."""
        if not self._active() or self._holding or self.capacity is None:
            return
        rate = self.clock.rate
        want = min(self.speed, self.capacity * CAPACITY_MARGIN)
        if want < rate * 0.95:
            self._set_rate(want, lag_s)
        elif want > rate * 1.05 and lag_s <= MAX_LAG_SIM_S / 4:
            self.clock.set_rate(min(want, rate * MAX_SPEEDUP))

    def _set_rate(self, rate: float, lag_s: float) -> None:
        """Slow the clock down (the first time with a warning)."""
        rate = max(self.speed * MIN_RATE_SHARE, rate)
        self.clock.set_rate(rate)
        self.slowest_rate = min(self.slowest_rate, rate)
        self.slowdowns += 1
        emit = log.warning if self.slowdowns == 1 else log.debug
        emit(
            "the simulator cannot keep up with speed x%g (%.1f simulated s behind, it simulates %.3g s "
            "per wall second): the simulated clock slows to x%.3g, and speeds up again when it can "
            "(a lower --speed or --rate-scale avoids it)",
            self.speed,
            lag_s,
            self.capacity or 0.0,
            rate,
        )

    def _apply_orders(self) -> None:
        while True:
            try:
                seq, targets = self._orders.get_nowait()
            except queue.Empty:
                return
            for role, count in targets.items():
                self.cluster.set_target(role, count)
            self._applied = seq

    def _check_end(self) -> None:
        if self._ended is not None:
            return
        cluster = self.cluster
        if self.duration_s is not None and cluster.now >= self.duration_s:
            self._ended = "duration"
        elif cluster.done:
            self._ended = "end_of_trace"
        else:
            return
        if self._summarize is not None:
            self._summary = self._summarize(cluster, self._ended)

    def _take_snapshot(self) -> SimSnapshot:
        cluster, publisher = self.cluster, self.publisher
        counts = {role: cluster.counts(role) for role in ROLES}
        return SimSnapshot(
            sim_s=cluster.now,
            metrics=cluster.frontend.render_prometheus().encode(),
            targets=dict(cluster.targets),
            ready={role: c[1] for role, c in counts.items()},
            billed={role: c[0] for role, c in counts.items()},
            starting={role: c[2] for role, c in counts.items()},
            draining={role: c[3] for role, c in counts.items()},
            orders_applied=self._applied,
            requests_total=len(cluster.requests),
            arrived=cluster.frontend.started,
            completed=cluster.completed,
            fpm_sent=publisher.sent,
            fpm_dropped=publisher.dropped,
            fpm_unplaced=publisher.unplaced,
            clock_rate=self.clock.rate,
            busy_s=self.busy_s,
            ended=self._ended,
            summary=self._summary,
        )
