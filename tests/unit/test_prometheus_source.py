"""PrometheusSource without a server: the PromQL it sends, how it reads Prometheus' answers (a
fake `/api/v1/query` on httpx.MockTransport), and the reasons it gives for garbage. Also the
choice of source per deployment (`make_traffic_source`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import pytest

from app.config import DeploymentConfig
from app.core.errors import SourceUnavailableError
from app.core.types import TrafficObservation
from app.sources.frontend_scrape import FrontendScrapeSource
from app.sources.prometheus import PrometheusSource, frontend_queries, selector, window
from app.sources.traffic import TrafficSource, make_traffic_source
from tests.support import demo_config

pytestmark = pytest.mark.anyio

URL = "http://prometheus.test:9090"
TTFT = "dynamo_frontend_time_to_first_token_seconds"
ITL = "dynamo_frontend_inter_token_latency_seconds"
ISL = "dynamo_frontend_input_sequence_tokens"
OSL = "dynamo_frontend_output_sequence_tokens"
DURATION = "dynamo_frontend_request_duration_seconds"
STARTED = "dynamo_frontend_requests_started_total"
TOTAL = "dynamo_frontend_requests_total"
PROD = '{dynamo_namespace="dynamo-prod",job="frontend"}'


# --- the PromQL ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueryCase:
    name: str
    why: str
    interval_s: float
    labels: dict[str, str]
    ttft_sum: str
    ttft_count: str
    started: str
    total: str


QUERY_CASES = [
    QueryCase(
        "no-labels",
        "without filters the selector is empty; the window is the interval in whole seconds",
        180,
        {},
        f"sum by (model, dynamo_namespace) (increase({TTFT}_sum[180s]))",
        f"sum by (model, dynamo_namespace) (increase({TTFT}_count[180s]))",
        f"increase({STARTED}[180s])",
        f"increase({TOTAL}[180s])",
    ),
    QueryCase(
        "namespace-filter",
        "label filters go into every selector, in the configured order",
        60.9,
        {"dynamo_namespace": "dynamo-prod", "job": "frontend"},
        f"sum by (model, dynamo_namespace) (increase({TTFT}_sum{PROD}[60s]))",
        f"sum by (model, dynamo_namespace) (increase({TTFT}_count{PROD}[60s]))",
        f"increase({STARTED}{PROD}[60s])",
        f"increase({TOTAL}{PROD}[60s])",
    ),
    QueryCase(
        "escaped-value",
        "quotes, backslashes and newlines in a value are escaped as PromQL string literals",
        5,
        {"cluster": 'a"b\\c\nd'},
        f'sum by (model, dynamo_namespace) (increase({TTFT}_sum{{cluster="a\\"b\\\\c\\nd"}}[5s]))',
        f'sum by (model, dynamo_namespace) (increase({TTFT}_count{{cluster="a\\"b\\\\c\\nd"}}[5s]))',
        f'increase({STARTED}{{cluster="a\\"b\\\\c\\nd"}}[5s])',
        f'increase({TOTAL}{{cluster="a\\"b\\\\c\\nd"}}[5s])',
    ),
]


@pytest.mark.parametrize("case", QUERY_CASES, ids=lambda c: c.name)
def test_promql(case: QueryCase) -> None:
    queries = frontend_queries(case.interval_s, case.labels)
    assert queries.histograms["ttft_ms"] == (case.ttft_sum, case.ttft_count), case.why
    assert queries.request_counts == (case.started, case.total), case.why


def test_promql_covers_every_histogram_and_field() -> None:
    queries = frontend_queries(180, {"dynamo_namespace": "ns"})
    metrics = {
        field: pair[0].split("(increase(")[1].split("_sum{")[0] for field, pair in queries.histograms.items()
    }
    assert metrics == {"ttft_ms": TTFT, "itl_ms": ITL, "isl": ISL, "osl": OSL, "request_duration_s": DURATION}


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({}, f"sum by (model, dynamo_namespace, le) (increase({ISL}_bucket[180s]))"),
        (
            {"dynamo_namespace": "dynamo-prod", "job": "frontend"},
            f"sum by (model, dynamo_namespace, le) (increase({ISL}_bucket{PROD}[180s]))",
        ),
    ],
    ids=["no-labels", "namespace-filter"],
)
def test_promql_of_the_isl_buckets(labels: dict[str, str], expected: str) -> None:
    """Grouped by model too: another model's requests are not this deployment's (matched here)."""
    assert frontend_queries(180.4, labels).isl_buckets == expected


def test_the_model_is_not_filtered_in_promql() -> None:
    """PromQL cannot compare case-insensitively: the model is matched on the results."""
    source = PrometheusSource(URL, labels={}, model_name="Llama-3.1-8B")
    assert all("model=" not in q for pair in source.queries(180).histograms.values() for q in pair)


@pytest.mark.parametrize(
    ("labels", "message"),
    [({"bad-name": "x"}, "not a Prometheus label name: 'bad-name'"), ({"1st": "x"}, "'1st'")],
)
def test_a_bad_label_name_is_refused_at_construction(labels: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrometheusSource(URL, labels=labels, model_name=None)


@pytest.mark.parametrize("interval_s", [0, 0.5, -10, float("nan"), float("inf")])
def test_a_window_shorter_than_a_second_is_refused(interval_s: float) -> None:
    with pytest.raises(ValueError, match="interval_s must be at least 1 s"):
        window(interval_s)


def test_selector_without_labels_is_empty() -> None:
    assert selector({}) == ""


# --- a fake Prometheus --------------------------------------------------------------------------------


def vector(*series: tuple[dict[str, str], str]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": labels, "value": [1700000000.0, value]} for labels, value in series],
        },
    }


@dataclass
class FakePrometheus:
    """Answers `/api/v1/query` from `answers` (query → vector series); other queries: empty."""

    answers: dict[str, list[tuple[dict[str, str], str]]] = field(default_factory=dict)
    seen: list[httpx.Request] = field(default_factory=list)
    respond: Callable[[httpx.Request], httpx.Response] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if self.respond is not None:
            return self.respond(request)
        assert request.url.path.endswith("/api/v1/query")
        query = request.url.params["query"]
        return httpx.Response(200, json=vector(*self.answers.get(query, [])))

    def source(self, **kwargs: Any) -> PrometheusSource:
        kwargs.setdefault("labels", {})
        kwargs.setdefault("model_name", "llama-3.1-8b")
        return PrometheusSource(URL, client=httpx.AsyncClient(transport=httpx.MockTransport(self)), **kwargs)

    @property
    def queries(self) -> list[str]:
        return [r.url.params["query"] for r in self.seen]


LLAMA = {"model": "Llama-3.1-8B", "dynamo_namespace": "dynamo"}
LLAMA_LOWER = {"model": "llama-3.1-8b", "dynamo_namespace": "dynamo"}
QWEN = {"model": "Qwen3-0.6B", "dynamo_namespace": "dynamo"}


def histogram_answers(metric: str, *series: tuple[dict[str, str], str, str]) -> dict[str, list[Any]]:
    """Answers for both halves of one histogram: (labels, sum increase, count increase) per series."""
    q = frontend_queries(180, {})
    field = next(f for f, pair in q.histograms.items() if f"({metric}_sum[" in pair[0])
    sum_q, count_q = q.histograms[field]
    return {
        sum_q: [(labels, s) for labels, s, _ in series],
        count_q: [(labels, c) for labels, _, c in series],
    }


def counter_answer(metric: str, *series: tuple[dict[str, str], str]) -> dict[str, list[Any]]:
    return {f"increase({metric}[180s])": list(series)}


def full_traffic(labels: dict[str, str], n: str = "10") -> dict[str, list[Any]]:
    """One series per histogram: 10 requests, TTFT 0.25 s, ITL 0.02 s, ISL 3000, OSL 150, 2.5 s."""
    answers: dict[str, list[Any]] = {}
    for metric, total, count in [
        (TTFT, "2.5", n),
        (ITL, "29.8", "1490"),
        (ISL, "30000", n),
        (OSL, "1500", n),
        (DURATION, "25", n),
    ]:
        answers |= histogram_answers(metric, (labels, total, count))
    return answers | counter_answer(STARTED, (labels | {"instance": "f:8000", "job": "frontend"}, n))


@dataclass(frozen=True)
class ReadCase:
    name: str
    why: str
    answers: dict[str, list[Any]]
    expected: TrafficObservation
    model_name: str | None = "llama-3.1-8b"
    note: str | None = None


FULL = TrafficObservation(180.0, 10.0, 3000.0, 150.0, 250.0, 20.0, 2.5)

READ_CASES = [
    ReadCase("one-series", "the reference case: one matching series", full_traffic(LLAMA), FULL),
    ReadCase(
        "model-case-insensitive",
        "the frontend lower-cases model names; the configured name may not be",
        full_traffic(LLAMA_LOWER),
        FULL,
        model_name="LLAMA-3.1-8B",
    ),
    ReadCase(
        "other-model-ignored",
        "another model's series on the same frontend is not this deployment's traffic",
        full_traffic(LLAMA)
        | histogram_answers(ISL, (LLAMA, "30000", "10"), (QWEN, "1", "1"))
        | counter_answer(STARTED, (LLAMA, "10"), (QWEN, "99")),
        FULL,
    ),
    ReadCase(
        "two-spellings-weighted",
        "several matching series combine as Σ sum / Σ count (request-weighted), not a mean of means",
        full_traffic(LLAMA)
        | histogram_answers(ISL, (LLAMA, "30000", "10"), (LLAMA_LOWER, "1000", "10"))
        | counter_answer(STARTED, (LLAMA, "10"), (LLAMA_LOWER, "10")),
        TrafficObservation(180.0, 20.0, 1550.0, 150.0, 250.0, 20.0, 2.5),
    ),
    ReadCase(
        "all-models",
        "without a configured model every series counts",
        full_traffic(LLAMA) | counter_answer(STARTED, (LLAMA, "10"), (QWEN, "5"), ({}, "1")),
        TrafficObservation(180.0, 16.0, 3000.0, 150.0, 250.0, 20.0, 2.5),
        model_name=None,
    ),
    ReadCase(
        "idle-window",
        "a count of exactly 0 is a confirmed idle window: num_req 0, the (NaN) means None",
        {
            **{
                k: v
                for metric in (TTFT, ITL, ISL, OSL, DURATION)
                for k, v in histogram_answers(metric, (LLAMA, "0", "0")).items()
            },
            **counter_answer(STARTED, (LLAMA, "0")),
        },
        TrafficObservation(180.0, 0.0, None, None),
    ),
    ReadCase(
        "no-series",
        "no series of this model: unknown traffic, never zero",
        full_traffic(QWEN),
        TrafficObservation(180.0, None, None, None),
        note=f"no series of this model in increase({STARTED}[180s]); trying increase({TOTAL}[180s])",
    ),
    ReadCase(
        "fallback-requests-total",
        "an older frontend without requests_started_total: requests_total counts",
        {k: v for k, v in full_traffic(LLAMA).items() if STARTED not in k}
        | counter_answer(TOTAL, (LLAMA | {"status": "success"}, "8"), (LLAMA | {"status": "error"}, "2")),
        FULL,
        note=f"no series of this model in increase({STARTED}[180s]); trying increase({TOTAL}[180s])",
    ),
    ReadCase(
        "nan-skipped",
        "a NaN series is skipped; the finite ones still count",
        full_traffic(LLAMA) | counter_answer(STARTED, (LLAMA, "10"), (LLAMA_LOWER, "NaN")),
        FULL,
        note=f"skipped 1 non-finite value(s) of increase({STARTED}[180s])",
    ),
    ReadCase(
        "only-nan-is-unknown",
        "a histogram whose only series is NaN has no mean (not NaN, not 0)",
        full_traffic(LLAMA) | histogram_answers(TTFT, (LLAMA, "NaN", "NaN")),
        TrafficObservation(180.0, 10.0, 3000.0, 150.0, None, 20.0, 2.5),
    ),
    ReadCase(
        "counter-missing-histograms-known",
        "no request counter at all: num_req unknown, the means still known",
        {k: v for k, v in full_traffic(LLAMA).items() if STARTED not in k},
        TrafficObservation(180.0, None, 3000.0, 150.0, 250.0, 20.0, 2.5),
    ),
]


# --- the ISL histogram ---

INF = float("inf")
BUCKETS_Q = f"sum by (model, dynamo_namespace, le) (increase({ISL}_bucket[180s]))"
# 3 requests ≤ 128, 2 in (128, 1024], 1 above 65536.
KNOWN = ((128.0, 3.0), (1024.0, 2.0), (65536.0, 0.0), (INF, 1.0))


def bucket_answer(labels: dict[str, str], *cumulative: str) -> list[tuple[dict[str, str], str]]:
    """The buckets query's series of one model: cumulative increases for le 128 … +Inf."""
    bounds = ("128", "1024", "65536", "+Inf")
    return [(labels | {"le": le}, value) for le, value in zip(bounds, cumulative, strict=True)]


