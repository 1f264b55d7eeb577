"""FrontendScrapeSource without a server: parsing the text format, differencing two scrapes
(table tests), and the source's behaviour on httpx.MockTransport (first scrape, garbage)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from app.core.errors import SourceUnavailableError, WindowTooShortError
from app.core.types import TrafficObservation
from app.sources.frontend_scrape import FIRST_SCRAPE, FrontendScrapeSource, difference, parse_metrics

pytestmark = pytest.mark.anyio

TTFT = "dynamo_frontend_time_to_first_token_seconds"
ITL = "dynamo_frontend_inter_token_latency_seconds"
ISL = "dynamo_frontend_input_sequence_tokens"
OSL = "dynamo_frontend_output_sequence_tokens"
DURATION = "dynamo_frontend_request_duration_seconds"
STARTED = "dynamo_frontend_requests_started_total"
TOTAL = "dynamo_frontend_requests_total"

LLAMA = (("dynamo_namespace", "dynamo"), ("model", "llama-3.1-8b"))
LLAMA_MIXED = (("dynamo_namespace", "dynamo"), ("model", "Llama-3.1-8B"))
LLAMA_OTHER_NS = (("dynamo_namespace", "staging"), ("model", "llama-3.1-8b"))
QWEN = (("dynamo_namespace", "dynamo"), ("model", "qwen3-0.6b"))
NO_MODEL = (("dynamo_namespace", "dynamo"),)


# --- parsing ---------------------------------------------------------------------------------------

# What Dynamo's Rust frontend publishes (prometheus crate): TYPE lines, no _created samples.
RUST_TEXT = """\
# HELP dynamo_frontend_input_sequence_tokens Input sequence length in tokens
# TYPE dynamo_frontend_input_sequence_tokens histogram
dynamo_frontend_input_sequence_tokens_bucket{dynamo_namespace="dynamo",model="llama-3.1-8b",le="1024"} 1
dynamo_frontend_input_sequence_tokens_bucket{dynamo_namespace="dynamo",model="llama-3.1-8b",le="+Inf"} 4
dynamo_frontend_input_sequence_tokens_sum{dynamo_namespace="dynamo",model="llama-3.1-8b"} 12000
dynamo_frontend_input_sequence_tokens_count{dynamo_namespace="dynamo",model="llama-3.1-8b"} 4
# HELP dynamo_frontend_requests_total Total LLM requests processed
# TYPE dynamo_frontend_requests_total counter
dynamo_frontend_requests_total{dynamo_namespace="dynamo",model="llama-3.1-8b",request_type="stream",\
status="success"} 4
# HELP dynamo_frontend_inflight_requests Inflight requests
# TYPE dynamo_frontend_inflight_requests gauge
dynamo_frontend_inflight_requests{dynamo_namespace="dynamo",model="llama-3.1-8b"} 2
"""

# What prometheus_client publishes: _total counters with _created samples.
PYTHON_TEXT = """\
# HELP dynamo_frontend_requests_started_total Requests started
# TYPE dynamo_frontend_requests_started_total counter
dynamo_frontend_requests_started_total{dynamo_namespace="dynamo",model="Llama-3.1-8B"} 7.0
# HELP dynamo_frontend_requests_started_created Requests started
# TYPE dynamo_frontend_requests_started_created gauge
dynamo_frontend_requests_started_created{dynamo_namespace="dynamo",model="Llama-3.1-8B"} 1.7e+09
"""


@dataclass(frozen=True)
class ParseCase:
    name: str
    text: str
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float]


PARSE_CASES = [
    ParseCase(
        "rust-frontend",
        RUST_TEXT,
        {
            (f"{ISL}_bucket", (*LLAMA[:1], ("le", "1024"), *LLAMA[1:])): 1.0,
            (f"{ISL}_bucket", (*LLAMA[:1], ("le", "+Inf"), *LLAMA[1:])): 4.0,
            (f"{ISL}_sum", LLAMA): 12000.0,
            (f"{ISL}_count", LLAMA): 4.0,
            (TOTAL, LLAMA + (("request_type", "stream"), ("status", "success"))): 4.0,
            ("dynamo_frontend_inflight_requests", LLAMA): 2.0,
        },
    ),
    ParseCase(
        "prometheus-client",
        PYTHON_TEXT,
        {
            (STARTED, LLAMA_MIXED): 7.0,
            ("dynamo_frontend_requests_started_created", LLAMA_MIXED): 1.7e9,
        },
    ),
    ParseCase("untyped", f'{STARTED}{{model="m"}} 3\n', {(STARTED, (("model", "m"),)): 3.0}),
    ParseCase("nan-value", f"{TTFT}_sum NaN\n", {(f"{TTFT}_sum", ()): float("nan")}),
    ParseCase("empty", "", {}),
    ParseCase("only-other-metrics", "process_cpu_seconds_total 1.5\n", {}),
]


@pytest.mark.parametrize("case", PARSE_CASES, ids=lambda c: c.name)
def test_parse(case: ParseCase) -> None:
    parsed = parse_metrics(case.text)
    assert parsed.keys() == case.expected.keys()
    for key, value in case.expected.items():
        assert parsed[key] == value or (value != value and parsed[key] != parsed[key])


@pytest.mark.parametrize(
    "text",
    [
        "<!DOCTYPE html><html><body>Not Found</body></html>",
        '{"status": "success"}',
        "hello world",
        STARTED + '{model="m} 3\n',
        f"{STARTED} lots\n",
    ],
    ids=["html", "json", "words", "broken-label", "not-a-number"],
)
def test_parse_garbage_raises(text: str) -> None:
    with pytest.raises(ValueError):
        parse_metrics(text)


# --- differencing ------------------------------------------------------------------------------------

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def hist(metric: str, labels: tuple[tuple[str, str], ...], total: float, count: float) -> Samples:
    return {(f"{metric}_sum", labels): total, (f"{metric}_count", labels): count}


def traffic(labels: tuple[tuple[str, str], ...], n: float, scale: float = 1.0) -> Samples:
    """Cumulative values after `n` requests of ISL 3000, OSL 150, TTFT 0.25 s, ITL 1/32 s (×149
    tokens each), duration 3.25 s; `scale` multiplies the sums (other lengths/latencies). Binary
    fractions, so that every sum and difference is exact."""
    return (
        hist(TTFT, labels, 0.25 * n * scale, n)
        | hist(ITL, labels, 0.03125 * 149 * n * scale, 149 * n)
        | hist(ISL, labels, 3000 * n * scale, n)
        | hist(OSL, labels, 150 * n * scale, n)
        | hist(DURATION, labels, 3.25 * n * scale, n)
        | {(STARTED, labels): n}
    )


def reset_note(metric: str) -> str:
    series = '{dynamo_namespace="dynamo",model="llama-3.1-8b"}'
    return f"{metric}{series} was reset (frontend restart?): counted from 0"


@dataclass(frozen=True)
class DiffCase:
    name: str
    why: str
    prev: Samples
    cur: Samples
    num_req: float | None
    isl: tuple[float | None, float | None]  # (Δsum, Δcount) of the ISL histogram
    model_name: str | None = "Llama-3.1-8B"
    notes: tuple[str, ...] = ()
    ttft: tuple[float | None, float | None] | None = None  # checked when given


DIFF_CASES = [
    DiffCase(
        "plain-increase",
        "Δ of each counter between scrapes",
        traffic(LLAMA, 10),
        traffic(LLAMA, 14),
        4.0,
        (12000.0, 4.0),
        ttft=(1.0, 4.0),
    ),
    DiffCase(
        "case-insensitive-model",
        "the frontend lower-cases model names; the configured one is mixed case",
        traffic(LLAMA, 1),
        traffic(LLAMA, 3),
        2.0,
        (6000.0, 2.0),
        model_name="LLAMA-3.1-8b",
    ),
    DiffCase(
        "other-model-ignored",
        "another model's traffic on the same frontend is not counted",
        traffic(LLAMA, 10) | traffic(QWEN, 100),
        traffic(LLAMA, 12) | traffic(QWEN, 200),
        2.0,
        (6000.0, 2.0),
    ),
    DiffCase(
        "all-models",
        "without a configured model every series counts",
        traffic(LLAMA, 10) | traffic(QWEN, 100),
        traffic(LLAMA, 12) | traffic(QWEN, 200),
        102.0,
        (306000.0, 102.0),
        model_name=None,
    ),
    DiffCase(
        "series-without-model-label",
        "with a configured model, a series without a model label is someone else's",
        traffic(LLAMA, 1) | traffic(NO_MODEL, 1),
        traffic(LLAMA, 2) | traffic(NO_MODEL, 50),
        1.0,
        (3000.0, 1.0),
    ),
    DiffCase(
        "two-namespaces-summed",
        "the same model in two namespaces: Σ Δsum and Σ Δcount (a request-weighted mean)",
        traffic(LLAMA, 0) | traffic(LLAMA_OTHER_NS, 0),
        traffic(LLAMA, 2) | traffic(LLAMA_OTHER_NS, 2, scale=2.0),
        4.0,
        (18000.0, 4.0),
    ),
    DiffCase(
        "new-series",
        "a series absent from the previous scrape (the model's first request) counts from 0",
        {},
        traffic(LLAMA, 3),
        3.0,
        (9000.0, 3.0),
    ),
    DiffCase(
        "counter-reset",
        "a counter that went down: the frontend restarted; its new value is the increase since",
        traffic(LLAMA, 100),
        traffic(LLAMA, 5),
        5.0,
        (15000.0, 5.0),
        notes=(
            reset_note(STARTED),
            reset_note(ISL),
        ),
    ),
    DiffCase(
        "reset-seen-by-created",
        "a restart that served more than before: only the changed _created time shows it",
        traffic(LLAMA, 5)
        | {("dynamo_frontend_requests_started_created", LLAMA): 1000.0, (f"{ISL}_created", LLAMA): 1000.0},
        traffic(LLAMA, 8)
        | {("dynamo_frontend_requests_started_created", LLAMA): 2000.0, (f"{ISL}_created", LLAMA): 2000.0},
        8.0,
        (24000.0, 8.0),
        notes=(reset_note(STARTED),),
    ),
    DiffCase(
        "histogram-sum-went-down",
        "a histogram is reset as a whole when its _sum or _count goes down",
        hist(ISL, LLAMA, 50000.0, 10.0) | {(STARTED, LLAMA): 10.0},
        hist(ISL, LLAMA, 9000.0, 12.0) | {(STARTED, LLAMA): 12.0},
        2.0,
        (9000.0, 12.0),
    ),
    DiffCase(
        "idle",
        "nothing changed: a count of 0, not unknown",
        traffic(LLAMA, 7),
        traffic(LLAMA, 7),
        0.0,
        (0.0, 0.0),
    ),
    DiffCase(
        "fallback-requests-total",
        "no requests_started_total (older frontend): requests_total, every status",
        {
            (TOTAL, LLAMA + (("status", "success"),)): 10.0,
            (TOTAL, LLAMA + (("status", "error"),)): 1.0,
        },
        {
            (TOTAL, LLAMA + (("status", "success"),)): 13.0,
            (TOTAL, LLAMA + (("status", "error"),)): 2.0,
        },
        4.0,
        (None, None),
        notes=(f"no series of this model in {STARTED}",),
    ),
    DiffCase(
        "nothing-of-this-model",
        "no series of the model at all: unknown, never zero",
        traffic(QWEN, 1),
        traffic(QWEN, 5),
        None,
        (None, None),
        notes=(f"no series of this model in {STARTED}", f"no series of this model in {TOTAL}"),
    ),
    DiffCase(
        "nan-counter",
        "a NaN counter value is skipped, and alone it is unknown",
        {(STARTED, LLAMA): 1.0},
        {(STARTED, LLAMA): float("nan")},
        None,
        (None, None),
    ),
]


@pytest.mark.parametrize("case", DIFF_CASES, ids=lambda c: c.name)
def test_difference(case: DiffCase) -> None:
    diff = difference(case.prev, case.cur, case.model_name)
    assert diff.num_req == case.num_req, case.why
    assert diff.histograms["isl"] == case.isl, case.why
    if case.ttft is not None:
        assert diff.histograms["ttft_ms"] == case.ttft, case.why
    for note in case.notes:
        assert note in diff.notes, diff.notes


# --- the ISL histogram --------------------------------------------------------------------------------

INF = float("inf")
BOUNDS = ("128", "1024", "65536", "+Inf")


def isl_hist(labels: tuple[tuple[str, str], ...], *cumulative: float) -> Samples:
    """The ISL histogram's `_bucket` series (cumulative counts for BOUNDS), `_sum` and `_count`."""
    samples = {
        (f"{ISL}_bucket", tuple(sorted((*labels, ("le", le))))): count
        for le, count in zip(BOUNDS, cumulative, strict=True)
    }
    return samples | hist(ISL, labels, 1000.0 * cumulative[-1], cumulative[-1])


