"""Running the app under uvicorn so that every start-up failure is one line, not uvicorn's
traceback and exit status 3.

`planner serve` binds its socket itself (a port in use is then one line naming the setting) and
hands it to a `uvicorn.Server`, wrapped in `StartupGuard`: when the app's lifespan fails (the
database, a connector), the guard keeps the exception and the traceback out of the log, and
`serve` raises `StartupError` with one line the command line prints. uvicorn runs without a
logging configuration of its own (`log_config=None`): its loggers propagate to the service's
handler (app/logs.py), which escapes control characters like every other record.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

log = logging.getLogger(__name__)

# What uvicorn logs after a failed lifespan; the one line `planner: error: ...` replaces it.
_UVICORN_STARTUP_FAILED = "Application startup failed. Exiting."


class StartupError(Exception):
    """`planner serve` could not start; the message is one line."""


class StartupGuard:
    """An ASGI wrapper around the app: a failure of the lifespan's start-up is kept in `error`,
    and the traceback text Starlette attaches to `lifespan.startup.failed` is dropped (uvicorn
    would log it as one multi-line record). Everything else passes through unchanged."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.error: BaseException | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        started = False

        async def guarded_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "lifespan.startup.complete":
                started = True
            elif message["type"] == "lifespan.startup.failed":
                message = {"type": "lifespan.startup.failed", "message": ""}
            await send(message)

        try:
            await self.app(scope, receive, guarded_send)
        except BaseException as exc:
            if not started and self.error is None:
                self.error = exc
            raise


class _DropStartupFailed(logging.Filter):
    def __init__(self, guard: StartupGuard) -> None:
        super().__init__()
        self.guard = guard

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.guard.error is not None and record.getMessage() == _UVICORN_STARTUP_FAILED)


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (not yet listening: uvicorn's server does that)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise StartupError(f"PLANNER_HOST, PLANNER_PORT: cannot listen on {host}:{port}: {reason}") from None
    return sock


def serve(app: Any, sock: socket.socket, *, log_level: str, describe: Any) -> None:
    """Serve `app` on `sock` until stopped. A start-up failure raises StartupError with
    `describe(exception)`, one line."""
    import uvicorn

    guard = StartupGuard(app)
    config = uvicorn.Config(
        guard,
        log_config=None,
        log_level=log_level.lower(),
        access_log=False,
        interface="asgi3",
        lifespan="on",
        # Held long-polls (up to 300 s) must not keep a stopping planner alive; orchestrators
        # poll again and another process (or this one, restarted) answers.
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    drop = _DropStartupFailed(guard)
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(drop)
    try:
        server.run(sockets=[sock])
    except SystemExit:
        if server.started:
            raise
    finally:
        uvicorn_log.removeFilter(drop)
        sock.close()
    if not server.started and guard.error is not None:
        log.debug("start-up failed", exc_info=guard.error)
        raise StartupError(describe(guard.error))
