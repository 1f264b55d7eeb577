"""FPM ingestion over real ZMQ sockets on loopback.

The acceptance scenario runs four stand-in engines as separate processes (`tests/fpm_publisher.py`):
one healthy, one interleaving malformed messages, one that stops, one that skips sequence numbers
and speaks E4's positional array form. The other tests drive an in-process publisher for
deterministic cases (restarts, expiry on an injected clock, each kind of malformed message).

Every wait is bounded and polls a condition; nothing asserts how fast anything is, beyond the
generous event-loop progress check.
"""

from __future__ import annotations

import asyncio
import select
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.core.errors import SourceUnavailableError
from app.core.perf.fpm import ForwardPassMetrics
from app.sources.fpm import FpmSubscriber
from app.sources.fpm_snapshot import FpmSnapshot, as_json
from tests.fpm_publisher import GARBAGE_KINDS, Publisher, encode, garbage, heartbeat, make_record
from tests.support import REPO_ROOT

PUBLISHER = REPO_ROOT / "tests" / "fpm_publisher.py"
LOOPBACK_ANY_PORT = "tcp://127.0.0.1:*"  # the publisher binds a port the system picks: no race
WAIT_S = 60.0  # bound on any wait; generous for a loaded 2-core machine


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {timeout_s} s: {what}")
        time.sleep(0.02)


# --- stand-in engines as processes ----------------------------------------------------------------


@dataclass
class Engine:
    proc: subprocess.Popen[str]
    endpoint: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    """Start `tests/fpm_publisher.py` with the given options; every process is stopped after."""
    engines: list[Engine] = []

    def start(worker_id: str, *options: str) -> Engine:
        log_path = tmp_path / f"{worker_id}.log"
        with open(log_path, "w") as stderr:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(PUBLISHER),
                    "--bind",
                    LOOPBACK_ANY_PORT,
                    "--worker-id",
                    worker_id,
                    *options,
                ],
                cwd=REPO_ROOT,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        deadline = time.monotonic() + WAIT_S
        line = ""
        while not line.startswith("BOUND "):
            remaining = deadline - time.monotonic()
            if proc.poll() is not None or remaining <= 0:
                proc.kill()
                proc.wait(timeout=10)
                raise AssertionError(f"publisher {worker_id} did not bind: {log_path.read_text()}")
            if select.select([proc.stdout], [], [], remaining)[0]:
                line = proc.stdout.readline()  # type: ignore[union-attr]
        engine = Engine(proc, line.split()[1], log_path)
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        if engine.proc.poll() is None:
            engine.proc.terminate()
    for engine in engines:
        try:
            engine.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            engine.proc.kill()
            engine.proc.wait(timeout=10)
        if engine.proc.stdout is not None:
            engine.proc.stdout.close()


def _by_worker(records: list[ForwardPassMetrics]) -> dict[str, list[ForwardPassMetrics]]:
    grouped: dict[str, list[ForwardPassMetrics]] = defaultdict(list)
    for record in records:
        grouped[record.worker_id].append(record)
    return grouped