def with_buckets(
    observation: TrafficObservation, buckets: tuple[tuple[float, float], ...]
) -> TrafficObservation:
    return replace(observation, isl_buckets=buckets)


READ_CASES += [
    ReadCase(
        "isl-buckets",
        "Σ increase per le over this model's series, made per bucket; other models ignored",
        full_traffic(LLAMA)
        | {BUCKETS_Q: bucket_answer(LLAMA, "3", "5", "5", "6") + bucket_answer(QWEN, *"9999")},
        with_buckets(FULL, KNOWN),
    ),
    ReadCase(
        "isl-buckets-two-spellings",
        "the model's series are summed per le (Prometheus' extrapolated increases are fractional)",
        full_traffic(LLAMA)
        | {
            BUCKETS_Q: bucket_answer(LLAMA, "1.5", "2.5", "2.5", "3")
            + bucket_answer(LLAMA_LOWER, "1.5", "2.5", "2.5", "3")
        },
        with_buckets(FULL, KNOWN),
        model_name="LLAMA-3.1-8B",
    ),
    ReadCase(
        "isl-buckets-nan-skipped",
        "a NaN bucket series is skipped; the finite ones still count",
        full_traffic(LLAMA)
        | {BUCKETS_Q: bucket_answer(LLAMA, "3", "5", "5", "6") + bucket_answer(LLAMA_LOWER, *["NaN"] * 4)},
        with_buckets(FULL, KNOWN),
        note=f"skipped 4 non-finite value(s) of {BUCKETS_Q}",
    ),
    ReadCase(
        "isl-buckets-all-zero",
        "no request in the buckets: no histogram",
        full_traffic(LLAMA) | {BUCKETS_Q: bucket_answer(LLAMA, "0", "0", "0", "0")},
        FULL,
    ),
    ReadCase(
        "isl-buckets-of-another-model-only",
        "only another model's buckets: no histogram",
        full_traffic(LLAMA) | {BUCKETS_Q: bucket_answer(QWEN, "3", "5", "5", "6")},
        FULL,
    ),
]


