"""PrometheusSource against a real Prometheus server scraping a stand-in frontend.

The module starts the stand-in exporter (tests/support_frontend.py), then `prometheus` on a free
port (scrape interval 1 s, storage in tmp_path), serves requests from the Mooncake trace, and
reads them back through the source.

Why the values can be compared exactly: `increase()` extrapolates towards the window edges. At the
start it extrapolates at most to where the counter would be zero; every series of the exporter
exists from the beginning with value 0, and the window (1 h) reaches back before Prometheus'
first sample, so the first sample in the window is 0 and nothing is added at the start. At the
end it extrapolates from the last sample to the evaluation time; the source is evaluated at
`at=` the timestamp of that last sample (the scrape holding the whole batch), so nothing is
added there either. Then increase() = last − first: the exact count and sums the exporter
served, and Σ sum / Σ count the exact means (the TTFT/ITL of the trace requests are binary
fractions, so no sum depends on the order of additions).

Without a `prometheus` binary the module is skipped (CI installs it and fails on skips).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.core.errors import SourceUnavailableError
from app.core.types import TrafficObservation
from app.sources.prometheus import PrometheusSource
from tests.support_frontend import (
    MODEL,
    NAMESPACE,
    OTHER_MODEL,
    PROMETHEUS_ENV,
    Canned,
    FrontendExporter,
    PrometheusServer,
    Served,
    StandInServer,
    load_trace,
    prometheus_binary,
    wait_until,
)

pytestmark = pytest.mark.anyio

WINDOW_S = 3600  # reaches back before Prometheus' first sample
STARTED = "dynamo_frontend_requests_started_total"


@dataclass
class Stack:
    exporter: FrontendExporter
    prometheus: PrometheusServer
    served: Served  # MODEL's batch
    other: Served  # OTHER_MODEL's batch, on the same frontend
    at: float  # Unix seconds of the scrape that holds both batches


def scraped(prometheus: PrometheusServer, model: str) -> list[float]:
    return prometheus.values(f'{STARTED}{{model="{model}"}}')


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = prometheus_binary()
    if binary is None:
        pytest.skip(
            "no prometheus binary: install Debian's `prometheus` package (CI does) "
            f"or point {PROMETHEUS_ENV} at one"
        )
    exporter = FrontendExporter().start()
    prometheus = PrometheusServer(binary, Path(tmp_path_factory.mktemp("prometheus")), [exporter.target])
    try:
        prometheus.start()
        # The first sample of every series must be 0 (see the module docstring).
        wait_until(
            lambda: scraped(prometheus, MODEL) == [0.0] and scraped(prometheus, OTHER_MODEL) == [0.0],
            f"prometheus scraped the idle exporter\n{prometheus.log_tail()}",
        )
        served = exporter.serve_requests(load_trace(limit=300))
        other = exporter.serve_requests(load_trace(start=300, limit=40), model=OTHER_MODEL)
        wait_until(
            lambda: scraped(prometheus, MODEL) == [300.0] and scraped(prometheus, OTHER_MODEL) == [40.0],
            f"prometheus scraped the served requests\n{prometheus.log_tail()}",
        )
        # Every scrape from now on holds both whole batches (the exporter serves a batch under a
        # lock); the latest one so far is the end of the windows below.
        (at,) = prometheus.values(f'timestamp({STARTED}{{model="{MODEL}"}})')
        yield Stack(exporter, prometheus, served, other, at)
    finally:
        prometheus.stop()
        exporter.stop()


def source(stack: Stack, **kwargs: object) -> PrometheusSource:
    kwargs.setdefault("labels", {"dynamo_namespace": NAMESPACE, "job": "frontend"})
    kwargs.setdefault("model_name", MODEL.lower())
    return PrometheusSource(stack.prometheus.url, **kwargs)  # type: ignore[arg-type]


async def test_reads_back_what_the_exporter_served(stack: Stack) -> None:
    observation = await source(stack).observe(WINDOW_S, at=stack.at)
    assert observation == stack.served.observation(float(WINDOW_S))
    assert observation.complete
    # The ISL histogram too, bucket by bucket (`sum by (le) (increase(..._bucket[W]))`): exact.
    assert observation.isl_buckets == stack.served.isl_buckets
    assert observation.isl_buckets[-1][0] == float("inf")
    assert sum(n for _, n in observation.isl_buckets) == 300.0
    assert sum(1 for _, n in observation.isl_buckets if n > 0) > 1
    # And Prometheus itself stores exactly that many requests.
    assert stack.prometheus.values(f'{STARTED}{{model="{MODEL}"}}', at=stack.at) == [300.0]


async def test_model_names_ignore_case_and_other_models_do_not_count(stack: Stack) -> None:
    qwen = await source(stack, model_name=OTHER_MODEL.upper()).observe(WINDOW_S, at=stack.at)
    assert qwen == stack.other.observation(float(WINDOW_S))
    everything = await source(stack, model_name=None, labels={}).observe(WINDOW_S, at=stack.at)
    assert everything.num_req == 340.0


@pytest.mark.parametrize(
    ("model_name", "labels"),
    [("no-such-model", {}), (MODEL, {"dynamo_namespace": "elsewhere"}), (MODEL, {"job": "not-the-frontend"})],
    ids=["unknown-model", "other-namespace", "other-job"],
)
async def test_no_matching_series_is_unknown_not_zero(
    stack: Stack, model_name: str, labels: dict[str, str]
) -> None:
    observation = await source(stack, model_name=model_name, labels=labels).observe(WINDOW_S, at=stack.at)
    assert observation == TrafficObservation(float(WINDOW_S), None, None, None)


async def test_a_window_without_requests_is_confirmed_idle(stack: Stack) -> None:
    """Three seconds that end well after the batch: increase 0, means 0/0 → None, num_req 0."""
    later = wait_until(
        lambda: [t for t in stack.prometheus.values(f"timestamp({STARTED})") if t >= stack.at + 4.0],
        "prometheus scraped for four more seconds",
    )[0]
    observation = await source(stack).observe(3, at=later)
    assert observation == TrafficObservation(3.0, 0.0, None, None)


async def test_prometheus_down_then_back(stack: Stack) -> None:
    prom = source(stack)
    await prom.check()
    stack.prometheus.stop()
    try:
        for call in (prom.check, lambda: prom.observe(WINDOW_S, at=stack.at), lambda: prom.observe(60)):
            with pytest.raises(SourceUnavailableError) as err:
                await call()
            assert err.value.source == "prometheus"
            assert f"cannot connect to {stack.prometheus.url}/api/v1/query" in err.value.reason
            assert "ConnectError" in err.value.reason
            assert "ConnectionRefusedError" in err.value.reason or "refused" in err.value.reason
    finally:
        stack.prometheus.start()
    await prom.check()
    # The same source works again, and the data survived the restart (Prometheus' WAL).
    assert await prom.observe(WINDOW_S, at=stack.at) == stack.served.observation(float(WINDOW_S))
    # At "now" increase() extrapolates to the window's end (the count is no longer exact), but by
    # the same factor for a histogram's sum and count: the means hold, up to rounding.
    now = await prom.observe(WINDOW_S)
    assert now.num_req is not None
    assert now.isl == pytest.approx(stack.served.isl, rel=1e-12)


# --- a stand-in answering garbage where Prometheus should be ---------------------------------------

HTML = b"<!DOCTYPE html><html><head><title>Grafana</title></head><body>Sign in</body></html>"


def json_body(text: str) -> bytes:
    return text.encode()


GARBAGE = [
    (Canned(200, HTML, "text/html; charset=utf-8"), ("HTTP 200 with an HTML page", "Grafana")),
    (
        Canned(200, b"Prometheus is not here", "text/plain"),
        ("not JSON (text/plain)", "Prometheus is not here"),
    ),
    (Canned(200, b'{"status": "success", "data": {"resultT', "application/json"), ("not JSON",)),
    (Canned(200, b"", None), ("an empty body",)),
    (Canned(200, b'{"hello": "world"}', "application/json"), ("not a Prometheus API response",)),
    (
        Canned(
            400,
            json_body('{"status":"error","errorType":"bad_data","error":"invalid parameter \\"query\\""}'),
            "application/json",
        ),
        ("failed (HTTP 400, bad_data)", 'invalid parameter "query"'),
    ),
    (
        Canned(
            503,
            json_body('{"status":"error","errorType":"unavailable","error":"TSDB not ready"}'),
            "application/json",
        ),
        ("failed (HTTP 503, unavailable): TSDB not ready",),
    ),
    (
        Canned(200, json_body('{"status":"success","data":{"resultType":"string","result":[1,"x"]}}'), None),
        ("malformed answer: resultType 'string', expected 'vector'",),
    ),
    (Canned(502, b"<html><body>502 Bad Gateway</body></html>", "text/html"), ("HTTP 502", "HTML page")),
    (Canned(drop=True), ("RemoteProtocolError", "Server disconnected")),
    (Canned(hang=True), ("no answer within 0.5 s", "ReadTimeout")),
]


@pytest.mark.parametrize(
    ("answer", "fragments"),
    GARBAGE,
    ids=[
        "html",
        "text",
        "truncated-json",
        "empty",
        "other-json",
        "status-error-400",
        "status-error-503",
        "wrong-result-type",
        "proxy-error-page",
        "connection-dropped",
        "no-answer",
    ],
)
async def test_garbage_is_a_clear_reason(answer: Canned, fragments: tuple[str, ...]) -> None:
    with StandInServer() as server:
        server.answer = answer
        prom = PrometheusSource(server.url, labels={}, model_name=MODEL, timeout_s=0.5)
        for call in (prom.check, lambda: prom.observe(180)):
            with pytest.raises(SourceUnavailableError) as err:
                await call()
            for fragment in fragments:
                assert fragment in err.value.reason, err.value.reason
        assert all(p.startswith("/api/v1/query?") for p in server.paths), server.paths