@pytest.mark.timeout(240)
def test_four_engines_one_malformed_one_stopping(spawn: Callable[..., Engine]) -> None:
    good = spawn("engine-a", "--mode", "good", "--count", "200", "--rate", "400")
    bad = spawn("engine-b", "--mode", "malformed", "--count", "50", "--rate", "200")
    stops = spawn("engine-c", "--mode", "stop-after", "--count", "100", "--rate", "100")
    gaps = spawn(
        "engine-d", "--dp-rank", "1", "--mode", "gaps", "--count", "200", "--gap-every", "10", "--form", "e4"
    )
    engines = [good, bad, stops, gaps]
    expected_records = {"engine-a": 200, "engine-b": 50, "engine-c": 100, "engine-d": 200}
    live = {("engine-a", 0): good, ("engine-b", 0): bad, ("engine-d", 1): gaps}

    trainable: list[ForwardPassMetrics] = []
    seen: set[tuple[str, int]] = set()
    with FpmSubscriber([e.endpoint for e in engines], engine_timeout_s=1.5) as subscriber:

        def settled() -> bool:
            # Heartbeats follow the records on each connection (ZMQ keeps order), so one
            # heartbeat from every live engine means all of their records have arrived.
            trainable.extend(subscriber.new_trainable_records())
            snap = subscriber.snapshot()
            seen.update(snap.engines)
            return (
                all(snap.endpoints[e.endpoint].heartbeats > 0 for e in live.values())
                and snap.endpoints[stops.endpoint].received == 100
                and ("engine-c", 0) not in snap.engines
            )

        try:
            wait_until(settled, "every record in, a heartbeat from each live engine, engine-c expired")
        except AssertionError as exc:
            logs = "\n".join(f"--- {e.endpoint}\n{e.log()}" for e in engines)
            raise AssertionError(f"{exc}\n{as_json(subscriber.snapshot())}\n{logs}") from None
        trainable.extend(subscriber.new_trainable_records())
        snap = subscriber.snapshot()

    # The inventory: the three live engines, each with its latest record (an idle heartbeat,
    # kept so its queues are visible, but marked not trainable); the stopped engine was there
    # while it published and left after engine_timeout_s of silence.
    assert ("engine-c", 0) in seen
    assert set(snap.engines) == set(live)
    for (worker_id, dp_rank), engine in live.items():
        entry = snap.engines[(worker_id, dp_rank)]
        assert entry.endpoint == engine.endpoint
        assert entry.record == heartbeat(worker_id, dp_rank)
        assert entry.trainable is False
        assert entry.age_s < 1.5
    assert snap.expired == 1
    assert snap.dp_ranks() == {"engine-a": 1, "engine-b": 1, "engine-d": 1}
    assert set(snap.records([good.endpoint, gaps.endpoint])) == {("engine-a", 0), ("engine-d", 1)}

    # Every real record, in order, exactly once; never a heartbeat.
    grouped = _by_worker(trainable)
    assert set(grouped) == set(expected_records)
    for worker_id, count in expected_records.items():
        dp_rank = 1 if worker_id == "engine-d" else 0
        assert grouped[worker_id] == [make_record(worker_id, i, dp_rank) for i in range(count)], worker_id
    assert not any(r.is_heartbeat for r in trainable)
    assert snap.trainable_overflow == 0

    # Counters, exact: the malformed publisher sent 50 bad messages that use no sequence number
    # the subscriber would miss; the gap publisher skipped one number after every 10th record.
    counters = snap.endpoints
    assert counters[bad.endpoint].malformed == 50
    assert counters[bad.endpoint].received == 50 + 50 + counters[bad.endpoint].heartbeats
    assert counters[bad.endpoint].last_error is not None
    assert counters[bad.endpoint].last_error.startswith(bad.endpoint)
    assert counters[gaps.endpoint].dropped == 200 // 10
    for engine in (good, stops, gaps):
        assert counters[engine.endpoint].malformed == 0
    for engine in (good, bad, stops):
        assert counters[engine.endpoint].dropped == 0
    assert counters[stops.endpoint].heartbeats == 0
    assert snap.malformed == 50
    assert snap.dropped == 20
    assert snap.restarts == 0
    assert snap.running and snap.failure is None
    assert counters[good.endpoint].received == 200 + counters[good.endpoint].heartbeats
    assert stops.proc.wait(timeout=10) == 0


@pytest.mark.timeout(240)
@pytest.mark.anyio
async def test_ingestion_does_not_block_the_event_loop(spawn: Callable[..., Engine]) -> None:
    """100k messages as fast as one process can send them, while an asyncio loop keeps ticking."""
    total = 100_000
    flood = spawn("flood", "--mode", "good", "--count", str(total), "--rate", "0")
    ticks = 0
    max_gap_s = 0.0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks, max_gap_s
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            max_gap_s = max(max_gap_s, now - last)
            last = now
            ticks += 1

    collected = 0
    with FpmSubscriber([flood.endpoint], engine_timeout_s=60.0) as subscriber:
        task = asyncio.create_task(ticker())
        try:
            deadline = time.monotonic() + WAIT_S
            snap = subscriber.snapshot()
            while snap.received == 0:
                assert time.monotonic() < deadline, f"nothing received: {flood.log()}"
                await asyncio.sleep(0.005)
                snap = subscriber.snapshot()
            ticks_at_start = ticks
            while snap.heartbeats == 0:  # the first heartbeat follows the last record
                assert time.monotonic() < deadline, f"stuck at {snap.received} received: {flood.log()}"
                await asyncio.sleep(0.05)
                collected += len(subscriber.new_trainable_records())
                snap = subscriber.snapshot()
            ticks_during = ticks - ticks_at_start
        finally:
            stop.set()
            await task
        collected += len(subscriber.new_trainable_records())
        snap = subscriber.snapshot()

    assert snap.received - snap.heartbeats == total
    assert collected + snap.trainable_overflow == total
    assert snap.malformed == 0 and snap.dropped == 0
    # The loop kept running while the messages arrived: some ticks, and never a stall of seconds.
    assert ticks_during >= 3, (ticks_during, max_gap_s)
    assert max_gap_s < 2.0, (ticks_during, max_gap_s)


