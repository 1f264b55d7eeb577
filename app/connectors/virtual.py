"""The virtual connector: decisions live in SQL; orchestrators long-poll for them.

`DecisionHub` holds the long-poll waiters of this process. A writer in this process publishes
the new decision after its commit; on PostgreSQL, `PgDecisionListener` also LISTENs for the
NOTIFY every writer sends inside its transaction, so a decision stored by another planner
process wakes the waiters here too. Waking never needs a query per waiter: the hub caches the
newest decision per deployment, already encoded as the response body, and every waiter of that
deployment sends the same bytes.

The hub also bounds how many long-polls it holds, per caller and in total (beyond the bound a
caller is told to retry: `TooBusyError`), and `drain()` ends every held long-poll at once when
the process stops (`ShuttingDownError`), so a stopping planner never keeps an orchestrator
waiting for a decision it will not deliver.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable

import psycopg
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from app.core.errors import ShuttingDownError, TooBusyError
from app.reports.metrics import PlannerMetrics
from app.store.decisions import (
    NOTIFY_CHANNEL,
    WRITES_CHANNEL,
    decisions_version,
    get_decision_or_raise,
    latest_decision,
    latest_decision_after,
    replicas_of,
)
from app.store.models import Decision
from app.store.write_versions import WriteVersions

log = logging.getLogger(__name__)

# How often the listener thread looks up from its socket to see whether it should stop.
_STOP_POLL_S = 0.2
# A refused long-poll retries after this long: held ones end at their timeout or with a decision.
BUSY_RETRY_AFTER_S = 5
# A long-poll ended by a stopping process retries after this long, on another process or this one
# restarted.
DRAIN_RETRY_AFTER_S = 1


class DecisionHub:
    def __init__(
        self,
        session_factory: sessionmaker[Session],
        metrics: PlannerMetrics,
        encode: Callable[[Decision], bytes],
        *,
        max_held: int | None = None,
        max_held_per_caller: int | None = None,
    ) -> None:
        self._sf = session_factory
        self._metrics = metrics
        self._encode = encode
        self._max_held = max_held
        self._max_held_per_caller = max_held_per_caller
        self._loop: asyncio.AbstractEventLoop | None = None
        self._latest: dict[str, tuple[int, bytes]] = {}
        self._events: dict[str, asyncio.Event] = {}
        self._subscribers: dict[str, list[Callable[[int], Awaitable[None]]]] = {}
        self._callbacks: set[asyncio.Future[None]] = set()
        self._held = 0
        self._held_by_caller: dict[str, int] = {}
        self._draining = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _event(self, deployment: str) -> asyncio.Event:
        event = self._events.get(deployment)
        if event is None:
            event = self._events[deployment] = asyncio.Event()
        return event

    def _publish(self, deployment: str, decision_id: int, body: bytes) -> None:
        """On the event loop: remember the decision and wake this deployment's waiters."""
        cached = self._latest.get(deployment)
        if cached is not None and cached[0] >= decision_id:
            return  # already seen (our own write, echoed back by NOTIFY)
        self._latest[deployment] = (decision_id, body)
        old = self._events.pop(deployment, None)
        if old is not None:
            old.set()
        for callback in self._subscribers.get(deployment, ()):
            task = asyncio.ensure_future(callback(decision_id))
            self._callbacks.add(task)
            task.add_done_callback(self._callback_done)

    def subscribe(self, deployment: str, callback: Callable[[int], Awaitable[None]]) -> None:
        """Call `callback(decision_id)` on the event loop for every new decision of `deployment`."""
        self._subscribers.setdefault(deployment, []).append(callback)

    def _callback_done(self, task: asyncio.Future[None]) -> None:
        self._callbacks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("decision subscriber failed: %s", task.exception())

    def announce(self, decision: Decision) -> None:
        """From a writer's thread, after its commit: log, export and wake the waiters."""
        log.info(
            "[%s] decision %d (%s): %s; %s",
            decision.deployment,
            decision.decision_id,
            decision.source,
            " ".join(f"{role}={n}" for role, n in replicas_of(decision).items()),
            " | ".join(decision.reasons),
            extra={
                "deployment": decision.deployment,
                "decision_id": decision.decision_id,
                "tick_id": decision.tick_id,
            },
        )
        self._metrics.decisions.labels(decision.deployment, decision.source).inc()
        self._metrics.observe_decision(decision.deployment, replicas_of(decision), decision.status)
        self.publish_threadsafe(decision)

    def publish_threadsafe(self, decision: Decision) -> None:
        if self._loop is None or self._loop.is_closed():
            return
        body = self._encode(decision)  # once, in the writer's thread, not per waiter
        self._loop.call_soon_threadsafe(self._publish, decision.deployment, decision.decision_id, body)

    @property
    def held(self) -> int:
        """Long-polls held right now (what the dynamo_planner_decision_waiters gauge shows)."""
        return self._held

    def drain(self) -> None:
        """On the event loop: end every held long-poll with `ShuttingDownError`, and refuse new
        ones, because this process is stopping. Idempotent."""
        if self._draining:
            return
        self._draining = True
        log.info("stopping: ending %d held long-poll(s)", self._held)
        for event in self._events.values():
            event.set()  # every waiter wakes, sees the drain and answers 503
        self._events.clear()

    def _shutting_down(self) -> ShuttingDownError:
        return ShuttingDownError(
            "this planner process is stopping; poll again", retry_after_s=DRAIN_RETRY_AFTER_S
        )

    def _admit(self, caller: str) -> None:
        if self._max_held is not None and self._held >= self._max_held:
            raise TooBusyError(
                f"{self._held} long-polls are held, the most this process holds "
                "(PLANNER_MAX_HELD_LONGPOLLS); retry later",
                retry_after_s=BUSY_RETRY_AFTER_S,
            )
        mine = self._held_by_caller.get(caller, 0)
        if self._max_held_per_caller is not None and mine >= self._max_held_per_caller:
            raise TooBusyError(
                f"this caller already holds {mine} long-polls, the most one caller may hold "
                "(PLANNER_MAX_HELD_LONGPOLLS_PER_CALLER); retry later",
                retry_after_s=BUSY_RETRY_AFTER_S,
            )
        self._held += 1
        self._held_by_caller[caller] = mine + 1
        self._metrics.waiters.inc()

    def _release(self, caller: str) -> None:
        self._held -= 1
        left = self._held_by_caller[caller] - 1
        if left:
            self._held_by_caller[caller] = left
        else:
            del self._held_by_caller[caller]
        self._metrics.waiters.dec()

    async def wait(self, deployment: str, after: int, timeout_s: float, *, caller: str = "") -> bytes | None:
        """The latest decision with id > `after` (as the JSON response body), at once or as soon
        as one is stored; None at the timeout.

        Only a request that has to be held counts against the bounds (`TooBusyError` beyond them,
        for `caller` or in total); one answered at once is never refused. Cancelling the call (the
        client hung up) releases its place at once."""
        if self._draining:
            raise self._shutting_down()
        # Take the event before querying: a decision committed between the query and the
        # wait still sets this very event, so it cannot slip through.
        event = self._event(deployment)
        found = await asyncio.to_thread(self._query_after, deployment, after)
        if found is not None:
            return self._encode(found)
        if self._draining:
            raise self._shutting_down()
        if timeout_s <= 0:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._admit(caller)
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                try:
                    # Not wait_for: on Python 3.11 it runs the wait in a task of its own, one more
                    # step for each of the waiters a decision wakes.
                    async with asyncio.timeout(remaining):
                        await event.wait()
                except TimeoutError:
                    return None
                if self._draining:
                    raise self._shutting_down()
                cached = self._latest.get(deployment)
                if cached is not None and cached[0] > after:
                    return cached[1]
                event = self._event(deployment)
        finally:
            self._release(caller)

    def _query_after(self, deployment: str, after: int) -> Decision | None:
        with self._sf() as session:
            return latest_decision_after(session, deployment, after)

    def refresh(self, deployments: list[str]) -> None:
        """From any thread: publish the newest stored decision of each deployment (after a
        reconnect, notifications may have been missed)."""
        with self._sf() as session:
            for name in deployments:
                decision = latest_decision(session, name)
                if decision is not None:
                    self.publish_threadsafe(decision)


