"""A stand-in Dynamo frontend for `make serve`: a request trace played on the wall clock.

`planner serve` on its own has no traffic to decide on. `make serve` starts this beside it so that
SLA scaling has a frontend to scrape: an HTTP server whose `/metrics` shows Dynamo's
`dynamo_frontend_*` counters (`app/sim/world/frontend.py`) for the requests of a trace that have
arrived since it started, at `rate_scale` times the trace's rate, the trace starting over when it
ends. No engines stand behind it, so it reports what a frontend knows before any engine answers:
arrivals, prompt and output lengths, requests in flight. It never reports a TTFT or an ITL (there
is no latency to report), and the planner sizes from its profile alone.

A request is in flight from its arrival for `nominal_duration_s(osl)`, a fixed time per generated
token, then completes: the frontend counts prompt and output lengths at completion, so the lengths
reach the planner as they would from a real frontend, shortly after the arrivals.

    python -m app.sim.demo.standin --trace data/traces/AzureLLMInferenceTrace_conv.csv --port 8090
"""

from __future__ import annotations

import argparse
import heapq
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from app.core.traces import TraceRequest
from app.sim.world.frontend import FrontendCounters
from app.sim.world.workload import expand_rate
from app.sources.traces import load_trace

DEFAULT_TRACE = Path(__file__).resolve().parents[3] / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
# A request's time in flight without engines: a short first token, then a typical decode pace.
# It only sets how long a request counts as in flight and when its lengths are reported.
FIRST_TOKEN_S = 0.2
PER_OUTPUT_TOKEN_S = 0.02


def nominal_duration_s(osl_tokens: int) -> float:
    return FIRST_TOKEN_S + PER_OUTPUT_TOKEN_S * osl_tokens


class TracePlayback:
    """The frontend's counters for a trace played from elapsed time 0, looping at its end.

    Time is an input: `advance(elapsed_s)` counts every arrival and completion up to `elapsed_s`
    (seconds since the playback started); it never goes back."""

    def __init__(self, requests: Sequence[TraceRequest], *, model: str = "model") -> None:
        if not requests:
            raise ValueError("the trace has no requests")
        self.requests = sorted(requests, key=lambda r: r.arrival_s)
        # One loop lasts until the last arrival plus a second, so the next loop's first request
        # does not land on the same instant as this loop's last.
        self.loop_s = self.requests[-1].arrival_s + 1.0
        self.counters = FrontendCounters(model)
        self.elapsed_s = 0.0
        self._loop = 0
        self._next = 0
        self._in_flight: list[tuple[float, int, int, int]] = []  # (done at, seq, isl, osl)
        self._seq = 0

    def advance(self, elapsed_s: float) -> None:
        if elapsed_s < self.elapsed_s:
            return
        while True:
            r = self.requests[self._next]
            arrival = self._loop * self.loop_s + r.arrival_s
            done = self._in_flight[0][0] if self._in_flight else float("inf")
            if min(arrival, done) > elapsed_s:
                break
            if done <= arrival:
                _, _, isl, osl = heapq.heappop(self._in_flight)
                self.counters.on_complete(isl, osl, None, nominal_duration_s(osl))
                continue
            self.counters.on_arrival()
            self._seq += 1
            heapq.heappush(
                self._in_flight,
                (arrival + nominal_duration_s(r.osl_tokens), self._seq, r.isl_tokens, r.osl_tokens),
            )
            self._next += 1
            if self._next == len(self.requests):
                self._next, self._loop = 0, self._loop + 1
        self.elapsed_s = elapsed_s

    def metrics(self, elapsed_s: float) -> str:
        self.advance(elapsed_s)
        return self.counters.render_prometheus()


def serve(
    playback: TracePlayback, port: int, *, clock: Callable[[], float] = time.monotonic
) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1:`port` answering `GET /metrics` from `playback` (the caller runs
    `serve_forever`). Elapsed time counts from this call."""
    started = clock()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            with lock:
                body = playback.metrics(clock() - started).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the stdlib's name)
            pass  # the planner scrapes every tick: one line each would bury the planner's own log

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m app.sim.demo.standin",
        description="A stand-in Dynamo frontend: /metrics for a request trace played on the wall clock "
        "(no engines behind it, so no latencies).",
    )
    parser.add_argument("--trace", default=str(DEFAULT_TRACE), help="request trace (default: %(default)s)")
    parser.add_argument(
        "--rate-scale", type=float, default=10.0, help="K times the trace's rate (default: 10)"
    )
    parser.add_argument("--port", type=int, default=8090, help="port on 127.0.0.1 (default: 8090)")
    parser.add_argument("--model", default="model", help="the `model` label of the metrics (default: model)")
    args = parser.parse_args(argv)
    try:
        requests = expand_rate(load_trace(args.trace), args.rate_scale, seed=0)
        server = serve(TracePlayback(requests, model=args.model), args.port)
    except (OSError, ValueError) as exc:
        print(f"standin: {exc}", file=sys.stderr)
        return 2
    print(
        f"stand-in frontend: http://127.0.0.1:{args.port}/metrics plays {Path(args.trace).name} at "
        f"{args.rate_scale:g}x ({len(requests)} requests a loop), no engines behind it",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