# --- in-process publisher: deterministic cases ----------------------------------------------------


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    pub = Publisher(LOOPBACK_ANY_PORT)
    yield pub
    pub.close()


def subscribe(pub: Publisher, **options: object) -> FpmSubscriber:
    options.setdefault("engine_timeout_s", 30.0)
    subscriber = FpmSubscriber([pub.endpoint], **options).start()  # type: ignore[arg-type]
    pub.wait_for_subscriber(timeout_s=WAIT_S)
    return subscriber


def received(subscriber: FpmSubscriber, n: int) -> Callable[[], bool]:
    return lambda: subscriber.snapshot().received >= n


@pytest.mark.timeout(120)
def test_restart_resets_the_sequence_and_gaps_count_missing_messages(publisher: Publisher) -> None:
    with subscribe(publisher) as subscriber:
        for i in range(10):  # seq 0..9
            publisher.send(encode(make_record("w", i), "map"))
        publisher.seq = 0  # the engine restarted: its counter starts over
        for i in range(5):  # seq 0..4
            publisher.send(encode(make_record("w", 100 + i), "map"))
        publisher.seq = 10  # 5..9 never arrive
        publisher.send(encode(make_record("w", 200), "map"))
        wait_until(received(subscriber, 16), "16 messages")
        snap = subscriber.snapshot()
    counters = snap.endpoints[publisher.endpoint]
    assert (counters.restarts, counters.dropped, counters.malformed) == (1, 5, 0)
    assert counters.last_sequence == 10
    assert snap.engines[("w", 0)].record == make_record("w", 200)


@pytest.mark.timeout(120)
def test_heartbeats_refresh_liveness_but_are_never_trainable(publisher: Publisher) -> None:
    clock = FakeClock()
    with subscribe(publisher, engine_timeout_s=1.5, monotonic=clock) as subscriber:
        publisher.send(encode(make_record("w", 1), "map"))
        wait_until(received(subscriber, 1), "the record")
        clock.t += 1.0
        publisher.send(encode(heartbeat("w"), "map"))
        wait_until(received(subscriber, 2), "the heartbeat")
        clock.t += 1.0  # 2.0 s after the record, 1.0 s after the heartbeat: still alive
        snap = subscriber.snapshot()
        entry = snap.engines[("w", 0)]
        assert entry.record == heartbeat("w") and entry.trainable is False
        assert entry.age_s == pytest.approx(1.0)
        assert snap.heartbeats == 1
        assert subscriber.new_trainable_records() == [make_record("w", 1)]
        assert subscriber.new_trainable_records() == []

        clock.t += 0.6  # 1.6 s of silence: gone
        snap = subscriber.snapshot()
        assert snap.engines == {} and snap.expired == 1

        publisher.send(encode(make_record("w", 2), "map"))  # back: in the inventory again
        wait_until(lambda: ("w", 0) in subscriber.snapshot().engines, "the engine's return")
        snap = subscriber.snapshot()
        assert snap.engines[("w", 0)].trainable is True and snap.expired == 1


@pytest.mark.timeout(120)
def test_one_endpoint_may_carry_several_engines_and_ranks(publisher: Publisher) -> None:
    """A relay (or a multi-rank engine) publishes several (worker_id, dp_rank) on one socket."""
    keys = [("w1", 0), ("w1", 1), ("w2", 0)]
    with subscribe(publisher) as subscriber:
        for round_ in range(3):
            for worker_id, dp_rank in keys:
                publisher.send(encode(make_record(worker_id, round_, dp_rank), "e3"))
        wait_until(received(subscriber, 9), "9 records")
        snap = subscriber.snapshot()
    assert {k: e.record for k, e in snap.engines.items()} == {(w, r): make_record(w, 2, r) for w, r in keys}
    assert snap.dp_ranks() == {"w1": 2, "w2": 1}


