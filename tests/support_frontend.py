"""Helpers for the traffic sources' tests and benches: a stand-in Dynamo frontend that publishes
`dynamo_frontend_*` metrics for requests of a real trace, and a real Prometheus server.

- `load_trace()` reads the Mooncake trace in `data/traces/` (a few lines of JSON parsing, kept
  here so the helpers do not depend on the application's trace readers).
- `TraceRequest` gives every request a deterministic TTFT and ITL derived from its lengths. They
  are multiples of 1/1024 s, so every sum of them is exact in floating point whatever the order,
  and a test can know the exact means a source must read back (`Served`).
- `FrontendExporter` serves the metrics on a free loopback port (prometheus_client's registry and
  HTTP server in a thread), labelled `model` (mixed case on purpose, as some frontends publish it)
  and `dynamo_namespace`. Every series exists from the start with value 0, so Prometheus' first
  sample of each is 0 (see `tests/integration/test_prometheus_source.py` for why that matters).
- `PrometheusServer` runs the `prometheus` binary on a free port with a temporary configuration
  and storage directory.
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httpx
import yaml
from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from app.core.types import TrafficObservation
from app.sim.world.frontend import FrontendCounters
from tests.support import REPO_ROOT, free_port

TRACE = REPO_ROOT / "data" / "traces" / "mooncake_trace_arxiv_first1000.jsonl"
MODEL = "Llama-3.1-8B"  # what the deployment serves (mixed case on purpose)
OTHER_MODEL = "Qwen3-0.6B"  # traffic of another model on the same frontend: never counted
NAMESPACE = "dynamo"
PROMETHEUS_ENV = "PLANNER_TEST_PROMETHEUS"  # another prometheus binary than the one on PATH


# --- requests from a real trace -------------------------------------------------------------------


@dataclass(frozen=True)
class TraceRequest:
    """One request of the trace, with the latencies the stand-in frontend reports for it."""

    timestamp_ms: int
    isl: int
    osl: int

    @property
    def ttft_s(self) -> float:
        """Grows with the prompt: 62.5 ms plus 1/1024 s per 64 input tokens."""
        return (64 + self.isl // 64) / 1024

    @property
    def itl_s(self) -> float:
        """8 to 39 ms, from the output length."""
        return (8 + self.osl % 32) / 1024

    @property
    def itl_observations(self) -> int:
        """Like the frontend, one inter-token latency per output token after the first."""
        return max(self.osl - 1, 0)

    @property
    def duration_s(self) -> float:
        return self.ttft_s + self.itl_s * self.itl_observations


def load_trace(path: Path = TRACE, *, start: int = 0, limit: int | None = None) -> list[TraceRequest]:
    """Rows `start` .. `start + limit` of a Mooncake JSONL trace."""
    requests: list[TraceRequest] = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i < start or not line.strip():
                continue
            if limit is not None and len(requests) >= limit:
                break
            row = json.loads(line)
            requests.append(
                TraceRequest(int(row["timestamp"]), int(row["input_length"]), int(row["output_length"]))
            )
    return requests


@dataclass(frozen=True)
class Served:
    """What a source must read back for a batch of requests: the count and the exact means,
    computed the way the sources compute them (Σ sum / Σ count, then the unit)."""

    num_req: int
    isl: float
    osl: float
    ttft_ms: float
    itl_ms: float
    request_duration_s: float
    # The ISL histogram of the batch with the exporter's buckets: (upper bound, requests) each.
    isl_buckets: tuple[tuple[float, float], ...] = ()

    @staticmethod
    def of(requests: Sequence[TraceRequest]) -> Served:
        n = len(requests)
        assert n > 0, "an empty batch has no means"
        itl_count = sum(r.itl_observations for r in requests)
        return Served(
            num_req=n,
            isl=sum(r.isl for r in requests) / n,
            osl=sum(r.osl for r in requests) / n,
            ttft_ms=sum(r.ttft_s for r in requests) / n * 1000.0,
            itl_ms=sum(r.itl_s * r.itl_observations for r in requests) / itl_count * 1000.0,
            request_duration_s=sum(r.duration_s for r in requests) / n,
            isl_buckets=isl_histogram(r.isl for r in requests),
        )

    def observation(self, duration_s: float) -> TrafficObservation:
        """The observation a source must return for exactly this batch over `duration_s`."""
        return TrafficObservation(
            duration_s=duration_s,
            num_req=float(self.num_req),
            isl=self.isl,
            osl=self.osl,
            ttft_ms=self.ttft_ms,
            itl_ms=self.itl_ms,
            request_duration_s=self.request_duration_s,
            isl_buckets=self.isl_buckets,
        )


def isl_histogram(isls: Iterable[int]) -> tuple[tuple[float, float], ...]:
    """Requests per bucket of the stand-in frontend's ISL histogram (`le`: upper bound included),
    every bucket, the last bound inf: what a source reads back for them."""
    bounds = (*_TOKEN_BUCKETS, float("inf"))
    counts = [0] * len(bounds)
    for isl in isls:
        counts[bisect.bisect_left(bounds, isl)] += 1
    return tuple((bound, float(count)) for bound, count in zip(bounds, counts, strict=True))


# --- the stand-in frontend ----------------------------------------------------------------------------

_TOKEN_BUCKETS = tuple(float(2**k) for k in range(4, 18))
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _AtomicView(Collector):
    """The registry as the HTTP server sees it: collected under the exporter's lock, so that a
    scrape never sees half of a `serve_requests` batch."""

    def __init__(self, exporter: FrontendExporter) -> None:
        self.exporter = exporter

    def collect(self) -> Iterable[Metric]:
        with self.exporter.lock:
            return list(self.exporter.registry.collect())


class FrontendExporter:
    """A Dynamo frontend's metrics without the frontend: `serve_requests` records requests as
    the frontend would, and `/metrics` on `url` publishes them.

    `requests_started=False` publishes only `dynamo_frontend_requests_total`, like an older
    frontend. `restart()` starts over from zero on the same port, like a restarted frontend."""

    LABELS = ("model", "dynamo_namespace")

    def __init__(
        self,
        *,
        models: Sequence[str] = (MODEL, OTHER_MODEL),
        namespace: str = NAMESPACE,
        requests_started: bool = True,
    ) -> None:
        self.models = tuple(models)
        self.namespace = namespace
        self.requests_started = requests_started
        self.port = 0
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.lock = threading.Lock()
        self._build()

    def _build(self) -> None:
        self.registry = CollectorRegistry()
        labels = self.LABELS

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

        prefix = "dynamo_frontend_"
        self.ttft = histogram(f"{prefix}time_to_first_token_seconds", "Time to first token", _LATENCY_BUCKETS)
        self.itl = histogram(f"{prefix}inter_token_latency_seconds", "Inter-token latency", _LATENCY_BUCKETS)
        self.isl = histogram(f"{prefix}input_sequence_tokens", "Input sequence length", _TOKEN_BUCKETS)
        self.osl = histogram(f"{prefix}output_sequence_tokens", "Output sequence length", _TOKEN_BUCKETS)
        self.duration = histogram(f"{prefix}request_duration_seconds", "Request duration", _LATENCY_BUCKETS)
        self.started = (
            Counter("dynamo_frontend_requests_started", "Requests started", labels, registry=self.registry)
            if self.requests_started
            else None
        )
        self.total = Counter(
            "dynamo_frontend_requests",
            "Requests finished",
            (*labels, "request_type", "status"),
            registry=self.registry,
        )
        for model in self.models:  # every series exists, at 0, before the first request
            self._children(model)

    def _children(self, model: str) -> tuple[Any, ...]:
        key = (model, self.namespace)
        return (
            self.ttft.labels(*key),
            self.itl.labels(*key),
            self.isl.labels(*key),
            self.osl.labels(*key),
            self.duration.labels(*key),
            self.started.labels(*key) if self.started is not None else None,
            self.total.labels(*key, "stream", "success"),
        )

    # --- serving --------------------------------------------------------------------------------

    def serve_requests(self, requests: Iterable[TraceRequest], *, model: str | None = None) -> Served:
        """Record `requests` of `model` (default: the first model) as completed, all at once (no
        scrape sees part of the batch); what was served."""
        batch = list(requests)
        ttft, itl, isl, osl, duration, started, total = self._children(model or self.models[0])
        with self.lock:
            for r in batch:
                if started is not None:
                    started.inc()
                ttft.observe(r.ttft_s)
                for _ in range(r.itl_observations):
                    itl.observe(r.itl_s)
                isl.observe(r.isl)
                osl.observe(r.osl)
                duration.observe(r.duration_s)
                total.inc()
        return Served.of(batch)

    # --- the HTTP server ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        """`host:port`, as a Prometheus scrape target."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> FrontendExporter:
        server = make_server(
            "127.0.0.1", self.port, make_wsgi_app(_AtomicView(self)), ThreadingWSGIServer, _QuietHandler
        )
        # A short poll interval: stop() (and restart()) return promptly.
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        self._server, self._thread = server, thread
        self.port = server.server_port
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._server = self._thread = None

    def restart(self) -> None:
        """A frontend restart: every counter back to 0 (new `_created` times), same port."""
        self.stop()
        self._build()
        self.start()

    def __enter__(self) -> FrontendExporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- a real Prometheus server -----------------------------------------------------------------------


