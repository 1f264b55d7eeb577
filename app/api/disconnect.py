"""Noticing a client that hung up while its request is held (the long-poll).

A held `GET /decisions/wait` sits in an `await` for up to 300 s. Nothing in FastAPI tells it
that the client closed the connection, so without this the waiter (and its place under the
long-poll bounds and in the waiters gauge) outlives the client until the timeout. The ASGI
server reports a closed connection as an `http.disconnect` message on the request's receive
channel; a GET has no body, so after the one empty `http.request` message, the next receive
blocks until exactly that.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

Receive = Callable[[], Awaitable[dict[str, Any]]]


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


async def _until_disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass  # the (empty) request body; the next receive blocks until the client leaves


async def unless_client_leaves(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """Run `work` until it finishes or the client disconnects, whichever comes first. On a
    disconnect `work` is cancelled (its `finally` blocks run before this returns) and
    `ClientGone` is raised; an exception of `work` propagates as it is."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and watcher.exception() is not None:
            return await task  # the channel cannot be watched; the work still ends at its timeout
    finally:
        # Also when this request itself is cancelled: neither may outlive it.
        if not watcher.cancel() and not watcher.cancelled():
            watcher.exception()  # retrieved, so asyncio does not log it as lost
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # the cancelled work releases what it holds before we answer
    if task.cancelled():
        raise ClientGone()
    return task.result()
