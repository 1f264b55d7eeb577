"""One drain of one FPM publisher's SUB socket: the subscriber thread's hot loop. It reads the
ready messages without blocking, checks their frames (the engine's own 3-frame layout or Dynamo's
4-frame event plane), tracks the sequence, decodes each record, and tallies what it saw in locals
for the thread to publish under its lock.
"""

from __future__ import annotations

import msgpack
import zmq

from app.core.perf.fpm import ForwardPassMetrics
from app.sources.fpm_snapshot import DrainTally, EndpointState, EngineKey
from app.sources.fpm_wire import describe, unwrap_event_frame

DRAIN_BUDGET = 4096  # messages per socket per round, so every socket is served in turn

# (record, endpoint, received_at on the injected monotonic clock)
Entry = tuple[ForwardPassMetrics, str, float]


_NOBLOCK = zmq.NOBLOCK
_RCVMORE = zmq.RCVMORE


def _discard_rest(sock: zmq.Socket) -> int:
    """Read and drop the remaining frames of a message; how many there were."""
    n = 0
    while sock.getsockopt(_RCVMORE):
        sock.recv()
        n += 1
    return n


def drain(
    sock: zmq.Socket,
    state: EndpointState,
    now: float,
    latest: dict[EngineKey, Entry],
    trainable: list[ForwardPassMetrics],
) -> DrainTally:
    """Read up to DRAIN_BUDGET messages without blocking. The hot loop: locals only.

    Frames are read one by one rather than with `recv_multipart`, which costs a Python-level
    loop and list per message (about a quarter of the receive time). ZMQ delivers a multipart
    message whole, so once its first frame is in the blocking reads of the rest return at once.
    """
    recv = sock.recv
    more = sock.getsockopt
    unpack = msgpack.unpackb
    from_wire = ForwardPassMetrics.from_wire
    from_bytes = int.from_bytes
    append = trainable.append
    endpoint = state.endpoint
    expected = state.next_seq
    received = malformed = dropped = heartbeats = restarts = 0
    error: str | None = None
    for _ in range(DRAIN_BUDGET):
        try:
            recv(_NOBLOCK)  # the topic: any
        except zmq.Again:
            break
        received += 1
        if not more(_RCVMORE):
            malformed += 1
            error = "expected 3 frames (topic, sequence, payload), got 1"
            continue
        seq_frame = recv()
        if not more(_RCVMORE):
            malformed += 1
            error = "expected 3 frames (topic, sequence, payload), got 2"
            continue
        payload = recv()
        if more(_RCVMORE):  # Dynamo's event plane: (topic, publisher id, sequence, frame)
            seq_frame, frame = payload, recv()
            if more(_RCVMORE):
                extra = _discard_rest(sock)
                malformed += 1
                error = f"expected 3 or 4 frames, got {4 + extra}"
                continue
            try:
                payload = unwrap_event_frame(frame)
            except ValueError as exc:
                malformed += 1
                error = str(exc)
                continue
        if len(seq_frame) != 8:
            malformed += 1
            error = f"sequence frame is {len(seq_frame)} bytes, expected 8"
            continue
        seq = from_bytes(seq_frame, "big")
        if seq != expected:
            if expected is not None:
                if seq > expected:
                    dropped += seq - expected
                else:
                    restarts += 1
        expected = seq + 1
        try:
            obj = unpack(payload, raw=False, strict_map_key=False)
        except Exception as exc:  # ExtraData, FormatError, StackError, UnicodeDecodeError, ...
            malformed += 1
            error = f"seq {seq}: payload is not msgpack ({describe(exc)})"
            continue
        try:
            record = from_wire(obj)
        except ValueError as exc:
            malformed += 1
            error = f"seq {seq}: {exc}"
            continue
        if record.wall_time_s == 0.0:
            heartbeats += 1
        else:
            append(record)
        latest[(record.worker_id, record.dp_rank)] = (record, endpoint, now)
    return DrainTally(state, received, malformed, dropped, heartbeats, restarts, error, expected)
