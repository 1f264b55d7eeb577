"""The demo's real-protocol adapters around the simulated cluster.

- `HttpEndpoint`: uvicorn on loopback, in a thread of its own, serving the simulated frontend's
  `/metrics` (Prometheus text) and the demo's `/status` (JSON) from the simulator's latest
  snapshot;
- `FpmPublisher`: one ZMQ publisher per engine on `tcp://127.0.0.1:{base_port + n}` (Dynamo's
  layout), sending each ForwardPassMetrics record as `(topic, 8-byte big-endian sequence,
  msgpack payload)` without ever blocking the simulation;
- `PlannerService`: `planner serve` as a child process, started and stopped cleanly.

The virtual connector's other side, the orchestrator, is app/sim/demo/orchestrator.py. Nothing
here knows about wall-clock speed: the demo (`app/sim/demo/harness.py`) owns the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgpack
import uvicorn
import zmq

from app.core.perf.fpm import ForwardPassMetrics

log = logging.getLogger(__name__)

# --- HTTP endpoints ---------------------------------------------------------------------------------

# path -> () -> (content type, body); called on the endpoint's own thread, so it must only read
# what another thread published (the simulator's latest snapshot).
Route = Callable[[], tuple[str, bytes]]


class _NoSignalServer(uvicorn.Server):
    """uvicorn in a process that handles Ctrl-C itself: the demo stops the server, not uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


class HttpEndpoint:
    """A few GET routes served by uvicorn on loopback, in a thread (and event loop) of its own:
    neither a slow simulation step nor the demo's own loop can keep it from answering."""

    def __init__(self, routes: Mapping[str, Route], host: str = "127.0.0.1", port: int = 0) -> None:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route as StarletteRoute

        def endpoint(route: Route):  # type: ignore[no-untyped-def]
            async def handle(request: Request) -> Response:
                content_type, body = route()
                return Response(body, media_type=content_type)

            return handle

        app = Starlette(routes=[StarletteRoute(path, endpoint(route)) for path, route in routes.items()])
        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", access_log=False, lifespan="off", log_config=None
        )
        self.host = host
        self._server = _NoSignalServer(config)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        assert self._thread is not None and self._server.started, "not started"
        return self._server.servers[0].sockets[0].getsockname()[1]

    def url(self, path: str = "") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def _serve(self) -> None:
        try:
            asyncio.run(self._server.serve())
        except BaseException as exc:  # reported by start() or close()
            self._error = exc

    async def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="http-endpoint", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                if self._error is not None:
                    raise self._error  # why it could not start (port taken, ...)
                raise RuntimeError("the HTTP endpoint stopped while starting")
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        if self._thread is None:
            return
        self._server.should_exit = True
        await asyncio.to_thread(self._thread.join, 10.0)
        self._thread = None


# --- FPM over ZMQ ---------------------------------------------------------------------------------

FPM_TOPIC = b""
# Per-subscriber queue, in messages. Past it a message is dropped (and counted), never waited for:
# a slow subscriber must not slow the simulated cluster down.
FPM_SNDHWM = 10_000