@pytest.mark.parametrize("case", READ_CASES, ids=lambda c: c.name)
async def test_observe_reads_prometheus_answers(case: ReadCase) -> None:
    fake = FakePrometheus(case.answers)
    source = fake.source(model_name=case.model_name)
    observation = await source.observe(180)
    assert observation == case.expected, case.why
    if case.note is not None:
        assert case.note in source.last_notes, source.last_notes


async def test_one_evaluation_time_for_every_query() -> None:
    fake = FakePrometheus(full_traffic(LLAMA))
    await fake.source().observe(180, at=1700000123.456)
    # 5 histograms × (sum, count) + requests_started_total + ISL buckets + the 2 gauges
    assert len(fake.seen) == 14
    assert {r.url.params["time"] for r in fake.seen} == {"1700000123.456"}
    assert {r.url.params["timeout"] for r in fake.seen} == {"10000ms"}
    assert {r.url.path for r in fake.seen} == {"/api/v1/query"}


async def test_without_the_isl_histogram_the_buckets_are_empty() -> None:
    """No bucket series (FULL's answers have none): `()`, the rest as always."""
    observation = await FakePrometheus(full_traffic(LLAMA)).source().observe(180)
    assert observation == FULL
    assert observation.isl_buckets == ()


async def test_a_failing_buckets_query_does_not_fail_the_observation() -> None:
    fake = FakePrometheus(full_traffic(LLAMA))

    def respond(request: httpx.Request) -> httpx.Response:
        if request.url.params["query"] == BUCKETS_Q:
            error = {"status": "error", "errorType": "timeout", "error": "query timed out"}
            return httpx.Response(503, json=error)
        return httpx.Response(200, json=vector(*fake.answers.get(request.url.params["query"], [])))

    fake.respond = respond
    source = fake.source()
    assert await source.observe(180) == FULL
    assert any(note.startswith("no ISL histogram: prometheus: query") for note in source.last_notes), (
        source.last_notes
    )


