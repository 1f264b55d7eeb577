"""FrontendScrapeSource against the stand-in frontend over real HTTP, without Prometheus: what
was served between two observations is read back exactly (counters differenced between scrapes;
the trace requests' TTFT/ITL are binary fractions, so sums and differences are exact)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from app.core.errors import SourceUnavailableError
from app.core.types import TrafficObservation
from app.sources.frontend_scrape import FIRST_SCRAPE, FrontendScrapeSource
from app.sources.traffic_common import INPUT_SEQUENCE_TOKENS as ISL
from tests.support_frontend import (
    MODEL,
    OTHER_MODEL,
    Canned,
    FrontendExporter,
    StandInServer,
    TraceRequest,
    load_trace,
)

pytestmark = pytest.mark.anyio

# The interval each observation asks for. The scrapes here are a fraction of a second apart, and
# a window shorter than half the asked interval is no reading (test_frontend_scrape.py): these
# tests ask for none, where a tick asks for its own interval.
ASKED_S = 0.0


async def test_reads_back_what_was_served_between_observations() -> None:
    with FrontendExporter() as exporter:
        source = FrontendScrapeSource(exporter.url, model_name=MODEL.lower())
        with pytest.raises(SourceUnavailableError) as err:
            await source.observe(ASKED_S)
        assert err.value.reason == FIRST_SCRAPE

        served = exporter.serve_requests(load_trace(limit=250))
        exporter.serve_requests(load_trace(start=900, limit=30), model=OTHER_MODEL)
        first = await source.observe(ASKED_S)
        assert first.duration_s > 0, "measured between the two scrapes"
        assert first == served.observation(first.duration_s)
        assert first.complete

        served = exporter.serve_requests(load_trace(start=250, limit=400))
        second = await source.observe(ASKED_S)
        assert second == served.observation(second.duration_s)

        idle = await source.observe(ASKED_S)
        assert idle == TrafficObservation(idle.duration_s, 0.0, None, None), "confirmed idle"


async def test_the_isl_histogram_of_known_requests() -> None:
    """3 prompts ≤ 128 tokens, 2 in (256, 512], 1 above 65536: exactly those buckets, from the
    exporter's `_bucket` series differenced between two scrapes (other models not counted)."""
    with FrontendExporter() as exporter:
        exporter.serve_requests(load_trace(limit=20))  # before the baseline: not counted
        source = FrontendScrapeSource(exporter.url, model_name=MODEL)
        await source.check()
        isls = (100, 128, 17, 300, 512, 70000)
        exporter.serve_requests(TraceRequest(0, isl, 10) for isl in isls)
        exporter.serve_requests(load_trace(limit=5), model=OTHER_MODEL)
        observation = await source.observe(ASKED_S)
        inf = float("inf")
        expected = {32.0: 1.0, 128.0: 2.0, 512.0: 2.0, 131072.0: 1.0}
        bounds = (*(float(2**k) for k in range(4, 18)), inf)
        assert observation.isl_buckets == tuple((b, expected.get(b, 0.0)) for b in bounds)
        assert observation.num_req == 6.0


async def test_a_frontend_without_the_isl_histogram() -> None:
    """A frontend publishing the ISL histogram's `_sum`/`_count` but no `_bucket` series: the
    observation as always, with no histogram."""
    exporter = FrontendExporter()  # not started: only its registry renders the metrics

    def without_buckets() -> Canned:
        text = generate_latest(exporter.registry).decode()
        lines = [line for line in text.splitlines(keepends=True) if f"{ISL}_bucket" not in line]
        return Canned(200, "".join(lines).encode(), "text/plain; version=0.0.4; charset=utf-8")

    with StandInServer() as server:
        server.answer = without_buckets()
        source = FrontendScrapeSource(server.url, model_name=MODEL)
        await source.check()
        served = exporter.serve_requests(load_trace(limit=40))
        server.answer = without_buckets()
        observation = await source.observe(ASKED_S)
        assert observation == replace(served.observation(observation.duration_s), isl_buckets=())
        assert served.isl_buckets != ()


