"""A stand-in engine: publishes ForwardPassMetrics on a ZMQ socket in Dynamo's wire format.

    python tests/fpm_publisher.py --bind 'tcp://127.0.0.1:*' --worker-id engine-a \\
        --mode good|malformed|stop-after|gaps|heartbeats|garbage --count N [--rate R] [--gap-every K] \\
        [--dp-rank D] [--form map|e3|e4]

Each message is `(b"", 8-byte big-endian sequence, msgpack payload)`. The socket is an XPUB
with XPUB_NODROP and blocking sends, and nothing is sent before a subscriber has subscribed, so
every message reaches the subscriber and the tests' counts are exact (a plain PUB drops what it
sends before the subscription arrives and past the high-water mark).

Modes, each followed (except `stop-after`) by idle heartbeats (`wall_time == 0`, all zeros) at
`--heartbeat-hz` until the process is terminated:

- `good`: `--count` records;
- `malformed`: `--count` records, each followed by one bad message, cycling through
  `GARBAGE_KINDS`. Only the bad messages whose sequence frame is well formed use a sequence
  number, so the subscriber sees no gap: exactly `--count` malformed, 0 dropped;
- `stop-after`: `--count` records, then exit (an engine that dies);
- `gaps`: `--count` records; after every `--gap-every`-th one the sequence skips one number, so
  the subscriber counts exactly `count // gap_every` dropped messages;
- `heartbeats`: heartbeats only;
- `garbage`: `--count` bad messages and no record, cycling through `GARBAGE_KINDS`.

`--rate` is records per second (0: as fast as possible). On stdout: `BOUND <endpoint>` once
bound (with `tcp://host:*` the port is chosen by the system, no race for a free port),
`SUBSCRIBED` when a subscriber is there, `DONE <n>` after the records.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack  # noqa: E402
import zmq  # noqa: E402

from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics  # noqa: E402

MODES = ("good", "malformed", "stop-after", "gaps", "heartbeats", "garbage")
GARBAGE_KINDS = ("frames", "short-sequence", "not-msgpack", "missing-fields", "negative-count")
# The bad messages that carry a well-formed sequence frame (and so use a sequence number).
SEQUENCED_GARBAGE = ("not-msgpack", "missing-fields", "negative-count")


def make_record(worker_id: str, index: int, dp_rank: int = 0) -> ForwardPassMetrics:
    """Record number `index` of an engine: deterministic, never a heartbeat, and
    `scheduled.sum_prefill_tokens == 100 + index` so tests can tell which one it is."""
    return ForwardPassMetrics(
        worker_id=worker_id,
        dp_rank=dp_rank,
        wall_time_s=0.001 * (1 + index % 50),
        scheduled=ScheduledRequestMetrics(
            num_prefill_requests=1 + index % 4,
            sum_prefill_tokens=100 + index,
            var_prefill_length=float(index % 7),
            sum_prefill_kv_tokens=16 * (index % 3),
            num_decode_requests=index % 32,
            sum_decode_kv_tokens=1000 + 10 * index,
            var_decode_kv_tokens=0.5 * (index % 5),
        ),
        queued=QueuedRequestMetrics(
            num_prefill_requests=index % 5,
            sum_prefill_tokens=50 * (index % 5),
            var_prefill_length=1.5,
            num_decode_requests=index % 2,
            sum_decode_kv_tokens=7 * (index % 2),
            var_decode_kv_tokens=0.0,
        ),
    )


def heartbeat(worker_id: str, dp_rank: int = 0) -> ForwardPassMetrics:
    return ForwardPassMetrics.heartbeat(worker_id, dp_rank)


def as_e3_array(record: ForwardPassMetrics) -> list[Any]:
    """msgspec `array_like` encoding of the E3 struct: fields in order, nested structs as arrays."""
    return [
        record.worker_id,
        record.dp_rank,
        record.wall_time_s,
        list(vars(record.scheduled).values()),
        list(vars(record.queued).values()),
    ]


def as_e4_array(record: ForwardPassMetrics, counter_id: int = 0) -> list[Any]:
    """The E4 layout: `version` and `counter_id` added, and four prefix-cache fields appended to
    the scheduled struct (values the planner ignores)."""
    scheduled = [*vars(record.scheduled).values(), 11, 2.5, 13, 3.5]
    queued = list(vars(record.queued).values())
    return [1, record.worker_id, record.dp_rank, counter_id, record.wall_time_s, scheduled, queued]


def encode(record: ForwardPassMetrics, form: str, counter_id: int = 0) -> bytes:
    if form == "e3":
        return msgpack.packb(as_e3_array(record))
    if form == "e4":
        return msgpack.packb(as_e4_array(record, counter_id))
    return msgpack.packb(record.as_wire())


def garbage(kind: str, worker_id: str, seq: int) -> list[bytes]:
    """One bad message of `kind` (see GARBAGE_KINDS)."""
    seq_frame = seq.to_bytes(8, "big")
    good = msgpack.packb(make_record(worker_id, 0).as_wire())
    if kind == "frames":
        return [b"", good]
    if kind == "short-sequence":
        return [b"", seq_frame[1:], good]
    if kind == "not-msgpack":
        return [b"", seq_frame, b"\xc1 this is not msgpack"]
    if kind == "missing-fields":
        return [b"", seq_frame, msgpack.packb({"worker_id": worker_id, "dp_rank": 0})]
    if kind == "negative-count":
        wire = make_record(worker_id, 0).as_wire()
        wire["scheduled_requests"]["num_prefill_requests"] = -1
        return [b"", seq_frame, msgpack.packb(wire)]
    raise ValueError(kind)


def _die_with_parent() -> None:
    """Linux: SIGTERM when the test process dies, so no stand-in engine outlives a killed run."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Publisher:
    def __init__(self, bind: str) -> None:
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.XPUB_NODROP, 1)
        self.sock.setsockopt(zmq.SNDHWM, 100_000)
        self.sock.setsockopt(zmq.LINGER, 2000)
        self.sock.bind(bind)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.seq = 0

    def wait_for_subscriber(self, timeout_s: float | None = None) -> None:
        """Block until a subscriber has subscribed (XPUB hands the subscription message up)."""
        if timeout_s is not None and not self.sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            raise TimeoutError(f"no subscriber on {self.endpoint} within {timeout_s} s")
        self.sock.recv()

    def close(self) -> None:
        self.sock.close(linger=0)
        self.context.term()

    def send(self, payload: bytes) -> None:
        self.sock.send_multipart((b"", self.seq.to_bytes(8, "big"), payload))
        self.seq += 1

    def send_raw(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)