class PgDecisionListener:
    """A thread holding one LISTEN connection; reconnects with backoff and reports its state.
    It wakes the hub's waiters on new decisions, and keeps `versions` (the decision page cache's
    view of every write) live while connected."""

    def __init__(
        self,
        url: str,
        hub: DecisionHub,
        session_factory: sessionmaker[Session],
        deployments: list[str],
        metrics: PlannerMetrics,
        versions: WriteVersions | None = None,
    ) -> None:
        self._versions = versions
        self._conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._hub = hub
        self._sf = session_factory
        self._deployments = deployments
        self._up_gauge = metrics.add_notify_gauge()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-decision-listener", daemon=True)
        self.connected = threading.Event()
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        backoff_s = 0.5
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    conn.execute(f"LISTEN {WRITES_CHANNEL}")
                    if self._versions is not None:
                        # Seeded after LISTEN: a write either is in this read or is notified.
                        with self._sf() as session:
                            self._versions.seed(decisions_version(session, None))
                    self.connected.set()
                    self._up_gauge.set(1)
                    self.last_error = None
                    backoff_s = 0.5
                    self._hub.refresh(self._deployments)
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=_STOP_POLL_S):
                            if note.channel == WRITES_CHANNEL:
                                self._saw_write(note.payload)
                            else:
                                self._deliver(note.payload)
            except Exception as exc:  # reconnect on anything; the state is visible in /readyz
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("decision listener lost its connection (%s); retrying in %.1f s", exc, backoff_s)
            finally:
                if self._versions is not None:
                    self._versions.down()
                self.connected.clear()
                self._up_gauge.set(0)
            self._stop.wait(backoff_s)
            backoff_s = min(backoff_s * 2, 10.0)

    def _saw_write(self, payload: str) -> None:
        note = _note(payload, "seq")
        if note is not None and self._versions is not None:
            self._versions.saw(*note)

    def _deliver(self, payload: str) -> None:
        note = _note(payload, "id")
        if note is None:
            return
        with self._sf() as session:
            decision = get_decision_or_raise(session, *note)
        self._hub.publish_threadsafe(decision)


def _note(payload: str, number: str) -> tuple[str, int] | None:
    """(deployment, the payload's `number` field) of a notification; None, logged, if malformed."""
    try:
        note = json.loads(payload)
        return str(note["deployment"]), int(note[number])
    except (ValueError, KeyError, TypeError):
        log.warning("ignoring malformed notification %r", payload)
        return None
