"""The FPM wire, apart from the sockets: Dynamo's event-plane frame around a record
(`unwrap_event_frame`), whether an address is one a SUB socket can connect to
(`validate_endpoint`), and an error's one-line description.
"""

from __future__ import annotations

import msgpack
import zmq


def describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


EVENT_FRAME_VERSION = 1  # Dynamo's event-plane frame header: version byte, then u32 BE length
_EVENT_HEADER = 5


def unwrap_event_frame(frame: bytes) -> bytes:
    """The msgpack FPM record inside one Dynamo event-plane frame (the last of its 4 frames).
    Raises ValueError naming what is wrong."""
    if len(frame) < _EVENT_HEADER:
        raise ValueError(f"event frame is {len(frame)} bytes, shorter than its 5-byte header")
    if frame[0] != EVENT_FRAME_VERSION:
        raise ValueError(f"event frame version {frame[0]}, expected {EVENT_FRAME_VERSION}")
    length = int.from_bytes(frame[1:_EVENT_HEADER], "big")
    if length != len(frame) - _EVENT_HEADER:
        raise ValueError(f"event frame says {length} bytes follow its header, {len(frame) - 5} do")
    try:
        envelope = msgpack.unpackb(memoryview(frame)[_EVENT_HEADER:], raw=False, strict_map_key=False)
    except Exception as exc:
        raise ValueError(f"event envelope is not msgpack ({describe(exc)})") from None
    payload = envelope.get("payload") if type(envelope) is dict else None
    if type(payload) is not bytes:
        raise ValueError("event envelope: payload missing or not bytes")
    return payload


def validate_endpoint(endpoint: str) -> str | None:
    """Why `endpoint` is not an address a SUB socket can connect to, or None if it is."""
    transport, sep, address = endpoint.partition("://")
    if not sep or not address:
        return "expected transport://address, e.g. tcp://10.0.0.5:20380"
    if transport == "inproc":
        return "inproc:// cannot reach an engine in another process"
    if transport == "tcp":
        port = address.rpartition(":")[2]
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            return f"tcp port must be 1..65535, got {port!r}"
    context = zmq.Context()
    sock = context.socket(zmq.SUB)
    try:
        sock.connect(endpoint)  # zmq's own parser: transport, host syntax, wildcards
    except zmq.ZMQError as exc:
        return str(exc)
    finally:
        sock.close(linger=0)
        context.term()
    return None
