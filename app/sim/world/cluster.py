"""The simulated disaggregated cluster: a router, prefill and decode engines, scaling and billing.

Discrete events on a simulated clock (seconds from the trace's start). `run_until(t)` processes
every event up to `t`; between calls the owner (replay or demo) reads the state and orders
replicas with `set_target`. Nothing here reads the wall clock, and for a given trace the result is
the same on every run (ties are broken by insertion order).

- Routing: a new request goes to the prefill engine with the fewest prompt tokens pending; when
  its prompt is done (its first token), its KV goes to the decode engine with the least KV
  reserved or waiting. Only ready engines that are not draining take work; while a role has
  none, requests wait at the router.
- Scaling: an engine ordered at t serves from t + `startup_delay_s` and is billed from t. Going
  down cancels engines still starting first (billing stops at once), then removes ready ones,
  which take no new work from then on. How they go is `removal_grace_s`:
  - None (drain): the least loaded ready engines go, billed until they are empty; no request is
    cut off, so which engines go changes only the bill;
  - a number of seconds (a cluster's termination grace period): the engines named by the
    caller's `remove` hint go first, in its order, then the youngest ready ones (the order
    Kubernetes' ReplicaSet controller removes pods in); each stops when empty or when its grace
    period ends, and the requests it still holds then are cut off: they never finish and count
    as misses, and `cut_off` counts them.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.core.perf.fpm import ForwardPassMetrics
from app.core.traces import TraceRequest
from app.sim.world.engines import DecodeEngine, PrefillEngine, SimRequest
from app.sim.world.frontend import FrontendCounters
from app.sim.world.truth import TruthModel

Engine = PrefillEngine | DecodeEngine
ROLES = ("prefill", "decode")

_ARRIVAL, _READY, _PREFILL_DONE, _DECODE_DONE, _GRACE_ENDS = range(5)


@dataclass(frozen=True)
class ReplicaSample:
    """The replica state of one role right after a change."""

    at_s: float
    role: str
    target: int
    billed: int  # starting + serving + draining
    ready: int  # serving (ready and not draining)
    starting: int
    draining: int


class _Slot:
    """An engine's life: ordered, ready, draining, stopped."""

    __slots__ = ("engine", "ordered_s", "ready_s", "draining", "stopped_s")

    def __init__(self, engine: Engine, ordered_s: float, ready_s: float) -> None:
        self.engine = engine
        self.ordered_s = ordered_s
        self.ready_s = ready_s
        self.draining = False
        self.stopped_s: float | None = None