def prometheus_binary() -> str | None:
    """The `prometheus` executable: $PLANNER_TEST_PROMETHEUS, else on PATH, else Debian's path."""
    for candidate in (os.environ.get(PROMETHEUS_ENV), shutil.which("prometheus"), "/usr/bin/prometheus"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def wait_until(condition: Callable[[], Any], what: str, *, steps: int = 600, pause_s: float = 0.05) -> Any:
    """Bounded polling: the first truthy value of `condition()`; a wait, not a timing assertion."""
    for _ in range(steps):
        value = condition()
        if value:
            return value
        time.sleep(pause_s)
    raise AssertionError(f"never happened: {what}")


class PrometheusServer:
    """`prometheus` on a free loopback port, scraping `targets` every `scrape_interval_s`, its
    storage in `workdir` (kept across `stop()`/`start()`, like a restarted server)."""

    def __init__(
        self, binary: str, workdir: Path, targets: Sequence[str], *, scrape_interval_s: int = 1
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.targets = list(targets)
        self.scrape_interval_s = scrape_interval_s
        self.port = free_port()
        self.log_path = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        interval = f"{self.scrape_interval_s}s"
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {
                    "job_name": "frontend",
                    "scrape_interval": interval,
                    "scrape_timeout": interval,
                    "static_configs": [{"targets": self.targets}],
                }
            ],
        }

    def start(self, *, steps: int = 600) -> PrometheusServer:
        """Start and wait (bounded) until `/-/ready` answers 200."""
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                # Scrape timestamps snap to the interval's schedule when a scrape is at most this
                # late (default 2 ms; Prometheus applies it only below 1% of the interval). On a
                # loaded machine scrapes ran 5-16 ms late and no two were a whole number of
                # seconds apart, which tests/integration/test_dynamo_prometheus.py needs.
                f"--scrape.timestamp-tolerance={max(2, int(self.scrape_interval_s * 10) - 1)}ms",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
        )
        log.close()

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}\n{self.log_tail()}")
            try:
                return httpx.get(f"{self.url}/-/ready", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(ready, f"prometheus ready on {self.url}", steps=steps, pause_s=0.1)
        except AssertionError:
            self.stop()
            raise AssertionError(f"prometheus never became ready on {self.url}\n{self.log_tail()}") from None
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return "(no prometheus log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return f"--- {self.log_path} (last {lines} lines) ---\n" + "\n".join(text[-lines:])

    def query(self, promql: str, *, at: float | None = None) -> list[dict[str, Any]]:
        """The instant-vector result of `promql` (synchronous; for tests waiting on the server)."""
        params = {"query": promql} | ({"time": f"{at:.3f}"} if at is not None else {})
        body = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=10.0).json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def values(self, promql: str, *, at: float | None = None) -> list[float]:
        return [float(item["value"][1]) for item in self.query(promql, at=at)]