async def test_requests_total_is_asked_only_when_started_is_missing() -> None:
    fake = FakePrometheus(full_traffic(LLAMA))
    await fake.source().observe(180)
    assert f"increase({TOTAL}[180s])" not in fake.queries
    fake = FakePrometheus(full_traffic(QWEN))
    await fake.source().observe(180)
    assert fake.queries[-1] == f"increase({TOTAL}[180s])"


async def test_label_filters_reach_the_server() -> None:
    fake = FakePrometheus()
    await fake.source(labels={"dynamo_namespace": "prod"}).observe(30)
    # Counters and histograms over the window; the gauges at the instant.
    windowed = [q for q in fake.queries if "[" in q]
    gauges = [q for q in fake.queries if "[" not in q]
    assert all('{dynamo_namespace="prod"}[30s]' in q for q in windowed), fake.queries
    assert len(gauges) == 2 and all('{dynamo_namespace="prod"})' in q for q in gauges), gauges


async def test_a_url_with_a_path_prefix_and_slash() -> None:
    fake = FakePrometheus()
    source = PrometheusSource(
        "http://proxy.test/prometheus/",
        labels={},
        model_name=None,
        client=httpx.AsyncClient(transport=httpx.MockTransport(fake)),
    )
    await source.check()
    assert str(fake.seen[0].url).startswith("http://proxy.test/prometheus/api/v1/query?")


