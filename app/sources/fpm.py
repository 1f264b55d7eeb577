"""ForwardPassMetrics (FPM) ingestion: a ZMQ SUB client on each engine's publisher.

Engines publish one record per scheduler iteration, in one of two layouts, told apart by the
frame count; the record itself is read by `ForwardPassMetrics.from_wire` (map or positional
array, E3 or E4):

- the engine's own socket (vLLM's `_FpmPublisherThread`, local to the engine's pod), 3 frames:
  `(topic, 8-byte big-endian sequence, msgpack record)` (reference notes §4.2);
- Dynamo's event plane (`--event-plane zmq`: what `FpmDirectPublisher`, the mocker and
  `FpmEventRelay` publish, and what discovery names), 4 frames, checked against Dynamo 1.6.1
  (tests/data/dynamo-1.6.1/fpm_event_plane.json): `(topic "forward-pass-metrics", 8-byte
  big-endian publisher id, 8-byte big-endian sequence, frame)`, where the frame is a 5-byte
  header (version 1, then the 4-byte big-endian length of the rest) and a msgpack envelope map
  `{publisher_id, sequence, published_at, topic, payload}` whose `payload` (bytes) is the
  msgpack record. Before this was read here, the planner could subscribe only to the engine's own
  socket, which Dynamo does not advertise, so every endpoint had to be listed by hand.

The endpoints are a fixed list, or come from a `discover` callable (Dynamo's discovery, see
app/sources/dynamo_discovery.py) that the thread calls every `discover_every_s`: a publisher that
appears is subscribed to, one that disappears is closed and its engines leave the inventory at
once (counted in `removed`).

`FpmSubscriber` runs one daemon thread that owns a zmq Context and one SUB socket per endpoint,
so ingestion never runs on (or blocks) the event loop; consumers read a copy with `snapshot()`
and `new_trainable_records()`. The rules:

- the inventory keeps the latest record per `(worker_id, dp_rank)`, with the endpoint it came
  from and when it arrived; an engine silent for `engine_timeout_s` leaves it (`expired`);
- an idle heartbeat (`wall_time == 0`) refreshes liveness and is the engine's latest record
  (its queues are real), but is marked not trainable and never reaches
  `new_trainable_records()`, so the regressions are not fitted on idle iterations;
- the sequence is tracked per endpoint: a jump forward counts the missing messages as
  `dropped` (the engine's queue or a high-water mark lost them); a sequence at or below the last
  one is an engine restart (`restarts`), not an error;
- a malformed message (frame count, sequence frame, msgpack, schema) is skipped and counted per
  endpoint with the last reason; it is never fatal;
- an unexpected error in the thread stops it and is reported by `snapshot()` (`running`,
  `failure`) rather than swallowed.

Throughput matters (hundreds of thousands of messages per second, see bench/fpm_ingest.py): the
thread drains each ready socket until EAGAIN (bounded per round so one flooding engine cannot
starve the others), tallies in local variables, and publishes a round's results under the lock
in one step. The lock guards only the handoff: dict updates and copies, never decoding or I/O.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from types import TracebackType
from typing import Any

import zmq

from app.core.errors import SourceUnavailableError
from app.core.perf.fpm import ForwardPassMetrics
from app.sources.fpm_drain import Entry, drain
from app.sources.fpm_snapshot import (
    DrainTally,
    EndpointCounters,
    EndpointState,
    EngineFpm,
    EngineKey,
    FpmSnapshot,
)
from app.sources.fpm_wire import describe, validate_endpoint

log = logging.getLogger(__name__)

SOURCE_NAME = "fpm"

# Messages queued per endpoint while the thread is busy or descheduled: seconds of an engine's
# records (one per iteration), the size of Dynamo's own publisher queue. Past it messages are
# dropped, which the sequence counts; memory stays bounded per endpoint (about 0.5 KiB each).
DEFAULT_RCVHWM = 10_000
# Records kept for `new_trainable_records()` between two calls; older ones are dropped (counted).
DEFAULT_TRAINABLE_LIMIT = 10_000
POLL_TIMEOUT_MS = 50  # how promptly `stop()` is noticed when nothing arrives
EXPIRE_EVERY_S = 0.5  # the thread prunes silent engines at this cadence, besides `snapshot()`


class FpmSubscriber:
    """Subscribe to every endpoint in a background thread; read the inventory with `snapshot()`."""

    def __init__(
        self,
        endpoints: list[str],
        *,
        engine_timeout_s: float,
        monotonic: Callable[[], float] = time.monotonic,
        rcvhwm: int = DEFAULT_RCVHWM,
        trainable_limit: int = DEFAULT_TRAINABLE_LIMIT,
        discover: Callable[[], Collection[str]] | None = None,
        discover_every_s: float = 1.0,
    ) -> None:
        if engine_timeout_s <= 0:
            raise ValueError(f"engine_timeout_s must be positive, got {engine_timeout_s}")
        if len(set(endpoints)) != len(endpoints):
            raise ValueError("an FPM endpoint is listed twice")
        self._static = list(endpoints)
        self.endpoints = list(endpoints)  # what is subscribed to now (the thread updates it)
        self._discover = discover
        self._discover_every_s = discover_every_s
        self._removed = 0
        self._discovery_error: str | None = None
        self.engine_timeout_s = engine_timeout_s
        self._monotonic = monotonic
        self._rcvhwm = rcvhwm
        self._trainable_limit = trainable_limit
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._context: zmq.Context | None = None
        self._sockets: dict[str, zmq.Socket] = {}
        self._state = {ep: EndpointState(ep) for ep in self.endpoints}
        self._latest: dict[EngineKey, Entry] = {}
        self._trainable: deque[ForwardPassMetrics] = deque(maxlen=trainable_limit)
        self._trainable_overflow = 0
        self._expired = 0
        self._last_error: str | None = None
        self._failure: str | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise `SourceUnavailableError` unless every endpoint is a valid ZMQ address (and, with
        discovery, unless discovery can be read).

        Nothing is contacted: a SUB socket connects lazily and an engine that is not up yet is
        simply silent, which the inventory shows."""
        for endpoint in self._static:
            reason = validate_endpoint(endpoint)
            if reason is not None:
                raise SourceUnavailableError(SOURCE_NAME, f"{endpoint!r} is not a ZMQ address: {reason}")
        if self._discover is not None:
            try:
                self._discover()
            except Exception as exc:
                raise SourceUnavailableError(SOURCE_NAME, f"discovery: {describe(exc)}") from None

    def start(self) -> FpmSubscriber:
        if self._thread is not None:
            raise RuntimeError("the FPM subscriber was already started")
        self.check()
        # Sockets are created here, then used only by the thread (handing a socket to a thread
        # it then owns is allowed; the thread start is the memory barrier zmq asks for).
        self._context = zmq.Context()
        try:
            for endpoint in self._static:
                self._open(endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise SourceUnavailableError(SOURCE_NAME, f"cannot connect: {exc}") from None
        self._thread = threading.Thread(target=self._run, name="fpm-subscriber", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("the FPM subscriber thread did not stop within %.1f s", timeout_s)
        elif thread is None:
            self._close_sockets()

    def __enter__(self) -> FpmSubscriber:
        return self if self._thread is not None else self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _open(self, endpoint: str) -> zmq.Socket:
        assert self._context is not None
        sock = self._context.socket(zmq.SUB)
        self._sockets[endpoint] = sock
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, self._rcvhwm)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(endpoint)
        return sock

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- what consumers read --------------------------------------------------------------------

    def snapshot(self) -> FpmSnapshot:
        """A consistent copy: live engines, their ages, and the counters. Thread-safe."""
        now = self._monotonic()
        with self._lock:
            latest = self._latest.copy()
        self._expire(now, latest)
        with self._lock:
            counters = [state.values() for state in self._state.values()]
            expired, overflow = self._expired, self._trainable_overflow
            last_error = self._last_error
        endpoints = {values[0]: EndpointCounters(*values) for values in counters}
        engines = {
            key: EngineFpm(record, endpoint, max(0.0, now - at), record.wall_time_s != 0.0)
            for key, (record, endpoint, at) in latest.items()
        }
        return FpmSnapshot(
            engines=engines,
            endpoints=endpoints,
            received=sum(c.received for c in endpoints.values()),
            malformed=sum(c.malformed for c in endpoints.values()),
            dropped=sum(c.dropped for c in endpoints.values()),
            heartbeats=sum(c.heartbeats for c in endpoints.values()),
            restarts=sum(c.restarts for c in endpoints.values()),
            expired=expired,
            trainable_overflow=overflow,
            last_error=last_error,
            running=self.running,
            failure=self._failure,
            removed=self._removed,
            discovery_error=self._discovery_error,
        )

    def new_trainable_records(self) -> list[ForwardPassMetrics]:
        """Every non-heartbeat record received since the previous call, oldest first (at most
        `trainable_limit`; older ones were dropped and counted in `trainable_overflow`)."""
        fresh: deque[ForwardPassMetrics] = deque(maxlen=self._trainable_limit)
        with self._lock:
            taken, self._trainable = self._trainable, fresh
        return list(taken)

    def _expire(self, now: float, latest: dict[EngineKey, Entry]) -> None:
        """Remove the engines silent for `engine_timeout_s` from the inventory and from `latest`
        (the caller's copy of it)."""
        limit = now - self.engine_timeout_s
        stale = [key for key, (_, _, at) in latest.items() if at < limit]
        if not stale:
            return
        gone: list[EngineKey] = []
        with self._lock:
            for key in stale:
                entry = self._latest.get(key)
                if entry is not None and entry[2] < limit:  # not refreshed since the copy
                    del self._latest[key]
                    gone.append(key)
            self._expired += len(gone)
        for key in stale:  # a refreshed one is back in the next snapshot
            del latest[key]
        if gone:
            log.info("FPM: silent for %.1f s, left the inventory: %s", self.engine_timeout_s, gone)

    # --- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # reported through snapshot(): running=False, failure=...
            self._failure = f"{type(exc).__name__}: {exc}"
            log.exception("the FPM subscriber thread stopped")
        finally:
            self._close_sockets()

    def _loop(self) -> None:
        poller = zmq.Poller()
        state_of: dict[Any, EndpointState] = {}
        for endpoint, sock in self._sockets.items():
            poller.register(sock, zmq.POLLIN)
            state_of[sock] = self._state[endpoint]
        next_expiry = self._monotonic() + EXPIRE_EVERY_S
        next_discovery = self._monotonic()
        while not self._stop.is_set():
            if self._discover is not None and self._monotonic() >= next_discovery:
                self._rediscover(poller, state_of)
                next_discovery = self._monotonic() + self._discover_every_s
            ready = poller.poll(POLL_TIMEOUT_MS)
            now = self._monotonic()
            if ready:
                latest: dict[EngineKey, Entry] = {}
                trainable: list[ForwardPassMetrics] = []
                tallies = [drain(sock, state_of[sock], now, latest, trainable) for sock, _ in ready]
                self._publish(latest, trainable, tallies)
            if now >= next_expiry:
                with self._lock:
                    latest_copy = self._latest.copy()
                self._expire(now, latest_copy)
                next_expiry = now + EXPIRE_EVERY_S

    def _rediscover(self, poller: zmq.Poller, state_of: dict[Any, EndpointState]) -> None:
        """Subscribe to the publishers discovery names now, close the ones it no longer names
        (their engines leave the inventory at once). A failed `discover()` keeps what runs."""
        assert self._discover is not None
        try:
            found = list(dict.fromkeys([*self._static, *self._discover()]))
        except Exception as exc:
            if self._discovery_error is None:
                log.warning("FPM discovery failed (keeping %d publishers): %s", len(self._sockets), exc)
            self._discovery_error = describe(exc)
            return
        wanted = set(found)
        gone = [ep for ep in self._sockets if ep not in wanted]
        added = []
        error = None
        for endpoint in found:
            if endpoint in self._sockets:
                continue
            reason = validate_endpoint(endpoint)
            if reason is not None:
                error = f"discovery named {endpoint!r}, not a ZMQ address: {reason}"
                continue
            added.append(endpoint)
        if error is not None and error != self._discovery_error:
            log.warning("FPM: %s", error)
        self._discovery_error = error
        for endpoint in gone:
            sock = self._sockets.pop(endpoint)
            poller.unregister(sock)
            state_of.pop(sock, None)
            sock.close(linger=0)
        removed = 0
        with self._lock:
            for endpoint in gone:
                self._state.pop(endpoint, None)
            if gone:
                stale = [key for key, (_, ep, _) in self._latest.items() if ep in gone]
                for key in stale:
                    del self._latest[key]
                removed = len(stale)
                self._removed += removed
            for endpoint in added:
                self._state[endpoint] = EndpointState(endpoint)
        for endpoint in added:
            sock = self._open(endpoint)
            poller.register(sock, zmq.POLLIN)
            state_of[sock] = self._state[endpoint]
        if gone or added:
            self.endpoints = list(self._sockets)
            log.info(
                "FPM publishers: +%d %s, -%d %s (%d engines left with them)",
                len(added),
                added,
                len(gone),
                gone,
                removed,
            )

    def _publish(
        self, latest: dict[EngineKey, Entry], trainable: list[ForwardPassMetrics], tallies: list[DrainTally]
    ) -> None:
        first_errors = [t for t in tallies if t.error is not None and t.state.malformed == 0]
        with self._lock:
            self._latest.update(latest)
            if trainable:
                overflow = len(self._trainable) + len(trainable) - self._trainable_limit
                if overflow > 0:
                    self._trainable_overflow += overflow
                self._trainable.extend(trainable)
            for t in tallies:
                state = t.state
                state.received += t.received
                state.malformed += t.malformed
                state.dropped += t.dropped
                state.heartbeats += t.heartbeats
                state.restarts += t.restarts
                state.next_seq = t.next_seq
                if t.error is not None:
                    state.error = f"{state.endpoint}: {t.error}"
                    self._last_error = state.error
        for t in first_errors:  # once per endpoint; the counters and last_error say the rest
            log.warning("FPM: skipped a malformed message from %s: %s", t.state.endpoint, t.error)

    def _close_sockets(self) -> None:
        for sock in self._sockets.values():
            sock.close(linger=0)
        self._sockets = {}
        if self._context is not None:
            self._context.term()
            self._context = None