class FpmPublisher:
    """One publisher socket per engine slot, bound to `tcp://{host}:{base_port + n}`.

    Each role has its own range of slots (prefill first, then decode), so the planner can be told
    which endpoints are which role's. Engines come and go; an engine takes the lowest free slot
    of its role (the cluster names engines `prefill-N` / `decode-N`) when it reports its first
    record and gives it back when it stops (`release_stopped`), the way a restarted engine reuses
    its port. Sockets are XPUB with XPUB_NODROP, wire-compatible with PUB for subscribers: a plain PUB
    drops silently at the high-water mark, XPUB_NODROP says so (EAGAIN) and the drop is counted.
    """

    def __init__(
        self,
        slots: dict[str, int],
        *,
        host: str = "127.0.0.1",
        base_port: int | None = None,
        sndhwm: int = FPM_SNDHWM,
    ) -> None:
        if not slots or min(slots.values()) < 1:
            raise ValueError(f"need at least one FPM slot per role, got {slots}")
        total = sum(slots.values())
        self.host = host
        self._context = zmq.Context()
        self._sockets: list[zmq.Socket] = []
        self._sndhwm = sndhwm
        self.base_port = self._bind(total, base_port)
        self._sequence = [0] * total
        self._slot_of: dict[str, int] = {}
        # Per role, kept sorted: the lowest free slot is taken first.
        self._free: dict[str, list[int]] = {}
        first = 0
        for role, count in slots.items():
            self._free[role] = list(range(first, first + count))
            first += count
        self._role_slots = {role: list(free) for role, free in self._free.items()}
        self.sent = 0
        self.dropped = 0  # at the high-water mark
        self.unplaced = 0  # more engines than slots (an operator raised the bounds)
        self._pack = msgpack.Packer().pack

    @property
    def endpoints(self) -> list[str]:
        return [f"tcp://{self.host}:{self.base_port + n}" for n in range(len(self._sockets))]

    @property
    def endpoints_by_role(self) -> dict[str, list[str]]:
        return {
            role: [f"tcp://{self.host}:{self.base_port + n}" for n in slots]
            for role, slots in self._role_slots.items()
        }

    def endpoint_of(self, engine_id: str) -> str | None:
        slot = self._slot_of.get(engine_id)
        return None if slot is None else f"tcp://{self.host}:{self.base_port + slot}"

    def _bind(self, slots: int, base_port: int | None, attempts: int = 50) -> int:
        """Bind `slots` consecutive ports; a random base unless one is given."""
        rng = random.Random()
        for _ in range(attempts if base_port is None else 1):
            base = base_port if base_port is not None else rng.randrange(20_000, 60_000 - slots)
            sockets: list[zmq.Socket] = []
            try:
                for n in range(slots):
                    sock = self._context.socket(zmq.XPUB)
                    sockets.append(sock)
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.setsockopt(zmq.SNDHWM, self._sndhwm)
                    sock.setsockopt(zmq.XPUB_NODROP, 1)
                    sock.bind(f"tcp://{self.host}:{base + n}")
            except zmq.ZMQError as exc:
                for sock in sockets:
                    sock.close(linger=0)
                if base_port is not None:
                    raise OSError(f"cannot bind the FPM ports {base}..{base + slots - 1}: {exc}") from None
                continue
            self._sockets = sockets
            return base
        raise OSError(f"found no {slots} consecutive free ports for the FPM publishers")

    def publish(self, fpm: ForwardPassMetrics) -> None:
        """The cluster's `on_fpm` callback: one multipart message, never blocking."""
        slot = self._slot_of.get(fpm.worker_id)
        if slot is None:
            free = self._free.get(fpm.worker_id.split("-", 1)[0])
            if not free:
                self.unplaced += 1
                return
            slot = free.pop(0)
            self._slot_of[fpm.worker_id] = slot
        seq = self._sequence[slot]
        try:
            self._sockets[slot].send_multipart(
                (FPM_TOPIC, seq.to_bytes(8, "big"), self._pack(fpm.as_wire())), flags=zmq.NOBLOCK
            )
        except zmq.Again:
            self.dropped += 1
            return
        self._sequence[slot] = seq + 1
        self.sent += 1

    def release_stopped(self, live_engine_ids: set[str]) -> None:
        """Give back the slots of engines that stopped."""
        gone = [engine_id for engine_id in self._slot_of if engine_id not in live_engine_ids]
        for engine_id in gone:
            free = self._free[engine_id.split("-", 1)[0]]
            free.append(self._slot_of.pop(engine_id))
            free.sort()

    def drain_subscriptions(self) -> None:
        """XPUB hands subscription messages up; nobody needs them, so keep the queues empty."""
        for sock in self._sockets:
            with contextlib.suppress(zmq.Again):
                while True:
                    sock.recv(flags=zmq.NOBLOCK)

    def close(self) -> None:
        for sock in self._sockets:
            sock.close(linger=0)
        self._sockets = []
        self._context.term()


# --- the planner service as a child process -------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the service gets SIGTERM if the demo dies without cleaning up (SIGKILL), so no
    orphaned planner keeps the port."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ServiceError(Exception):
    """The planner service did not start, or stopped on its own."""


@dataclass
class PlannerService:
    """`planner serve` with the given PLANNER_* settings, logging to `log_path`."""

    settings_env: dict[str, str]
    log_path: Path
    port: int
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        # The user's own PLANNER_* variables (tokens, another database) must not leak in.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
        env.update(self.settings_env)
        with self.log_path.open("ab") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "serve"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                # Its own session: a terminal Ctrl-C reaches the demo only, which then stops the
                # orchestrator before the service (and waits for it).
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )

    def exit_status(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    async def wait_ready(self, timeout_s: float) -> None:
        """Until `/readyz` answers 200: the database is migrated, the worker scraped the frontend
        and ticked once. ServiceError if the process exits or the time runs out."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        async with httpx.AsyncClient(base_url=self.base_url, timeout=2.0) as client:
            while time.monotonic() < deadline:
                status = self.exit_status()
                if status is not None:
                    raise ServiceError(
                        f"the planner service exited with status {status} during start-up; "
                        f"its log ({self.log_path}) ends with:\n{self.log_tail()}"
                    )
                try:
                    resp = await client.get("/readyz")
                    if resp.status_code == 200:
                        return
                    last = f"/readyz answered {resp.status_code}: {resp.text[:300]}"
                except httpx.TransportError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.1)
        raise ServiceError(f"the planner service was not ready within {timeout_s:g} s ({last})")

    async def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL; the exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                log.warning("the planner service did not stop within %g s; killing it", timeout_s)
                proc.kill()
                await asyncio.to_thread(proc.wait)
        return proc.returncode
