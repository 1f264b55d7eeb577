"""FPM from Dynamo's event plane, found through Dynamo's file discovery, over real ZMQ sockets.

Stand-in publishers on loopback send the messages recorded from Dynamo 1.6.1's mocker workers
(tests/data/dynamo-1.6.1/fpm_event_plane.json, 4 frames each) and announce themselves with the
recorded discovery records; the subscriber must follow publishers as they come and go, with no
endpoint listed by hand. tests/integration/test_dynamo_live.py does the same against the real
Dynamo processes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import msgpack
import pytest
import zmq

from app.core.perf.fpm import ForwardPassMetrics
from app.sources.dynamo_discovery import FileDiscovery
from app.sources.fpm import FpmSubscriber
from app.sources.fpm_wire import unwrap_event_frame
from tests.support import REPO_ROOT

RECORDED = json.loads((REPO_ROOT / "tests/data/dynamo-1.6.1/fpm_event_plane.json").read_text())["messages"]
WAIT_S = 60.0


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {WAIT_S} s: {what}")
        time.sleep(0.02)


class EventPlanePublisher:
    """Binds a PUB on loopback and writes the discovery record Dynamo writes for it."""

    def __init__(self, root: Path, component: str, instance_id: int) -> None:
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.XPUB)
        self.sock.bind("tcp://127.0.0.1:*")
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        key = (
            f"namespace/dynamo/component/{component}/endpoint/generate"
            f"/topic/forward-pass-metrics/{instance_id:x}"
        )
        folder = root / "v1" / "event_channels"
        folder.mkdir(parents=True, exist_ok=True)
        self.record = folder / quote(key, safe="")
        self.record.write_text(
            json.dumps(
                {
                    "type": "EventChannel",
                    "scope": {
                        "kind": "endpoint",
                        "endpoint": {"namespace": "dynamo", "component": component, "name": "generate"},
                    },
                    "topic": "forward-pass-metrics",
                    "instance_id": instance_id,
                    "transport": {"kind": "Zmq", "config": {"endpoint": self.address}},
                }
            )
        )

    def wait_for_subscriber(self) -> None:
        assert self.sock.poll(int(WAIT_S * 1000)), "no subscriber"
        self.sock.recv()

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def deregister(self) -> None:
        self.record.unlink()

    def close(self) -> None:
        self.sock.close(linger=0)
        self.context.term()


@pytest.fixture
def publishers(tmp_path: Path) -> Iterator[Callable[[str, int], EventPlanePublisher]]:
    made: list[EventPlanePublisher] = []

    def make(component: str, instance_id: int) -> EventPlanePublisher:
        pub = EventPlanePublisher(tmp_path / "kv", component, instance_id)
        made.append(pub)
        return pub

    yield make
    for pub in made:
        pub.close()


def recorded(component: str) -> list[list[bytes]]:
    return [[bytes.fromhex(h) for h in m["frames"]] for m in RECORDED if m["component"] == component]


def record_of(frames: list[bytes]) -> ForwardPassMetrics:
    return ForwardPassMetrics.from_wire(msgpack.unpackb(unwrap_event_frame(frames[3])))


@pytest.mark.timeout(120)
def test_publishers_found_in_discovery_are_read_and_followed(
    tmp_path: Path, publishers: Callable[[str, int], EventPlanePublisher]
) -> None:
    discovery = FileDiscovery(tmp_path / "kv")
    subscriber = FpmSubscriber(
        [], engine_timeout_s=30.0, discover=discovery.fpm_discoverer("backend"), discover_every_s=0.1
    ).start()
    try:
        assert subscriber.snapshot().engines == {}
        first = publishers("backend", 1)
        publishers("prefill", 2)  # another role's publisher: not this subscriber's
        first.wait_for_subscriber()
        messages = recorded("backend")
        for frames in messages:
            first.send(frames)
        wait_until(lambda: subscriber.snapshot().received >= len(messages), "the recorded messages")
        snap = subscriber.snapshot()
        assert snap.malformed == 0 and snap.last_error is None
        assert snap.endpoints.keys() == {first.address}
        last = record_of(messages[-1])
        assert snap.engines[last.key].record == last
        busy = [record_of(f) for f in messages if not record_of(f).is_heartbeat]
        assert subscriber.new_trainable_records() == busy
        # The publisher leaves discovery (its worker was stopped): its engine leaves at once.
        first.deregister()
        wait_until(lambda: not subscriber.snapshot().endpoints, "the publisher to be dropped")
        snap = subscriber.snapshot()
        assert snap.engines == {} and snap.removed == 1 and snap.expired == 0
    finally:
        subscriber.stop()


@pytest.mark.timeout(120)
def test_a_damaged_event_frame_is_skipped_and_named(
    tmp_path: Path, publishers: Callable[[str, int], EventPlanePublisher]
) -> None:
    pub = publishers("prefill", 3)
    subscriber = FpmSubscriber([pub.address], engine_timeout_s=30.0).start()
    try:
        pub.wait_for_subscriber()
        good = recorded("prefill")[-1]
        pub.send([*good[:3], b"\x01\x00\x00\x00\x09" + good[3][5:]])  # a wrong length
        pub.send(good)
        wait_until(lambda: subscriber.snapshot().received >= 2, "2 messages")
        snap = subscriber.snapshot()
        assert snap.malformed == 1 and "event frame says 9 bytes" in (snap.last_error or "")
        assert snap.engines[record_of(good).key].record == record_of(good)
    finally:
        subscriber.stop()
