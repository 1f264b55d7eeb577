"""FPM ingestion benchmark: the planner's `FpmSubscriber` against a bare pyzmq + msgpack loop.

One publisher process sends `--messages` (5,000,000) ForwardPassMetrics messages as fast as it
can, in Dynamo's wire format `(b"", 8-byte big-endian sequence, msgpack map)`, round-robin over
64 engines (`worker-00` .. `worker-63`), every 16th message of an engine an idle heartbeat. The
payloads are encoded once before the run, so the publisher only sends. Its socket is an XPUB
with XPUB_NODROP and blocking sends, and it waits for the subscription before the first message:
nothing is lost, so both receivers see exactly the same stream, and a slow receiver slows the
publisher down instead of losing messages.

For each variant a fresh publisher and a fresh receiver process run (a clean heap for the memory
figures); the bench process itself only starts them and reads their results.

(a) `bare`: a SUB socket and `recv_multipart()` + `msgpack.unpackb(payload)` in a loop, nothing
    else: the ceiling for a Python receiver.
(b) `subscriber`: `app.sources.fpm.FpmSubscriber` (its thread: frame and sequence checks,
    `ForwardPassMetrics.from_wire`, inventory, counters), while the main thread behaves like a
    busy consumer: `snapshot()` and `new_trainable_records()` every 0.1 s.

Rate = messages / (last message received - connect), on `time.monotonic`; for (b) the time of
the last message is the newest engine's arrival time from the snapshot. Ratio = (b) / (a); the
goal is >= 0.5. Memory is the receiver's VmRSS from /proc/self/status just before connecting and
after the last message (plus VmHWM, the peak). The subscriber's inventory holds the latest
record per engine only; its trainable buffer is bounded (10,000 records).

On 2 CPUs the publisher, the receiver and ZMQ's I/O threads of both share the cores; the
publisher's own send rate is reported so a publisher-bound run is visible.

    .venv/bin/python -m bench.fpm_ingest [--messages 5000000] [--repeats 1]

Prints a markdown table and writes bench/results/fpm_ingest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import msgpack
import zmq

from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics
from app.sources.fpm import DEFAULT_RCVHWM, FpmSubscriber

REPO_ROOT = Path(__file__).resolve().parent.parent

RESULTS = REPO_ROOT / "bench" / "results" / "fpm_ingest.json"
ENGINES = 64
VARIANTS_PER_ENGINE = 16  # the last one is an idle heartbeat
HWM = 100_000  # the publisher's send queue
STALL_S = 60.0  # a receiver that gets nothing for this long aborts the run
VARIANTS = ("bare", "subscriber")


def rss_kib() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in KiB."""
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            name, value, _ = line.split()
            out[name.rstrip(":")] = int(value)
    return out


def payloads() -> list[bytes]:
    """Message i carries payloads()[i % 1024]: engine i % 64, variant (i // 64) % 16."""
    out: list[bytes] = []
    for variant in range(VARIANTS_PER_ENGINE):
        for engine in range(ENGINES):
            worker_id = f"worker-{engine:02d}"
            if variant == VARIANTS_PER_ENGINE - 1:
                record = ForwardPassMetrics.heartbeat(worker_id)
            else:
                record = ForwardPassMetrics(
                    worker_id=worker_id,
                    dp_rank=0,
                    wall_time_s=0.004 + 0.001 * variant,
                    scheduled=ScheduledRequestMetrics(
                        num_prefill_requests=variant % 3,
                        sum_prefill_tokens=512 * (variant % 3),
                        var_prefill_length=1234.5,
                        sum_prefill_kv_tokens=64 * variant,
                        num_decode_requests=8 + variant,
                        sum_decode_kv_tokens=8_000 + 500 * variant + engine,
                        var_decode_kv_tokens=4321.0,
                    ),
                    queued=QueuedRequestMetrics(
                        num_prefill_requests=variant % 2,
                        sum_prefill_tokens=2048 * (variant % 2),
                        var_prefill_length=0.0,
                        num_decode_requests=0,
                        sum_decode_kv_tokens=0,
                        var_decode_kv_tokens=0.0,
                    ),
                )
            out.append(msgpack.packb(record.as_wire()))
    return out


# --- child roles ----------------------------------------------------------------------------------


def publish(messages: int) -> dict[str, Any]:
    table = payloads()
    mask = len(table) - 1
    context = zmq.Context()
    sock = context.socket(zmq.XPUB)
    sock.setsockopt(zmq.XPUB_NODROP, 1)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.bind("tcp://127.0.0.1:*")
    print("BOUND " + sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    sock.recv()  # the subscription: nothing is sent before a subscriber is there
    send = sock.send_multipart
    started = time.monotonic()
    for i in range(messages):
        send((b"", i.to_bytes(8, "big"), table[i & mask]))
    sent_s = time.monotonic() - started
    sock.close(linger=-1)  # deliver everything queued
    context.term()
    return {"messages": messages, "send_s": sent_s, "send_rate": messages / sent_s}


def receive_bare(endpoint: str, messages: int) -> dict[str, Any]:
    context = zmq.Context()
    sock = context.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, DEFAULT_RCVHWM)  # as the subscriber's
    sock.setsockopt(zmq.RCVTIMEO, int(STALL_S * 1000))
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    memory_before = rss_kib()
    recv = sock.recv_multipart
    unpack = msgpack.unpackb
    started = time.monotonic()
    sock.connect(endpoint)
    for _ in range(messages):
        frames = recv()
        unpack(frames[2], raw=False, strict_map_key=False)
    elapsed_s = time.monotonic() - started
    memory_after = rss_kib()
    sock.close(linger=0)
    context.term()
    return {
        "received": messages,
        "elapsed_s": elapsed_s,
        "memory_before": memory_before,
        "memory_after": memory_after,
    }


