"""Traffic from Prometheus: the frontend PromQL of Dynamo's planner (reference notes §1.1).

Queries, over a window W = `f"{int(interval_s)}s"` and a selector S built from the configured
label filters (`{dynamo_namespace="ns",job="frontend"}`):

- each histogram H (TTFT, ITL, ISL, OSL, request duration) as the two halves of the reference's
  `sum by (model, dynamo_namespace) (increase(H_sum[W])) / sum by (model, dynamo_namespace)
  (increase(H_count[W]))`, i.e. `sum by (model, dynamo_namespace) (increase(H_sum{S}[W]))` and the
  same for `H_count`. The division happens here, after summing the series whose `model` matches
  (case-insensitively: the frontend lower-cases names, PromQL cannot compare without case). For
  one matching series this is the reference's ratio exactly; for several (the same model under two
  spellings, or several namespaces without a namespace filter) it is Σ sum / Σ count, the request-
  weighted mean, where a ratio per series would need averaging. It also shows an idle window as a
  count of 0 rather than a NaN.
- the request count: `increase(dynamo_frontend_requests_started_total{S}[W])`, summed over the
  matching series (non-finite values skipped); if no series matches,
  `increase(dynamo_frontend_requests_total{S}[W])`; if still none, None (unknown, not zero).

- the ISL histogram: `sum by (model, dynamo_namespace, le) (increase(
  dynamo_frontend_input_sequence_tokens_bucket{S}[W]))`, the series of the matching model summed
  per `le` (non-finite values skipped) and made per-bucket (`traffic_common.per_bucket_counts`). The
  model stays in the grouping for the same reason as above: PromQL cannot match it without case,
  and another model's requests on the same frontend are not this deployment's. If this query
  fails or answers nothing, `isl_buckets` is empty and the observation otherwise unchanged.

- the gauges (`dynamo_frontend_queued_requests`, `dynamo_frontend_inflight_requests`): their
  latest value, `sum by (model, dynamo_namespace) (G{S})`, summed over the matching series; None
  when no series matches or the query fails (like the ISL histogram, never a failed observation).

TTFT and ITL come in seconds and are reported in ms. All queries of one observation are evaluated
at one instant (`time=`), the caller's `at` or this host's clock, so the halves of a ratio cannot
straddle a scrape. A count of exactly 0 is a confirmed idle window: num_req 0 and every mean None
(`app.sources.traffic_common.build_observation`). `duration_s` is the window actually queried.

Prometheus down, a timeout, an answer that is not the Prometheus API (HTML, not JSON, wrong
shape) or `status: error` raise `SourceUnavailableError("prometheus", reason)`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import httpx

from app.core.errors import SourceUnavailableError
from app.core.types import TrafficObservation
from app.sources.traffic_common import (
    GAUGES,
    HISTOGRAMS,
    INPUT_SEQUENCE_TOKENS,
    REQUEST_COUNTERS,
    HttpSource,
    build_observation,
    describe_http_error,
    model_matches,
    parse_le,
    per_bucket_counts,
    snippet,
)

log = logging.getLogger(__name__)

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_GROUP_BY = "model, dynamo_namespace"

# One vector element: the series' labels and its value.
Series = tuple[dict[str, str], float]


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def selector(labels: Mapping[str, str]) -> str:
    """`{a="x",b="y"}` for the label filters (in the given order), `""` without any."""
    for name in labels:
        if not _LABEL_NAME.match(name):
            raise ValueError(f"not a Prometheus label name: {name!r}")
    if not labels:
        return ""
    return "{" + ",".join(f"{name}={promql_string(value)}" for name, value in labels.items()) + "}"


def window(interval_s: float) -> str:
    """The range of the queries: whole seconds of the interval, as Dynamo formats it."""
    if not (isinstance(interval_s, int | float) and math.isfinite(interval_s)) or int(interval_s) < 1:
        raise ValueError(f"interval_s must be at least 1 s, got {interval_s!r}")
    return f"{int(interval_s)}s"


@dataclass(frozen=True)
class FrontendQueries:
    """The PromQL of one observation: `(sum query, count query)` per observation field, the
    request-count queries, preferred first, and the ISL histogram's buckets query."""

    histograms: dict[str, tuple[str, str]]
    request_counts: tuple[str, ...]
    isl_buckets: str
    gauges: dict[str, str] = dataclasses.field(default_factory=dict)