# 3 requests ≤ 128, 2 in (128, 1024], 1 above 65536.
KNOWN = ((128.0, 3.0), (1024.0, 2.0), (65536.0, 0.0), (INF, 1.0))


@dataclass(frozen=True)
class BucketCase:
    name: str
    why: str
    prev: Samples
    cur: Samples
    expected: tuple[tuple[float, float], ...]
    model_name: str | None = "Llama-3.1-8B"


BUCKET_CASES = [
    BucketCase(
        "known-increase",
        "Δ of each cumulative bucket, then per bucket, bounds as floats, +Inf last",
        isl_hist(LLAMA, 10, 12, 20, 20),
        isl_hist(LLAMA, 13, 17, 25, 26),
        KNOWN,
    ),
    BucketCase(
        "other-model-ignored",
        "another model's buckets on the same frontend are not counted",
        isl_hist(LLAMA, 10, 12, 20, 20) | isl_hist(QWEN, 0, 0, 0, 0),
        isl_hist(LLAMA, 13, 17, 25, 26) | isl_hist(QWEN, 50, 50, 50, 50),
        KNOWN,
    ),
    BucketCase(
        "two-namespaces-summed",
        "the model's series in two namespaces are summed per bound",
        isl_hist(LLAMA, 0, 0, 0, 0) | isl_hist(LLAMA_OTHER_NS, 5, 5, 5, 5),
        isl_hist(LLAMA, 2, 3, 3, 4) | isl_hist(LLAMA_OTHER_NS, 6, 7, 7, 7),
        KNOWN,
    ),
    BucketCase(
        "new-series",
        "a series absent from the previous scrape counts from 0",
        {},
        isl_hist(LLAMA, 3, 5, 5, 6),
        KNOWN,
    ),
    BucketCase(
        "reset",
        "the frontend restarted: every bucket of the series counts from 0, even one that grew",
        isl_hist(LLAMA, 1, 50, 50, 50),
        isl_hist(LLAMA, 3, 5, 5, 6),
        KNOWN,
    ),
    BucketCase(
        "reset-seen-by-created",
        "a restart that served more than before: only the changed _created time shows it",
        isl_hist(LLAMA, 1, 1, 1, 1) | {(f"{ISL}_created", LLAMA): 1000.0},
        isl_hist(LLAMA, 3, 5, 5, 6) | {(f"{ISL}_created", LLAMA): 2000.0},
        KNOWN,
    ),
    BucketCase(
        "idle",
        "no request in the buckets: no histogram",
        isl_hist(LLAMA, 3, 5, 5, 6),
        isl_hist(LLAMA, 3, 5, 5, 6),
        (),
    ),
    BucketCase(
        "no-bucket-series",
        "a frontend that publishes only _sum/_count: no histogram",
        traffic(LLAMA, 1),
        traffic(LLAMA, 5),
        (),
    ),
    BucketCase(
        "no-series-of-this-model",
        "only another model's buckets: no histogram",
        isl_hist(QWEN, 0, 0, 0, 0),
        isl_hist(QWEN, 3, 5, 5, 6),
        (),
    ),
]


