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
    """Await `work` until it finishes or the client disconnects, whichever comes first. On a
    disconnect `work` is cancelled (its `finally` blocks run before this returns) and
    `ClientGone` is raised; an exception of `work` propagates as it is.

    `work` runs in the request's own task and a watcher task cancels that task if the client
    leaves (as `asyncio.timeout` does at its deadline), rather than `work` in a task of its own:
    when a decision wakes 500 waiters, each answers in one step, and the watchers are cancelled
    after the answers are written."""
    request_task = asyncio.current_task()
    assert request_task is not None
    gone = finished = False

    def on_watcher_done(watcher: asyncio.Future[None]) -> None:
        nonlocal gone
        if watcher.cancelled() or watcher.exception() is not None:
            return  # the work finished first, or the channel cannot be watched (then the work
            # still ends at its own timeout)
        if not finished:  # not once the request has moved on to answering
            gone = True
            request_task.cancel()

    watcher = asyncio.ensure_future(_until_disconnected(receive))
    watcher.add_done_callback(on_watcher_done)
    try:
        return await work
    except asyncio.CancelledError:
        # Ours only if no one else cancelled the request too (the server stopping it).
        if gone and request_task.uncancel() == 0:
            raise ClientGone() from None
        raise
    finally:
        finished = True
        watcher.cancel()
