"""What the two traffic adapters share: the Dynamo frontend metrics they read and their rules.

`PrometheusSource` (`app/sources/prometheus.py`) and `FrontendScrapeSource`
(`app/sources/frontend_scrape.py`) implement the `TrafficSource` port (`app/sources/traffic.py`).
Both read the same Dynamo frontend metrics (names below) and follow the same rules:

- a field the source cannot know is None, never 0: "no series for this model" is unknown traffic,
  not zero traffic;
- an interval whose request count is exactly 0 is a *confirmed idle* window: `num_req` is 0 and
  the means (0/0, NaN in PromQL) are None, not NaN and not 0, because an idle window says nothing
  about request lengths or latencies (the reference E4 writes 0 there; None keeps "no data"
  distinguishable from "zero-length requests" and is what `TrafficObservation.complete` checks);
- a source that is down, times out or answers garbage raises `SourceUnavailableError` with a
  reason that names what was wrong;
- the ISL histogram of the interval (`TrafficObservation.isl_buckets`) comes from the increases
  of the cumulative `dynamo_frontend_input_sequence_tokens_bucket` series per `le` bound, summed
  over the model's series and made per-bucket (`per_bucket_counts`); empty when there are no bucket
  series or no request in them. It never makes an observation fail.

Kept apart from the port so that the adapters need not import the module that builds them.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import httpx

from app.core.errors import SourceUnavailableError
from app.core.types import TrafficObservation

# Dynamo frontend metric names (lib/runtime/src/metrics/prometheus_names.rs, prefix dynamo_frontend_).
TTFT_SECONDS = "dynamo_frontend_time_to_first_token_seconds"
ITL_SECONDS = "dynamo_frontend_inter_token_latency_seconds"
INPUT_SEQUENCE_TOKENS = "dynamo_frontend_input_sequence_tokens"
OUTPUT_SEQUENCE_TOKENS = "dynamo_frontend_output_sequence_tokens"
REQUEST_DURATION_SECONDS = "dynamo_frontend_request_duration_seconds"
REQUESTS_STARTED_TOTAL = "dynamo_frontend_requests_started_total"  # E3+
REQUESTS_TOTAL = "dynamo_frontend_requests_total"  # older frontends; the fallback
# Gauges (Dynamo 1.6.1 exports both, tests/data/dynamo-1.6.1/frontend_metrics.txt): requests
# waiting in the frontend's queue, and requests in flight. Scale to zero wakes on them.
QUEUED_REQUESTS = "dynamo_frontend_queued_requests"
INFLIGHT_REQUESTS = "dynamo_frontend_inflight_requests"
# Observation field -> gauge.
GAUGES: dict[str, str] = {"queued_requests": QUEUED_REQUESTS, "inflight_requests": INFLIGHT_REQUESTS}

# Observation field -> (histogram, factor from the metric's unit to the field's unit).
HISTOGRAMS: dict[str, tuple[str, float]] = {
    "ttft_ms": (TTFT_SECONDS, 1000.0),
    "itl_ms": (ITL_SECONDS, 1000.0),
    "isl": (INPUT_SEQUENCE_TOKENS, 1.0),
    "osl": (OUTPUT_SEQUENCE_TOKENS, 1.0),
    "request_duration_s": (REQUEST_DURATION_SECONDS, 1.0),
}
# Request counters, preferred first.
REQUEST_COUNTERS: tuple[str, ...] = (REQUESTS_STARTED_TOTAL, REQUESTS_TOTAL)


def model_matches(labels: Mapping[str, str], model_name: str | None) -> bool:
    """Does a series belong to the deployment's model? The frontend lower-cases model names,
    so the comparison ignores case. Without a configured model every series counts; with one, a
    series without a `model` label does not."""
    if model_name is None:
        return True
    model = labels.get("model")
    return model is not None and model.casefold() == model_name.casefold()


def finite(value: float) -> bool:
    return math.isfinite(value)


def parse_le(value: str | None) -> float | None:
    """A histogram bucket's `le` label as a float (`+Inf` → inf); None when it is not a number."""
    if value is None:
        return None
    try:
        bound = float(value)
    except ValueError:
        return None
    return None if math.isnan(bound) else bound