class Cluster:
    def __init__(
        self,
        truth: TruthModel,
        requests: Sequence[TraceRequest],
        *,
        initial: dict[str, int],
        startup_delay_s: float,
        gpus_per_engine: dict[str, int] | None = None,
        model_name: str = "model",
        on_fpm: Callable[[ForwardPassMetrics], None] | None = None,
        record_roles: Sequence[str] = (),
        removal_grace_s: float | None = None,
    ) -> None:
        if not (math.isfinite(startup_delay_s) and startup_delay_s >= 0):
            raise ValueError(f"startup_delay_s must be >= 0, got {startup_delay_s!r}")
        if removal_grace_s is not None and not (math.isfinite(removal_grace_s) and removal_grace_s >= 0):
            raise ValueError(f"removal_grace_s must be >= 0, got {removal_grace_s!r}")
        self.truth = truth
        self.removal_grace_s = removal_grace_s
        self.startup_delay_s = float(startup_delay_s)
        self.gpus_per_engine = {role: (gpus_per_engine or {}).get(role, 1) for role in ROLES}
        self.requests = [
            SimRequest(i, r.arrival_s, r.isl_tokens, r.osl_tokens) for i, r in enumerate(requests)
        ]
        self.frontend = FrontendCounters(model_name)
        self.on_fpm = on_fpm
        # Every forward pass of these roles, kept until `take_fpm_records` (a policy that reads
        # them all, as a planner subscribed to the engines' FPM stream does).
        self._records: dict[str, list[ForwardPassMetrics]] = {role: [] for role in record_roles}
        self.now = 0.0
        self.completed = 0
        self.cut_off = 0  # requests an engine held when its grace period ended
        self.targets = {role: 0 for role in ROLES}
        self.timeline: list[ReplicaSample] = []
        self._slots: dict[str, list[_Slot]] = {role: [] for role in ROLES}
        self._serving: dict[str, list[_Slot]] = {role: [] for role in ROLES}
        self._waiting: dict[str, deque[SimRequest]] = {role: deque() for role in ROLES}
        self._events: list[tuple[float, int, int, object, int]] = []
        self._seq = 0
        self._next_arrival = 0
        self._engine_no = {role: 0 for role in ROLES}
        self._stopped_gpu_s = 0.0
        for role in ROLES:
            count = int(initial.get(role, 0))
            self.targets[role] = count
            for _ in range(count):
                self._order(role, ready_s=0.0)
        self._record_all()

    # --- events ---------------------------------------------------------------------------

    def _push(self, at_s: float, kind: int, obj: object, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at_s, self._seq, kind, obj, version))

    @property
    def done(self) -> bool:
        return self.completed + self.cut_off == len(self.requests)

    @property
    def last_arrival_s(self) -> float:
        return self.requests[-1].arrival_s if self.requests else 0.0

    def run_until(self, until_s: float) -> None:
        """Process every event at or before `until_s`, then set the clock to `until_s`."""
        requests = self.requests
        events = self._events
        while True:
            next_arrival = (
                requests[self._next_arrival].arrival_s if self._next_arrival < len(requests) else math.inf
            )
            next_event = events[0][0] if events else math.inf
            if min(next_arrival, next_event) > until_s or next_arrival == next_event == math.inf:
                break
            if next_arrival <= next_event:
                request = requests[self._next_arrival]
                self._next_arrival += 1
                self.now = request.arrival_s
                self.frontend.on_arrival()
                self._route("prefill", request)
                continue
            at_s, _, kind, obj, version = heapq.heappop(events)
            self.now = at_s
            if kind == _PREFILL_DONE:
                self._prefill_done(obj)  # type: ignore[arg-type]
            elif kind == _DECODE_DONE:
                engine: DecodeEngine = obj  # type: ignore[assignment]
                if version == engine.version:
                    self._decode_done(engine)
            elif kind == _READY:
                self._became_ready(obj)  # type: ignore[arg-type]
            elif kind == _GRACE_ENDS:
                self._grace_ends(obj)  # type: ignore[arg-type]
        self.now = max(self.now, float(until_s))

    def _route(self, role: str, request: SimRequest) -> None:
        serving = self._serving[role]
        if not serving:
            self._waiting[role].append(request)
            self.frontend.queued += 1
            return
        slot = min(serving, key=lambda s: s.engine.load)
        self._give(slot.engine, request)

    def _give(self, engine: Engine, request: SimRequest) -> None:
        now = self.now
        if isinstance(engine, PrefillEngine):
            request.prefill_engine = engine.id
            engine.enqueue(request)
            end = engine.start(now)
            if end is not None:
                self._push(end, _PREFILL_DONE, engine)
        else:
            request.decode_engine = engine.id
            engine.add(request)
            self._restart_decode(engine, engine.join(now))

    def _restart_decode(self, engine: DecodeEngine, end: float | None) -> None:
        if end is not None:
            self._push(end, _DECODE_DONE, engine, engine.version)

    def _prefill_done(self, engine: PrefillEngine) -> None:
        if engine.killed:
            return  # its iteration's requests were cut off with it
        now = self.now
        for request in engine.finish(now):
            self.frontend.on_first_token(now - request.arrival_s)
            if request.osl <= 1:
                self._complete(request, now)
            else:
                self._route("decode", request)
        end = engine.start(now)
        if end is not None:
            self._push(end, _PREFILL_DONE, engine)
        else:
            self._maybe_stop(engine)

    def _decode_done(self, engine: DecodeEngine) -> None:
        finished, end = engine.finish(self.now)
        for request in finished:
            self._complete(request, self.now)
        if end is not None:
            self._restart_decode(engine, end)
        else:
            self._maybe_stop(engine)

    def _complete(self, request: SimRequest, now: float) -> None:
        request.finish_s = now
        self.completed += 1
        self.frontend.on_complete(request.isl, request.osl, request.itl_s, now - request.arrival_s)

    # --- scaling ----------------------------------------------------------------------------

    def _order(self, role: str, ready_s: float) -> None:
        self._engine_no[role] += 1
        engine_id = f"{role}-{self._engine_no[role]}"
        on_fpm = self._records[role].append if role in self._records else self.on_fpm
        engine: Engine = (
            PrefillEngine(engine_id, self.truth, on_fpm)
            if role == "prefill"
            else DecodeEngine(engine_id, self.truth, on_fpm)
        )
        slot = _Slot(engine, ordered_s=self.now, ready_s=ready_s)
        self._slots[role].append(slot)
        if ready_s <= self.now:
            self._serve(role, slot)
        else:
            self._push(ready_s, _READY, slot)

    def _serve(self, role: str, slot: _Slot) -> None:
        self._serving[role].append(slot)
        waiting = self._waiting[role]
        while waiting:
            self.frontend.queued -= 1
            self._route(role, waiting.popleft())

    def _became_ready(self, slot: _Slot) -> None:
        if slot.stopped_s is not None:
            return  # cancelled while starting
        role = slot.engine.role
        self._serve(role, slot)
        self._record(role)

    def set_target(self, role: str, count: int, remove: Sequence[str] = ()) -> None:
        """Order or remove engines of `role` so that `count` are billed and not draining;
        `remove` names the ready engines to remove first, in order (honoured when removal has a
        grace period: see the module's docstring)."""
        if count < 0:
            raise ValueError(f"replica count must be >= 0, got {count}")
        self.targets[role] = count
        live = [s for s in self._slots[role] if s.stopped_s is None and not s.draining]
        if count > len(live):
            for _ in range(count - len(live)):
                self._order(role, ready_s=self.now + self.startup_delay_s)
        elif count < len(live):
            excess = len(live) - count
            starting = sorted((s for s in live if s.ready_s > self.now), key=lambda s: -s.ordered_s)
            for slot in starting[:excess]:
                self._stop(slot)
            excess -= min(excess, len(starting))
            for slot in self._victims(role, remove)[:excess]:
                slot.draining = True
                self._serving[role].remove(slot)
                if self.removal_grace_s is not None:
                    self._push(self.now + self.removal_grace_s, _GRACE_ENDS, slot)
                self._maybe_stop(slot.engine)
        self._record(role)

    def _victims(self, role: str, remove: Sequence[str]) -> list[_Slot]:
        """The serving engines of `role` in the order they are removed."""
        serving = self._serving[role]
        if self.removal_grace_s is None:
            return sorted(serving, key=lambda s: s.engine.load)
        by_id = {s.engine.id: s for s in serving}
        named = [by_id.pop(w) for w in dict.fromkeys(remove) if w in by_id]
        youngest = sorted(by_id.values(), key=lambda s: (-s.ready_s, -s.ordered_s))
        return named + youngest

    def _grace_ends(self, slot: _Slot) -> None:
        if slot.stopped_s is not None:
            return  # emptied in time
        cut = slot.engine.kill()
        self.cut_off += len(cut)
        self.frontend.on_cut_off(len(cut))
        self._stop(slot)
        self._record(slot.engine.role)

    def _maybe_stop(self, engine: Engine) -> None:
        slot = next((s for s in self._slots[engine.role] if s.engine is engine), None)
        if slot is not None and slot.draining and slot.stopped_s is None and engine.empty:
            self._stop(slot)
            self._record(engine.role)

    def _stop(self, slot: _Slot) -> None:
        slot.stopped_s = self.now
        role = slot.engine.role
        self._stopped_gpu_s += (self.now - slot.ordered_s) * self.gpus_per_engine[role]
        self._slots[role].remove(slot)

    # --- observation ------------------------------------------------------------------------

    def counts(self, role: str) -> tuple[int, int, int, int]:
        """(billed, ready, starting, draining) engines of `role` now."""
        slots = self._slots[role]
        ready = len(self._serving[role])
        draining = sum(1 for s in slots if s.draining)
        return len(slots), ready, len(slots) - ready - draining, draining

    def ready_counts(self) -> dict[str, int]:
        return {role: len(self._serving[role]) for role in ROLES}

    def gpu_seconds(self, at_s: float | None = None) -> float:
        """GPU-seconds billed: every engine from its order until it stopped, or until `at_s`
        (default now; a time after the last change, such as the last request's finish)."""
        end = self.now if at_s is None else at_s
        running = sum(
            (end - s.ordered_s) * self.gpus_per_engine[role] for role in ROLES for s in self._slots[role]
        )
        return self._stopped_gpu_s + running

    def engines(self, role: str) -> list[Engine]:
        """Engines that are serving or draining (those that report FPM)."""
        return [s.engine for s in self._slots[role] if s.ready_s <= self.now]

    def serving_engines(self, role: str) -> list[Engine]:
        """Engines taking new work (ready, not draining)."""
        return [s.engine for s in self._serving[role]]

    def take_fpm_records(self) -> dict[str, list[ForwardPassMetrics]]:
        """The recorded roles' forward passes since the previous call, oldest first."""
        taken = {role: list(records) for role, records in self._records.items()}
        for records in self._records.values():
            records.clear()  # in place: the engines append to these lists
        return taken

    def fpm_snapshot(self) -> dict[str, dict[tuple[str, int], ForwardPassMetrics]]:
        """The latest FPM of every serving or draining engine, per role."""
        return {role: {(e.id, 0): e.fpm() for e in self.engines(role)} for role in ROLES}

    def _record(self, role: str) -> None:
        billed, ready, starting, draining = self.counts(role)
        self.timeline.append(
            ReplicaSample(self.now, role, self.targets[role], billed, ready, starting, draining)
        )

    def _record_all(self) -> None:
        for role in ROLES:
            self._record(role)