EXPECTED_REASON = {
    "frames": "expected 3 frames (topic, sequence, payload), got 2",
    "short-sequence": "sequence frame is 7 bytes, expected 8",
    "not-msgpack": "payload is not msgpack (FormatError)",
    "missing-fields": "seq 1: wall_time: missing",
    "negative-count": "scheduled_requests.num_prefill_requests: negative (-1)",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", GARBAGE_KINDS)
def test_each_malformed_message_is_skipped_and_counted(publisher: Publisher, kind: str) -> None:
    with subscribe(publisher) as subscriber:
        publisher.send(encode(make_record("w", 0), "map"))
        publisher.send_raw(garbage(kind, "w", publisher.seq))
        publisher.seq += 1
        publisher.send(encode(make_record("w", 2), "map"))
        wait_until(received(subscriber, 3), "3 messages")
        snap = subscriber.snapshot()
    assert snap.malformed == 1
    assert snap.last_error is not None and EXPECTED_REASON[kind] in snap.last_error, snap.last_error
    assert snap.last_error.startswith(publisher.endpoint)
    assert snap.engines[("w", 0)].record == make_record("w", 2)
    assert snap.running and snap.failure is None
    # Frame-level garbage carries no usable sequence: the number it took shows as one gap.
    assert snap.dropped == (1 if kind in ("frames", "short-sequence") else 0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("frames", [1, 5, 6])
def test_any_wrong_frame_count_is_skipped_whole(publisher: Publisher, frames: int) -> None:
    """The extra frames of a long message are consumed with it, not read as the next message.
    (4 frames is Dynamo's event-plane layout: tests/integration/test_fpm_event_plane.py.)"""
    good = encode(make_record("w", 1), "map")
    with subscribe(publisher) as subscriber:
        publisher.send_raw([b"", (0).to_bytes(8, "big"), good, b"extra", b"x", b"y"][:frames])
        publisher.send(encode(make_record("w", 1), "map"))
        wait_until(received(subscriber, 2), "2 messages")
        snap = subscriber.snapshot()
    assert snap.malformed == 1 and snap.received == 2
    assert snap.last_error is not None and f"got {frames}" in snap.last_error
    assert snap.engines[("w", 0)].record == make_record("w", 1)


@pytest.mark.timeout(120)
def test_uncollected_trainable_records_are_bounded(publisher: Publisher) -> None:
    with subscribe(publisher, trainable_limit=10) as subscriber:
        for i in range(25):
            publisher.send(encode(make_record("w", i), "map"))
        wait_until(received(subscriber, 25), "25 records")
        assert subscriber.new_trainable_records() == [make_record("w", i) for i in range(15, 25)]
        assert subscriber.snapshot().trainable_overflow == 15


BAD_ENDPOINTS = [
    ("no-transport", "127.0.0.1:20380"),
    ("unknown-transport", "http://127.0.0.1:20380"),
    ("no-port", "tcp://127.0.0.1"),
    ("port-zero", "tcp://127.0.0.1:0"),
    ("port-too-large", "tcp://127.0.0.1:70000"),
    ("wildcard", "tcp://*:20380"),
    ("inproc", "inproc://engines"),
    ("empty", ""),
]


@pytest.mark.parametrize("endpoint", [e for _, e in BAD_ENDPOINTS], ids=[n for n, _ in BAD_ENDPOINTS])
def test_check_rejects_what_is_not_a_zmq_address(endpoint: str) -> None:
    subscriber = FpmSubscriber(["tcp://127.0.0.1:20380", endpoint], engine_timeout_s=30.0)
    with pytest.raises(SourceUnavailableError) as excinfo:
        subscriber.check()
    assert excinfo.value.source == "fpm" and repr(endpoint) in excinfo.value.reason
    with pytest.raises(SourceUnavailableError):
        subscriber.start()
    assert not subscriber.running


def test_check_accepts_engines_that_are_not_up_yet() -> None:
    FpmSubscriber(
        ["tcp://127.0.0.1:20380", "tcp://engine-0.example:20381", "tcp://[::1]:20382", "ipc:///tmp/fpm-0"],
        engine_timeout_s=30.0,
    ).check()


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        FpmSubscriber(["tcp://127.0.0.1:1", "tcp://127.0.0.1:1"], engine_timeout_s=1.0)
    with pytest.raises(ValueError, match="engine_timeout_s"):
        FpmSubscriber(["tcp://127.0.0.1:1"], engine_timeout_s=0)


@pytest.mark.timeout(60)  # a stop that waited on a silent endpoint would hang here
def test_stop_ends_the_subscriber_with_silent_endpoints() -> None:
    subscriber = FpmSubscriber(["tcp://127.0.0.1:9", "tcp://127.0.0.1:10"], engine_timeout_s=1.0).start()
    assert subscriber.running
    subscriber.stop()
    assert not subscriber.running
    snap: FpmSnapshot = subscriber.snapshot()
    assert snap.engines == {} and snap.received == 0 and not snap.running and snap.failure is None