def per_bucket_counts(cumulative: Mapping[float, float]) -> tuple[tuple[float, float], ...]:
    """Per-bucket counts, sorted by upper bound, from cumulative counts by upper bound (the
    increases of a histogram's `_bucket` series over the interval, Prometheus convention).

    Empty when there is no bucket, the last bound is not +Inf, a count is not finite, or the
    total is not positive. A bucket whose cumulative count is below the previous one (only
    Prometheus' extrapolation of `increase()` can do that) counts 0."""
    if not cumulative:
        return ()
    bounds = sorted(cumulative)
    if bounds[-1] != math.inf:
        return ()
    counts = [cumulative[b] for b in bounds]
    if not all(math.isfinite(c) for c in counts) or counts[-1] <= 0:
        return ()
    out: list[tuple[float, float]] = []
    below = 0.0
    for bound, count in zip(bounds, counts, strict=True):
        out.append((bound, max(count - below, 0.0)))
        below = max(below, count)
    return tuple(out)


def build_observation(
    duration_s: float,
    num_req: float | None,
    histograms: Mapping[str, tuple[float | None, float | None]],
    isl_buckets: tuple[tuple[float, float], ...] = (),
    gauges: Mapping[str, float | None] | None = None,
) -> TrafficObservation:
    """The observation from a request count and each histogram's (sum increase, count increase)
    over the interval (keys of `HISTOGRAMS`; None where no matching series existed), and the ISL
    histogram of the interval (`per_bucket_counts`; empty when unknown).

    A mean is Σ sum / Σ count, scaled to the field's unit; unknown (None) when the count is not
    positive or either part is unknown or not finite. A request count of exactly 0 is a confirmed
    idle window: every mean is None and the ISL histogram empty (see the module docstring).
    `gauges`: the frontend's gauges at the interval's end (keys of `GAUGES`; None: no series),
    kept in an idle window too (a request queued for an engine may not have been counted yet)."""
    levels = {field: (gauges or {}).get(field) for field in GAUGES}
    if num_req is not None and num_req == 0:
        return TrafficObservation(duration_s=duration_s, num_req=0.0, isl=None, osl=None, **levels)
    means: dict[str, float | None] = {}
    for field, (_, factor) in HISTOGRAMS.items():
        total, count = histograms.get(field, (None, None))
        if total is None or count is None or not (finite(total) and finite(count)) or count <= 0:
            means[field] = None
        else:
            means[field] = total / count * factor
    return TrafficObservation(
        duration_s=duration_s, num_req=num_req, **means, isl_buckets=isl_buckets, **levels
    )


def describe_http_error(exc: httpx.HTTPError) -> str:
    """`ConnectError: All connection attempts failed (ConnectionRefusedError: [Errno 111] ...)`:
    the httpx error and, when different, the innermost cause (what actually went wrong)."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    root: BaseException = exc
    seen = {id(exc)}
    while True:
        nxt = root.__cause__ or root.__context__
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(nxt))
        root = nxt
    if root is not exc and str(root) and str(root) != str(exc):
        text += f" ({type(root).__name__}: {root})"
    return text


def snippet(text: str, limit: int = 120) -> str:
    """The start of a body, whitespace collapsed, for error reasons."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class HttpSource:
    """What both HTTP sources share: the injected client (or one per call) and their errors."""

    name: str
    timeout_s: float
    _client: httpx.AsyncClient | None

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[httpx.AsyncClient]:
        if self._client is not None:
            yield self._client
        else:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                yield client

    def _fail(self, reason: str) -> SourceUnavailableError:
        return SourceUnavailableError(self.name, reason)