class Pacer:
    """Sleep so that `rate` events per second are not exceeded (0: never sleep)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.n = 0

    def tick(self) -> None:
        self.n += 1
        if self.rate > 0:
            ahead = self.n / self.rate - (time.monotonic() - self.start)
            if ahead > 0:
                time.sleep(ahead)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--dp-rank", type=int, default=0)
    parser.add_argument("--mode", choices=MODES, default="good")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--gap-every", type=int, default=10)
    parser.add_argument("--heartbeat-hz", type=float, default=20.0)
    parser.add_argument("--form", choices=("map", "e3", "e4"), default="map")
    args = parser.parse_args(argv)

    _die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # terminated: nothing left to flush
    pub = Publisher(args.bind)
    print(f"BOUND {pub.endpoint}", flush=True)
    pub.wait_for_subscriber()
    print("SUBSCRIBED", flush=True)

    pacer = Pacer(args.rate)
    records = 0 if args.mode == "heartbeats" else args.count
    for i in range(records):
        if args.mode == "garbage":  # an engine whose every message is broken
            kind = GARBAGE_KINDS[i % len(GARBAGE_KINDS)]
            pub.send_raw(garbage(kind, args.worker_id, pub.seq))
            if kind in SEQUENCED_GARBAGE:
                pub.seq += 1
            pacer.tick()
            continue
        pub.send(encode(make_record(args.worker_id, i, args.dp_rank), args.form, counter_id=i))
        if args.mode == "malformed":
            kind = GARBAGE_KINDS[i % len(GARBAGE_KINDS)]
            pub.send_raw(garbage(kind, args.worker_id, pub.seq))
            if kind in SEQUENCED_GARBAGE:
                pub.seq += 1
        elif args.mode == "gaps" and (i + 1) % args.gap_every == 0:
            pub.seq += 1
        pacer.tick()
    print(f"DONE {records}", flush=True)
    if args.mode == "stop-after":
        pub.sock.close(linger=2000)  # deliver what is queued, then the engine is gone
        pub.context.term()
        return 0

    beat = encode(heartbeat(args.worker_id, args.dp_rank), args.form)
    pacer = Pacer(args.heartbeat_hz)
    while True:
        pub.send(beat)
        pacer.tick()


if __name__ == "__main__":
    sys.exit(main())