# --- garbage and failures -----------------------------------------------------------------------------


def answer(
    status: int, body: str | bytes, content_type: str | None
) -> Callable[[httpx.Request], httpx.Response]:
    headers = {"content-type": content_type} if content_type else {}
    content = body.encode() if isinstance(body, str) else body
    return lambda request: httpx.Response(status, content=content, headers=headers)


def raises(exc: Exception) -> Callable[[httpx.Request], httpx.Response]:
    def respond(request: httpx.Request) -> httpx.Response:
        raise exc

    return respond


@dataclass(frozen=True)
class GarbageCase:
    name: str
    respond: Callable[[httpx.Request], httpx.Response]
    reason: tuple[str, ...]  # fragments the reason must contain


HTML = "<!DOCTYPE html>\n<html><head><title>Grafana</title></head><body>Login</body></html>"
GARBAGE_CASES = [
    GarbageCase(
        "html-page", answer(200, HTML, "text/html; charset=utf-8"), ("HTTP 200", "an HTML page", "Grafana")
    ),
    GarbageCase("html-without-type", answer(200, HTML, None), ("an HTML page",)),
    GarbageCase(
        "plain-text", answer(200, "hello, world", "text/plain"), ("not JSON (text/plain)", "hello, world")
    ),
    GarbageCase("empty-body", answer(200, "", "application/json"), ("an empty body",)),
    GarbageCase("binary", answer(200, b"\x00\xff\xfe", "application/octet-stream"), ("not JSON",)),
    GarbageCase(
        "json-list", answer(200, "[1, 2, 3]", "application/json"), ("not a Prometheus API response",)
    ),
    GarbageCase(
        "json-no-status",
        answer(200, '{"data": {}}', "application/json"),
        ("not a Prometheus API response",),
    ),
    GarbageCase(
        "status-error-400",
        answer(
            400,
            json.dumps({"status": "error", "errorType": "bad_data", "error": "1:5: parse error: unexpected"}),
            "application/json",
        ),
        ("query '", "failed (HTTP 400, bad_data): 1:5: parse error: unexpected"),
    ),
    GarbageCase(
        "status-error-200",
        answer(
            200, json.dumps({"status": "error", "errorType": "timeout", "error": "query timed out"}), None
        ),
        ("timeout", "query timed out"),
    ),
    GarbageCase("bad-gateway", answer(502, "Bad Gateway", "text/plain"), ("HTTP 502", "Bad Gateway")),
    GarbageCase(
        "success-but-not-200",
        answer(503, json.dumps(vector()), "application/json"),
        ("HTTP 503",),
    ),
    GarbageCase(
        "matrix-result",
        answer(200, json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}), None),
        ("malformed answer", "resultType 'matrix', expected 'vector'"),
    ),
    GarbageCase(
        "no-data",
        answer(200, json.dumps({"status": "success"}), None),
        ("malformed answer", "'data' is NoneType"),
    ),
    GarbageCase(
        "value-not-a-number",
        answer(200, json.dumps(vector(({"model": "x"}, "lots"))), None),
        ("sample value 'lots' is not a number",),
    ),
    GarbageCase(
        "element-without-metric",
        answer(
            200,
            json.dumps({"status": "success", "data": {"resultType": "vector", "result": [{"v": 1}]}}),
            None,
        ),
        ("without a 'metric' object",),
    ),
    GarbageCase(
        "value-not-a-pair",
        answer(
            200,
            json.dumps(
                {
                    "status": "success",
                    "data": {"resultType": "vector", "result": [{"metric": {}, "value": 3}]},
                }
            ),
            None,
        ),
        ('not [timestamp, "value"]',),
    ),
    GarbageCase(
        "connection-refused",
        raises(httpx.ConnectError("All connection attempts failed")),
        (
            "cannot connect to http://prometheus.test:9090/api/v1/query",
            "ConnectError",
            "All connection attempts",
        ),
    ),
    GarbageCase("timeout", raises(httpx.ReadTimeout("timed out")), ("no answer within 10 s", "ReadTimeout")),
    GarbageCase(
        "connection-dropped",
        raises(httpx.RemoteProtocolError("Server disconnected without sending a response.")),
        ("RemoteProtocolError", "Server disconnected"),
    ),
]


