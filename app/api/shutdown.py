"""Hearing of SIGTERM as it arrives, not after the server has drained.

On SIGTERM uvicorn stops accepting connections, then waits up to `timeout_graceful_shutdown`
for the requests in progress to end, and only then runs the lifespan shutdown. A held long-poll
(`GET /decisions/wait`, up to 300 s) does not end by itself, so it was cancelled at that timeout
and answered with a 500 and a traceback, seconds after the signal. The application has to learn
of the signal when it arrives to answer those requests at once; no ASGI event says so, so the
lifespan chains a callback in front of the server's own signal handlers.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def chain_shutdown_signals(
    loop: asyncio.AbstractEventLoop, callback: Callable[[], None]
) -> Callable[[], None]:
    """Run `callback` on `loop` when SIGINT or SIGTERM arrives, then the handler that was there
    (the server's graceful stop). Only where a Python handler is installed, in the main thread
    (signals are delivered there); anywhere else this does nothing. Returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}

    def handler(sig: int, frame: FrameType | None) -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(callback)
        before = previous[sig]
        if callable(before):
            before(sig, frame)

    installed = [sig for sig, before in previous.items() if callable(before)]
    for sig in installed:
        signal.signal(sig, handler)

    def undo() -> None:
        for sig in installed:
            if signal.getsignal(sig) is handler:  # not if someone chained in front of us since
                signal.signal(sig, previous[sig])

    return undo