async def test_check_takes_the_baseline() -> None:
    with FrontendExporter() as exporter:
        exporter.serve_requests(load_trace(limit=10))  # before the baseline: not counted
        source = FrontendScrapeSource(f"{exporter.url}/metrics", model_name=MODEL)
        await source.check()
        served = exporter.serve_requests(load_trace(start=10, limit=90))
        observation = await source.observe(ASKED_S)
        assert observation == served.observation(observation.duration_s)


async def test_a_frontend_restart_counts_from_zero() -> None:
    with FrontendExporter() as exporter:
        source = FrontendScrapeSource(exporter.url, model_name=MODEL)
        exporter.serve_requests(load_trace(limit=200))
        await source.check()
        exporter.restart()  # counters back to 0, same port
        served = exporter.serve_requests(load_trace(start=200, limit=300))  # more than before
        observation = await source.observe(ASKED_S)
        assert observation == served.observation(observation.duration_s)
        assert any("was reset (frontend restart?)" in note for note in source.last_notes), source.last_notes


async def test_an_older_frontend_counts_requests_total() -> None:
    with FrontendExporter(requests_started=False) as exporter:
        source = FrontendScrapeSource(exporter.url, model_name=MODEL)
        await source.check()
        served = exporter.serve_requests(load_trace(limit=120))
        observation = await source.observe(ASKED_S)
        assert observation == served.observation(observation.duration_s)
        assert "no series of this model in dynamo_frontend_requests_started_total" in source.last_notes


async def test_other_models_only_is_unknown_traffic() -> None:
    with FrontendExporter(models=(OTHER_MODEL,)) as exporter:
        source = FrontendScrapeSource(exporter.url, model_name=MODEL)
        await source.check()
        exporter.serve_requests(load_trace(limit=50))
        observation = await source.observe(ASKED_S)
        assert observation == TrafficObservation(observation.duration_s, None, None, None)


async def test_frontend_down_then_back() -> None:
    exporter = FrontendExporter().start()
    try:
        source = FrontendScrapeSource(exporter.url, model_name=MODEL)
        await source.check()
        port = exporter.port
        exporter.stop()
        with pytest.raises(SourceUnavailableError) as err:
            await source.observe(ASKED_S)
        assert f"cannot connect to http://127.0.0.1:{port}/metrics" in err.value.reason
        assert "ConnectError" in err.value.reason
        exporter.start()  # same port, same counters: the baseline still holds
        served = exporter.serve_requests(load_trace(limit=60))
        observation = await source.observe(ASKED_S)
        assert observation == served.observation(observation.duration_s)
    finally:
        exporter.stop()


@pytest.mark.parametrize(
    ("answer", "fragments"),
    [
        (Canned(200, b"<html><body>Welcome to nginx!</body></html>", "text/html"), ("an HTML page", "nginx")),
        (
            Canned(200, b'{"object": "list", "data": []}', "application/json"),
            ("with JSON, not Prometheus text",),
        ),
        (Canned(200, b"Service Unavailable, try later", "text/plain"), ("not Prometheus text format",)),
        (Canned(404, b"404 page not found", "text/plain"), ("HTTP 404", "404 page not found")),
        (Canned(drop=True), ("RemoteProtocolError", "Server disconnected")),
        (Canned(hang=True), ("no answer within 0.5 s", "ReadTimeout")),
    ],
    ids=["html", "json", "text", "not-found", "connection-dropped", "no-answer"],
)
async def test_garbage_is_a_clear_reason(answer: Canned, fragments: tuple[str, ...]) -> None:
    with StandInServer() as server:
        server.answer = answer
        source = FrontendScrapeSource(server.url, model_name=MODEL, timeout_s=0.5)
        for call in (source.check, lambda: source.observe(ASKED_S)):
            with pytest.raises(SourceUnavailableError) as err:
                await call()
            assert err.value.source == "frontend_scrape"
            for fragment in fragments:
                assert fragment in err.value.reason, err.value.reason
        assert set(server.paths) == {"/metrics"}