@pytest.mark.parametrize("case", BUCKET_CASES, ids=lambda c: c.name)
def test_isl_buckets(case: BucketCase) -> None:
    assert difference(case.prev, case.cur, case.model_name).isl_buckets == case.expected, case.why


# --- the source ---------------------------------------------------------------------------------------


def exposition(samples: Samples) -> str:
    lines = []
    for (name, labels), value in samples.items():
        label_text = ",".join(f'{k}="{v}"' for k, v in labels)
        lines.append(f"{name}{{{label_text}}} {value!r}")
    return "\n".join(lines) + "\n"


@dataclass
class FakeFrontend:
    """Serves `bodies` in turn (the last one repeats) at /metrics; a fake monotonic clock."""

    bodies: list[Callable[[httpx.Request], httpx.Response]]
    clock: Iterator[float] = field(default_factory=lambda: iter(float(t) for t in range(0, 10_000, 30)))
    seen: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        respond = self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0]
        return respond(request)

    def source(self, url: str = "http://frontend.test:8000", **kwargs: object) -> FrontendScrapeSource:
        return FrontendScrapeSource(
            url,
            model_name="llama-3.1-8b",
            client=httpx.AsyncClient(transport=httpx.MockTransport(self)),
            monotonic=lambda: next(self.clock),
            **kwargs,  # type: ignore[arg-type]
        )


