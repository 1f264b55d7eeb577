"""A bound on request bodies, as pure ASGI middleware.

Without it a 50 MB body to `POST /plan` is read whole into memory before validation refuses it,
and parsing it blocks the event loop. The bound is checked before the application reads a byte:

- with a `Content-Length` above the bound, the answer is 413 at once, body unread;
- a chunked body (no length) is read here, chunk by chunk, and reading stops at the first chunk
  that goes over the bound; a body within it is handed to the application unchanged.

The 413 closes the connection (`Connection: close`): the rest of the body is never read, so the
connection cannot carry another request. Pure ASGI rather than Starlette's BaseHTTPMiddleware,
which would run the application in a separate task and hide the receive channel the long-poll
watches for a client that hung up.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from app.api.errors import PROBLEM_JSON, problem_document

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length: int | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = None  # the HTTP server refuses a malformed length before we see it
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if length is not None and not chunked:
            if length > self.max_body_bytes:
                await self._too_large(scope, send, f"{length} bytes (Content-Length)")
                return
            await self.app(scope, receive, send)  # the server never delivers more than the length
            return
        if not chunked:
            await self.app(scope, receive, send)  # no body (a GET): the receive channel as it is
            return

        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left while sending its body; nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large(scope, send, f"{size} bytes or more (chunked; reading stopped there)")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: what the server says next (a disconnect)

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, send: Send, size: str) -> None:
        detail = f"body: {size} exceed the limit of {self.max_body_bytes} bytes (PLANNER_MAX_BODY_BYTES)"
        document = problem_document(
            413,
            detail,
            instance=scope.get("path", ""),
            errors=[{"field": "body", "message": detail.removeprefix("body: ")}],
        )
        payload = json.dumps(document, separators=(",", ":")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", PROBLEM_JSON.encode()),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