# --- a stand-in that answers garbage ------------------------------------------------------------------


@dataclass
class Canned:
    """One canned answer. `hang`: hold the request unanswered until the server stops; `drop`:
    close the connection without a response."""

    status: int = 200
    body: bytes = b""
    content_type: str | None = "text/plain"
    hang: bool = False
    drop: bool = False


class StandInServer:
    """A loopback HTTP server that answers every GET with `answer` (set it between requests):
    what a wrong URL, a proxy's error page or a broken server looks like to a source."""

    def __init__(self) -> None:
        self.answer = Canned()
        self.paths: list[str] = []
        self._release = threading.Event()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                stand_in.paths.append(self.path)
                answer = stand_in.answer
                if answer.hang:
                    stand_in._release.wait(60)
                    return
                if answer.drop:
                    self.close_connection = True
                    return
                self.send_response(answer.status)
                if answer.content_type:
                    self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> StandInServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class RampingFrontend:
    """A stand-in frontend's `/metrics`: requests of ISL/OSL tokens arrive at a rate that grows
    by `growth` per second from `start_rps`, and the counters say so every 0.1 s.

    Compound growth, not a straight line: a wish that overshot once (a burst window measured
    on a loaded machine) is held until the traffic catches up with it, and a rate growing by
    a fixed share catches up with any overshoot in bounded time."""

    def __init__(self, start_rps: float, growth: float, *, isl: int = 3000, osl: int = 200) -> None:
        self.isl, self.osl = isl, osl
        self.counters = FrontendCounters(model="llama")
        self.server = StandInServer()
        self.start_rps, self.growth = start_rps, growth
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return self.server.url

    def _publish(self) -> None:
        self.server.answer = Canned(body=self.counters.render_prometheus().encode())

    def _run(self) -> None:
        started = time.monotonic()
        owed = 0.0
        while not self._stop.wait(0.1):
            rate = self.start_rps * (1 + self.growth) ** (time.monotonic() - started)
            owed += rate * 0.1
            while owed >= 1:
                owed -= 1
                self.counters.on_arrival()
                self.counters.on_first_token(0.2)
                self.counters.on_complete(self.isl, self.osl, 0.02, 4.2)
            self._publish()

    def __enter__(self) -> RampingFrontend:
        self._publish()
        self.server.__enter__()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.server.__exit__(*exc)