def text(samples: Samples) -> Callable[[httpx.Request], httpx.Response]:
    body = exposition(samples)
    return lambda request: httpx.Response(
        200, text=body, headers={"content-type": "text/plain; version=0.0.4; charset=utf-8"}
    )


def answer(status: int, body: str, content_type: str | None) -> Callable[[httpx.Request], httpx.Response]:
    headers = {"content-type": content_type} if content_type else {}
    return lambda request: httpx.Response(status, text=body, headers=headers)


def raises(exc: Exception) -> Callable[[httpx.Request], httpx.Response]:
    def respond(request: httpx.Request) -> httpx.Response:
        raise exc

    return respond


async def test_first_observe_takes_the_baseline_and_says_so() -> None:
    fake = FakeFrontend([text(traffic(LLAMA_MIXED, 10)), text(traffic(LLAMA_MIXED, 13))])
    source = fake.source()
    with pytest.raises(SourceUnavailableError) as err:
        await source.observe(30)
    assert (err.value.source, err.value.reason) == ("frontend_scrape", FIRST_SCRAPE)
    observation = await source.observe(30)
    assert observation == TrafficObservation(30.0, 3.0, 3000.0, 150.0, 250.0, 31.25, 3.25)


async def test_check_takes_the_baseline() -> None:
    fake = FakeFrontend([text(traffic(LLAMA, 10)), text(traffic(LLAMA, 12)), text(traffic(LLAMA, 12))])
    source = fake.source()
    await source.check()
    assert (await source.observe(30)).num_req == 2.0
    idle = await source.observe(30)
    assert idle == TrafficObservation(30.0, 0.0, None, None), "a confirmed idle window"