@pytest.mark.parametrize("case", GARBAGE_CASES, ids=lambda c: c.name)
async def test_garbage_is_a_clear_reason(case: GarbageCase) -> None:
    fake = FakePrometheus(respond=case.respond)
    source = fake.source()
    for call in (source.observe(180), source.check()):
        with pytest.raises(SourceUnavailableError) as err:
            await call
        assert err.value.source == "prometheus"
        for fragment in case.reason:
            assert fragment in err.value.reason, err.value.reason
        assert str(err.value) == f"prometheus: {err.value.reason}"


async def test_check_passes_against_a_working_api() -> None:
    fake = FakePrometheus()
    await fake.source().check()
    assert fake.queries == ["vector(1)"]


async def test_an_unreachable_server_without_injected_client() -> None:
    """The source's own client: a refused connection names the underlying OS error."""
    source = PrometheusSource("http://127.0.0.1:9", labels={}, model_name=None, timeout_s=5)
    with pytest.raises(SourceUnavailableError) as err:
        await source.observe(60)
    assert "cannot connect to http://127.0.0.1:9/api/v1/query" in err.value.reason
    assert "ConnectionRefusedError" in err.value.reason or "Connection refused" in err.value.reason


# --- which source for a deployment --------------------------------------------------------------------


def deployment(**overrides: Any) -> DeploymentConfig:
    return DeploymentConfig.model_validate(demo_config(**overrides)["deployments"][0])


def test_prometheus_when_configured() -> None:
    client = httpx.AsyncClient()
    source = make_traffic_source(
        deployment(
            model_name="Llama-3.1-8B",
            sources={
                "prometheus": {"url": "http://prom:9090/", "labels": {"dynamo_namespace": "prod"}},
                "frontend_url": "http://frontend:8000",
            },
        ),
        client=client,
    )
    assert isinstance(source, PrometheusSource)
    assert isinstance(source, TrafficSource)
    assert (source.url, source.labels, source.model_name) == (
        "http://prom:9090",
        {"dynamo_namespace": "prod"},
        "Llama-3.1-8B",
    )
    assert source._client is client


def test_direct_scrape_without_prometheus() -> None:
    source = make_traffic_source(deployment(model_name="m", sources={"frontend_url": "http://frontend:8000"}))
    assert isinstance(source, FrontendScrapeSource)
    assert isinstance(source, TrafficSource)
    assert (source.url, source.model_name) == ("http://frontend:8000/metrics", "m")


def test_no_source_configured() -> None:
    assert make_traffic_source(deployment()) is None