def receive_subscriber(endpoint: str, messages: int) -> dict[str, Any]:
    subscriber = FpmSubscriber([endpoint], engine_timeout_s=3600.0)
    collected = 0
    memory_before = rss_kib()
    started = time.monotonic()
    subscriber.start()
    progress_at, last_received = started, 0
    while True:
        time.sleep(0.1)
        collected += len(subscriber.new_trainable_records())
        snap = subscriber.snapshot()
        now = time.monotonic()
        if snap.received >= messages or not snap.running:
            break
        if snap.received > last_received:
            progress_at, last_received = now, snap.received
        elif now - progress_at > STALL_S:
            break
    # The newest arrival: the snapshot's time minus the youngest engine's age.
    last_at = now - min((e.age_s for e in snap.engines.values()), default=0.0)
    memory_after = rss_kib()
    collected += len(subscriber.new_trainable_records())
    subscriber.stop()
    return {
        "received": snap.received,
        "elapsed_s": last_at - started,
        "memory_before": memory_before,
        "memory_after": memory_after,
        "engines": len(snap.engines),
        "heartbeats": snap.heartbeats,
        "malformed": snap.malformed,
        "dropped": snap.dropped,
        "trainable_collected": collected,
        "trainable_overflow": snap.trainable_overflow,
        "failure": snap.failure,
    }


# --- the bench process ----------------------------------------------------------------------------


def run_child(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.fpm_ingest", *args], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )


def last_json(proc: subprocess.Popen[str], what: str) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=3600)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{what} failed (exit {proc.returncode}): {out[-2000:]}")
    return json.loads(lines[-1])


def run_variant(variant: str, messages: int) -> dict[str, Any]:
    publisher = run_child(["--role", "publish", "--messages", str(messages)])
    assert publisher.stdout is not None
    line = publisher.stdout.readline()
    if not line.startswith("BOUND "):
        publisher.kill()
        raise SystemExit(f"the publisher did not start: {line!r}")
    endpoint = line.split()[1]
    receiver = run_child(["--role", variant, "--endpoint", endpoint, "--messages", str(messages)])
    result = last_json(receiver, f"receiver {variant}")
    result["publisher"] = last_json(publisher, "publisher")
    result["variant"] = variant
    result["rate"] = result["received"] / result["elapsed_s"]
    print(f"  {variant}: {result['rate']:,.0f} msg/s", file=sys.stderr, flush=True)
    return result


def table(headers: list[str], rows: list[list[str]]) -> str:
    right = ["---:" if i else "---" for i in range(len(headers))]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(right) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5_000_000)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each variant, alternating")
    parser.add_argument(
        "--role", choices=("bench", "publish", *VARIANTS), default="bench", help=argparse.SUPPRESS
    )
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.role == "publish":
        print(json.dumps(publish(args.messages)), flush=True)
        return
    if args.role == "bare":
        print(json.dumps(receive_bare(args.endpoint, args.messages)), flush=True)
        return
    if args.role == "subscriber":
        print(json.dumps(receive_subscriber(args.endpoint, args.messages)), flush=True)
        return

    print(f"# FPM ingestion: {args.messages:,} messages, {ENGINES} engines, {os.cpu_count()} CPUs\n")
    runs = [run_variant(v, args.messages) for _ in range(args.repeats) for v in VARIANTS]
    rates = {v: [r["rate"] for r in runs if r["variant"] == v] for v in VARIANTS}
    ratio = statistics.median(rates["subscriber"]) / statistics.median(rates["bare"])
    rows = [
        [
            r["variant"],
            f"{r['received']:,}",
            f"{r['elapsed_s']:.1f}",
            f"{r['rate']:,.0f}",
            f"{r['publisher']['send_rate']:,.0f}",
            mib(r["memory_before"]["VmRSS"]),
            mib(r["memory_after"]["VmRSS"]),
            mib(r["memory_after"]["VmHWM"]),
        ]
        for r in runs
    ]
    print(
        table(
            [
                "receiver",
                "messages",
                "seconds",
                "msg/s",
                "publisher send msg/s",
                "RSS before MiB",
                "RSS after MiB",
                "peak RSS MiB",
            ],
            rows,
        )
    )
    print(f"\nratio subscriber / bare (medians): **{ratio:.2f}** (goal >= 0.5)")
    for r in runs:
        if r["variant"] == "subscriber":
            print(
                f"\nsubscriber: {r['engines']} engines in the inventory, {r['heartbeats']:,} heartbeats, "
                f"{r['malformed']} malformed, {r['dropped']} dropped; trainable records collected "
                f"{r['trainable_collected']:,}, dropped uncollected {r['trainable_overflow']:,}"
            )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "parameters": {
                    "messages": args.messages,
                    "repeats": args.repeats,
                    "engines": ENGINES,
                    "heartbeat_every": VARIANTS_PER_ENGINE,
                },
                "machine": {
                    "cpus": os.cpu_count(),
                    "load_average": os.getloadavg(),
                    "python": platform.python_version(),
                    "libraries": {lib: version(lib) for lib in ("pyzmq", "msgpack")},
                    "libzmq": zmq.zmq_version(),
                },
                "ratio": ratio,
                "runs": runs,
            },
            indent=2,
        )
    )
    print(f"\nwrote {RESULTS.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