async def test_the_isl_histogram_reaches_the_observation() -> None:
    before = traffic(LLAMA, 10) | isl_hist(LLAMA, 10, 12, 20, 20)
    after = traffic(LLAMA, 16) | isl_hist(LLAMA, 13, 17, 25, 26)
    fake = FakeFrontend([text(before), text(after), text(after)])
    source = fake.source()
    await source.check()
    observation = await source.observe(30)
    assert observation.num_req == 6.0
    assert observation.isl_buckets == KNOWN
    idle = await source.observe(30)
    assert idle == TrafficObservation(30.0, 0.0, None, None), "an idle window stays as it was"


async def test_without_the_isl_histogram_the_buckets_are_empty() -> None:
    fake = FakeFrontend([text(traffic(LLAMA, 10)), text(traffic(LLAMA, 13))])
    source = fake.source()
    await source.check()
    observation = await source.observe(30)
    assert observation == TrafficObservation(30.0, 3.0, 3000.0, 150.0, 250.0, 31.25, 3.25)
    assert observation.isl_buckets == ()


async def test_duration_is_the_time_between_scrapes_not_the_interval() -> None:
    fake = FakeFrontend([text(traffic(LLAMA, 1))])
    fake.clock = iter([100.0, 100.0 + 47.5])
    source = fake.source()
    await source.check()
    assert (await source.observe(30)).duration_s == 47.5


async def test_each_scrape_is_stamped_when_its_request_leaves() -> None:
    """An answer read late (a busy event loop) must not shorten the next window: the counters
    were rendered when the request arrived."""
    now = [100.0]
    bodies = iter([traffic(LLAMA, 10), traffic(LLAMA, 20)])
    lateness_s = iter([0.6, 0.0])  # the first answer is read 0.6 s after its request left

    def late(request: httpx.Request) -> httpx.Response:
        now[0] += next(lateness_s)
        return text(next(bodies))(request)

    source = FrontendScrapeSource(
        "http://frontend.test:8000",
        model_name="llama-3.1-8b",
        client=httpx.AsyncClient(transport=httpx.MockTransport(late)),
        monotonic=lambda: now[0],
    )
    await source.check()
    now[0] = 101.0
    observation = await source.observe(1)
    assert (observation.num_req, observation.duration_s) == (10.0, 1.0)


