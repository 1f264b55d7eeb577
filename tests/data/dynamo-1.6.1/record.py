"""Record what a live Dynamo 1.6.1 stack exports, for the contract tests beside this file.

    python deploy/dynamo-local/stack.py start --port 18124 --workdir /tmp/dl-rec --speedup 0.1
    python tests/data/dynamo-1.6.1/record.py --url http://127.0.0.1:18124 --workdir /tmp/dl-rec
    python deploy/dynamo-local/stack.py stop --workdir /tmp/dl-rec

Writes, beside this file:
- `frontend_metrics.txt`: the frontend's `/metrics` after a few streamed and unary requests;
- `fpm_event_plane.json`: raw ZMQ multipart messages (hex) read from each worker's
  forward-pass-metrics publisher named in discovery, busy iterations and idle heartbeats of both
  roles;
- `discovery/`: the file-discovery records of the stack (`v1/mdc`, `v1/event_channels`,
  `v1/instances`), with their names as Dynamo wrote them (URL-quoted keys).
Needs pyzmq; no Dynamo import.
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
import urllib.request
from pathlib import Path

import zmq

HERE = Path(__file__).resolve().parent


def request(url: str, isl: int, osl: int, stream: bool) -> None:
    body = {
        "model": "tiny",
        "prompt": " ".join(f"w{i % 2000}" for i in range(isl)),
        "max_tokens": osl,
        "ignore_eos": True,
        "stream": stream,
    }
    req = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args()
    discovery = args.workdir / "discovery"
    channels = []
    for path in sorted((discovery / "v1" / "event_channels").iterdir()):
        rec = json.loads(path.read_text())
        if rec["topic"] == "forward-pass-metrics":
            channels.append((rec["scope"]["endpoint"]["component"], rec["transport"]["config"]["endpoint"]))
    ctx = zmq.Context()
    socks = []
    for component, endpoint in channels:
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(endpoint)
        socks.append((component, sock))
    time.sleep(1.0)  # the subscriptions reach the publishers
    threads = [threading.Thread(target=request, args=(args.url, 3000, 40, i % 2 == 0)) for i in range(4)]
    for t in threads:
        t.start()
    messages: list[dict] = []
    busy = {c: 0 for c, _ in channels}
    idle = {c: 0 for c, _ in channels}
    deadline = time.time() + 30
    while time.time() < deadline and not all(idle[c] >= 1 and busy[c] >= 3 for c in busy):
        for component, sock in socks:
            if sock.poll(50):
                frames = sock.recv_multipart()
                heartbeat = b"\xa9wall_time\xcb\x00\x00\x00\x00\x00\x00\x00\x00" in frames[-1]
                kind = idle if heartbeat else busy
                if kind[component] < (1 if heartbeat else 3):
                    kind[component] += 1
                    messages.append({"component": component, "frames": [f.hex() for f in frames]})
    for t in threads:
        t.join()
    (HERE / "fpm_event_plane.json").write_text(json.dumps({"messages": messages}, indent=1) + "\n")
    for i in range(3):
        request(args.url, 200 + i, 20, i % 2 == 0)
    with urllib.request.urlopen(f"{args.url}/metrics") as resp:
        (HERE / "frontend_metrics.txt").write_bytes(resp.read())
    out = HERE / "discovery"
    if out.exists():
        shutil.rmtree(out)
    for bucket in ("mdc", "event_channels", "instances"):
        shutil.copytree(discovery / "v1" / bucket, out / "v1" / bucket)
    print(f"recorded {len(messages)} FPM messages, /metrics and discovery into {HERE}")


if __name__ == "__main__":
    main()
