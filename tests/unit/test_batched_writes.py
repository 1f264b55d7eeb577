"""app/serving.py BatchedWrites: a connection's writes within one event-loop step leave in one
transport write at the end of the step (a response's head and body in one send), and closing
never loses or reorders bytes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.serving import BatchedWrites, _http_protocol


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        assert not self.closing, "written after close"
        self.writes.append(data)
        self.events.append("write")

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def abort(self) -> None:
        self.closing = True
        self.events.append("abort")

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5)}.get(name, default)


async def step() -> None:
    await asyncio.sleep(0)  # the callbacks scheduled so far run


@pytest.mark.anyio
async def test_writes_of_one_step_leave_together_at_its_end() -> None:
    fake = FakeTransport()
    batched = BatchedWrites(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    batched.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    batched.write(memoryview(b"{}"))
    assert fake.writes == []  # not yet: other tasks of this step may write too
    await step()
    assert fake.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    batched.write(b"next")
    await step()
    assert fake.writes[1:] == [b"next"]


@pytest.mark.anyio
async def test_close_sends_what_was_written_first() -> None:
    fake = FakeTransport()
    batched = BatchedWrites(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    batched.write(b"head")
    batched.write(b"body")
    batched.close()
    assert fake.events == ["write", "close"] and fake.writes == [b"headbody"]
    await step()  # the scheduled flush finds nothing left, and writes nothing after the close
    assert fake.events == ["write", "close"]


@pytest.mark.anyio
async def test_abort_drops_the_pending_bytes_and_a_closed_transport_gets_none() -> None:
    fake = FakeTransport()
    batched = BatchedWrites(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    batched.write(b"lost")
    batched.abort()
    await step()
    assert fake.writes == [] and fake.events == ["abort"]
    other = FakeTransport()
    batched = BatchedWrites(other, asyncio.get_running_loop())  # type: ignore[arg-type]
    batched.write(b"late")
    other.closing = True  # the peer went away within the step
    await step()
    assert other.writes == []


@pytest.mark.anyio
async def test_everything_else_is_the_transports() -> None:
    fake = FakeTransport()
    batched = BatchedWrites(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    assert batched.get_extra_info("peername") == ("127.0.0.1", 5)
    assert batched.is_closing() is False


def test_the_server_protocol_wraps_each_connection() -> None:
    protocol = _http_protocol()
    assert not isinstance(protocol, str), "httptools is part of uvicorn[standard]"
    made: list[Any] = []

    class Probe(protocol):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:  # only what connection_made needs
            self.loop = asyncio.new_event_loop()

    base = protocol.__mro__[1]
    original = base.connection_made
    try:
        base.connection_made = lambda self, transport: made.append(transport)  # type: ignore[method-assign]
        probe = Probe()
        probe.connection_made(FakeTransport())  # type: ignore[arg-type]
        probe.loop.close()
    finally:
        base.connection_made = original  # type: ignore[method-assign]
    assert len(made) == 1 and isinstance(made[0], BatchedWrites)