def frontend_queries(interval_s: float, labels: Mapping[str, str] | None = None) -> FrontendQueries:
    w = window(interval_s)
    sel = selector(labels or {})

    def increase(metric: str) -> str:
        return f"increase({metric}{sel}[{w}])"

    return FrontendQueries(
        histograms={
            field: (
                f"sum by ({_GROUP_BY}) ({increase(metric + '_sum')})",
                f"sum by ({_GROUP_BY}) ({increase(metric + '_count')})",
            )
            for field, (metric, _) in HISTOGRAMS.items()
        },
        request_counts=tuple(increase(counter) for counter in REQUEST_COUNTERS),
        isl_buckets=f"sum by ({_GROUP_BY}, le) ({increase(INPUT_SEQUENCE_TOKENS + '_bucket')})",
        gauges={field: f"sum by ({_GROUP_BY}) ({metric}{sel})" for field, metric in GAUGES.items()},
    )


class PrometheusSource(HttpSource):
    """Traffic observations from Prometheus' `/api/v1/query` (see the module docstring)."""

    name = "prometheus"

    def __init__(
        self,
        url: str,
        *,
        labels: Mapping[str, str] | None = None,
        model_name: str | None = None,
        timeout_s: float = 10.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.endpoint = f"{self.url}/api/v1/query"
        self.labels = dict(labels or {})
        selector(self.labels)  # a bad label name is a configuration error, found now
        self.model_name = model_name
        self.timeout_s = timeout_s
        self._client = client
        # What the last observation had to work around (fallback counter, skipped values).
        self.last_notes: tuple[str, ...] = ()

    def queries(self, interval_s: float) -> FrontendQueries:
        return frontend_queries(interval_s, self.labels)

    async def check(self) -> None:
        """Prometheus answers a query through its API (`vector(1)`)."""
        async with self._session() as client:
            await self._query(client, "vector(1)", at=time.time())

    async def observe(self, interval_s: float, *, at: float | None = None) -> TrafficObservation:
        """What the frontend served over the `interval_s` window ending at `at` (Unix seconds;
        default: now)."""
        queries = self.queries(interval_s)
        at = time.time() if at is None else at
        notes: list[str] = []
        async with self._session() as client:
            halves = [(field, q) for field, pair in queries.histograms.items() for q in pair]
            gauge_fields = list(queries.gauges)
            *answers, bucket_answer = await asyncio.gather(
                self._query(client, queries.request_counts[0], at=at),
                *(self._query(client, q, at=at) for _, q in halves),
                *(self._query(client, queries.gauges[g], at=at) for g in gauge_fields),
                self._query(client, queries.isl_buckets, at=at),
                return_exceptions=True,
            )
            gauge_answers = answers[len(answers) - len(gauge_fields) :]
            answers = answers[: len(answers) - len(gauge_fields)]
            for answer in gauge_answers:
                if isinstance(answer, BaseException) and not isinstance(answer, Exception):
                    raise answer
            for answer in answers:
                if isinstance(answer, BaseException):
                    raise answer
            if isinstance(bucket_answer, BaseException) and not isinstance(bucket_answer, Exception):
                raise bucket_answer
            results = cast(list[list[Series]], answers)
            num_req = self._sum_matching(results[0], queries.request_counts[0], notes)
            for previous, fallback in zip(queries.request_counts, queries.request_counts[1:], strict=False):
                if num_req is not None:
                    break
                notes.append(f"no series of this model in {previous}; trying {fallback}")
                num_req = self._sum_matching(await self._query(client, fallback, at=at), fallback, notes)
        totals = [self._sum_matching(a, q, notes) for (_, q), a in zip(halves, results[1:], strict=True)]
        histograms = {field: (totals[2 * i], totals[2 * i + 1]) for i, field in enumerate(queries.histograms)}
        if isinstance(bucket_answer, Exception):
            notes.append(f"no ISL histogram: {bucket_answer}")
            isl_buckets: tuple[tuple[float, float], ...] = ()
        else:
            isl_buckets = self._isl_buckets(bucket_answer, queries.isl_buckets, notes)
        gauges: dict[str, float | None] = {}
        for g, answer in zip(gauge_fields, gauge_answers, strict=True):
            if isinstance(answer, Exception):
                notes.append(f"no {g}: {answer}")
                gauges[g] = None
            else:
                gauges[g] = self._sum_matching(answer, queries.gauges[g], notes)
        self.last_notes = tuple(notes)
        for note in notes:
            log.debug("prometheus %s: %s", self.url, note)
        return build_observation(float(int(interval_s)), num_req, histograms, isl_buckets, gauges=gauges)

    # --- results --------------------------------------------------------------------------------

    def _matching(self, series: list[Series], query: str, notes: list[str]) -> list[float] | None:
        """The finite values of the series of this model; None when no series matched."""
        values = [v for labels, v in series if model_matches(labels, self.model_name)]
        if not values:
            return None
        kept = [v for v in values if math.isfinite(v)]
        if len(kept) < len(values):
            notes.append(f"skipped {len(values) - len(kept)} non-finite value(s) of {query}")
        return kept

    def _isl_buckets(
        self, series: list[Series], query: str, notes: list[str]
    ) -> tuple[tuple[float, float], ...]:
        """Σ of this model's finite bucket increases per `le`, made per-bucket; () without any."""
        cumulative: dict[float, float] = {}
        skipped = 0
        for labels, value in series:
            bound = parse_le(labels.get("le"))
            if bound is None or not model_matches(labels, self.model_name):
                continue
            if not math.isfinite(value):
                skipped += 1
                continue
            cumulative[bound] = cumulative.get(bound, 0.0) + value
        if skipped:
            notes.append(f"skipped {skipped} non-finite value(s) of {query}")
        return per_bucket_counts(cumulative)

    def _sum_matching(self, series: list[Series], query: str, notes: list[str]) -> float | None:
        """Σ of the finite values of this model's series; None (unknown) when there are none."""
        values = self._matching(series, query, notes)
        return math.fsum(values) if values else None

    # --- HTTP -----------------------------------------------------------------------------------

    async def _query(self, client: httpx.AsyncClient, promql: str, *, at: float) -> list[Series]:
        params = {
            "query": promql,
            "time": f"{at:.3f}",
            "timeout": f"{max(1, int(self.timeout_s * 1000))}ms",
        }
        try:
            resp = await client.get(self.endpoint, params=params, timeout=self.timeout_s)
        except httpx.TimeoutException as exc:
            raise self._fail(
                f"{self.endpoint}: no answer within {self.timeout_s:g} s ({describe_http_error(exc)})"
            ) from exc
        except httpx.ConnectError as exc:
            raise self._fail(f"cannot connect to {self.endpoint}: {describe_http_error(exc)}") from exc
        except httpx.HTTPError as exc:
            raise self._fail(f"{self.endpoint}: {describe_http_error(exc)}") from exc
        body = self._api_body(resp)
        if body["status"] == "error":
            raise self._fail(
                f"query {promql!r} failed (HTTP {resp.status_code}, {body.get('errorType', 'no errorType')}):"
                f" {body.get('error', 'no error message')}"
            )
        if resp.status_code != 200:
            raise self._fail(f"{self.endpoint} answered HTTP {resp.status_code}: {snippet(resp.text)!r}")
        for warning in body.get("warnings") or ():
            log.warning("prometheus %s: query %r: %s", self.url, promql, warning)
        return self._parse_data(body.get("data"), promql)

    def _api_body(self, resp: httpx.Response) -> dict[str, Any]:
        """The JSON envelope, or a reason why this is not Prometheus' API answering."""
        content_type = resp.headers.get("content-type", "")
        what = f"{self.endpoint} answered HTTP {resp.status_code}"
        try:
            body = resp.json()
        except ValueError:
            text = resp.text
            if "html" in content_type.lower() or text.lstrip().startswith("<"):
                kind = "an HTML page, not the Prometheus API (is the URL right?)"
            elif not text.strip():
                kind = "an empty body, not JSON"
            else:
                kind = f"a body that is not JSON ({content_type or 'no content type'})"
            raise self._fail(f"{what} with {kind}: {snippet(text)!r}") from None
        if not isinstance(body, dict) or body.get("status") not in ("success", "error"):
            raise self._fail(
                f"{what} with JSON that is not a Prometheus API response: {snippet(resp.text)!r}"
            )
        return body

    def _parse_data(self, data: Any, promql: str) -> list[Series]:
        def garbage(why: str) -> SourceUnavailableError:
            return self._fail(f"query {promql!r}: malformed answer: {why}")

        if not isinstance(data, dict):
            raise garbage(f"'data' is {type(data).__name__}, not an object")
        if data.get("resultType") != "vector":
            raise garbage(f"resultType {data.get('resultType')!r}, expected 'vector'")
        result = data.get("result")
        if not isinstance(result, list):
            raise garbage(f"'result' is {type(result).__name__}, not a list")
        series: list[Series] = []
        for item in result:
            if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
                raise garbage(f"a result element without a 'metric' object: {snippet(repr(item))}")
            labels = item["metric"]
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
                raise garbage(f"labels that are not strings: {snippet(repr(labels))}")
            series.append((labels, _sample_value(item.get("value"), garbage)))
        return series


def _sample_value(pair: Any, garbage: Any) -> float:
    """The value of a `[timestamp, "value"]` pair; Prometheus writes NaN and ±Inf as strings."""
    if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], str)):
        raise garbage(f'a sample that is not [timestamp, "value"]: {snippet(repr(pair))}')
    try:
        return float(pair[1])
    except ValueError:
        raise garbage(f"sample value {pair[1]!r} is not a number") from None