async def test_a_window_shorter_than_a_tenth_of_the_interval_is_no_reading() -> None:
    """The first tick right after the start-up check scrapes a fraction of a second later: no
    request in 0.03 s is no evidence of silence. The baseline stays, so the next observation
    covers the whole time since it and counts every request; the source is not failing."""
    fake = FakeFrontend([text(traffic(LLAMA, 10)), text(traffic(LLAMA, 10)), text(traffic(LLAMA, 60))])
    fake.clock = iter([100.0, 100.03, 105.03])
    source = fake.source()
    await source.check()
    with pytest.raises(WindowTooShortError) as err:
        await source.observe(5)
    assert "only 0.03 s since the last scrape" in err.value.reason
    observation = await source.observe(5)
    assert (observation.num_req, observation.duration_s) == (50.0, pytest.approx(5.03))


async def test_a_late_tick_followed_by_one_on_time_is_a_reading() -> None:
    """A tick 4 s late and the next on time leave a 1 s window of a 5 s interval: a short
    reading, but a reading."""
    fake = FakeFrontend([text(traffic(LLAMA, 10)), text(traffic(LLAMA, 14))])
    fake.clock = iter([100.0, 101.0])
    source = fake.source()
    await source.check()
    observation = await source.observe(5)
    assert (observation.num_req, observation.duration_s) == (4.0, 1.0)


async def test_a_failed_scrape_keeps_the_baseline() -> None:
    fake = FakeFrontend(
        [text(traffic(LLAMA, 10)), answer(503, "unavailable", "text/plain"), text(traffic(LLAMA, 25))]
    )
    source = fake.source()
    await source.check()
    with pytest.raises(SourceUnavailableError):
        await source.observe(30)
    observation = await source.observe(30)
    assert (observation.num_req, observation.duration_s) == (15.0, 60.0), "both intervals since the baseline"


async def test_a_restart_is_noted() -> None:
    fake = FakeFrontend([text(traffic(LLAMA, 100)), text(traffic(LLAMA, 4))])
    source = fake.source()
    await source.check()
    assert (await source.observe(30)).num_req == 4.0
    assert any("was reset (frontend restart?)" in note for note in source.last_notes)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://frontend:8000", "http://frontend:8000/metrics"),
        ("http://frontend:8000/", "http://frontend:8000/metrics"),
        ("http://frontend:8000/metrics", "http://frontend:8000/metrics"),
        ("http://gw/frontend/metrics/", "http://gw/frontend/metrics"),
    ],
)
def test_url(url: str, expected: str) -> None:
    assert FrontendScrapeSource(url).url == expected


async def test_asks_for_the_classic_text_format() -> None:
    fake = FakeFrontend([text({})])
    await fake.source().check()
    assert fake.seen[0].headers["accept"] == "text/plain;version=0.0.4"
    assert fake.seen[0].url.path == "/metrics"


@dataclass(frozen=True)
class GarbageCase:
    name: str
    respond: Callable[[httpx.Request], httpx.Response]
    reason: tuple[str, ...]


HTML = "<!DOCTYPE html><html><head><title>Sign in</title></head></html>"
GARBAGE_CASES = [
    GarbageCase("html-page", answer(200, HTML, "text/html"), ("HTTP 200 with an HTML page", "Sign in")),
    GarbageCase(
        "html-as-text", answer(200, HTML, "text/plain"), ("not Prometheus text format", "invalid metric name")
    ),
    GarbageCase(
        "json", answer(200, '{"models": []}', "application/json"), ("with JSON, not Prometheus text",)
    ),
    GarbageCase("words", answer(200, "hello world", None), ("not Prometheus text format", "hello world")),
    GarbageCase(
        "not-found", answer(404, "404 page not found", "text/plain"), ("HTTP 404", "404 page not found")
    ),
    GarbageCase(
        "refused",
        raises(httpx.ConnectError("All connection attempts failed")),
        ("cannot connect to http://frontend.test:8000/metrics", "ConnectError"),
    ),
    GarbageCase("timeout", raises(httpx.ReadTimeout("timed out")), ("no answer within 10 s", "ReadTimeout")),
]


@pytest.mark.parametrize("case", GARBAGE_CASES, ids=lambda c: c.name)
async def test_garbage_is_a_clear_reason(case: GarbageCase) -> None:
    source = FakeFrontend([case.respond]).source()
    for call in (source.check, lambda: source.observe(30)):
        with pytest.raises(SourceUnavailableError) as err:
            await call()
        assert err.value.source == "frontend_scrape"
        for fragment in case.reason:
            assert fragment in err.value.reason, err.value.reason
