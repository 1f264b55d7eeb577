"""Traffic from the frontend's `/metrics`, scraped directly: no Prometheus needed.

Each observation GETs the Prometheus text exposition of the frontend, keeps the dynamo_frontend_*
histogram `_sum`/`_count` samples and request counters, and differences them against the previous
scrape, series by series, summing the series whose `model` label matches the deployment's model
(case-insensitively). Means are Σ Δsum / Σ Δcount; the request count is Σ Δ
`dynamo_frontend_requests_started_total`, else Σ Δ `dynamo_frontend_requests_total`, else None.
`duration_s` is the time between the two scrapes on this host's monotonic clock, each stamped
when its request was sent (the scrapes say how long the interval really was; `interval_s` only
sets the shortest window read as one, below).

Choices:
- The first scrape has nothing to difference against: `observe` raises
  `SourceUnavailableError("frontend_scrape", "first scrape taken; traffic is known from the next
  interval")` rather than returning an all-None observation, so the tick records why it skipped.
  `check()` scrapes too and keeps its scrape as the baseline, so after a successful start-up check
  the first observation already knows the traffic.
- A scrape less than a tenth of the asked interval after the baseline (the first tick right
  after the start-up check, a few hundredths of a second later) is no reading of a rate: a 0.03 s
  window without a request says nothing about a traffic of 40 requests a second, and read as
  silence it orders the minimum. `observe` raises `WindowTooShortError` (the source is not
  failing: /readyz stays ready) and keeps the baseline, so the next observation covers the whole
  time since it and loses nothing. A late tick followed by one on time leaves a window of some
  tenths of the interval, which is a reading.
- A counter that went down (or whose `_created` timestamp changed, where the exporter publishes
  one) means the frontend restarted: its new value is the increase since the restart. This
  undercounts the requests served between the last scrape and the restart; `last_notes` says so.
- A series absent from the previous scrape is new (a model's first request): counted from 0.
- A failed scrape keeps the old baseline: the next observation covers the longer interval.
- The request count is exactly 0 → a confirmed idle window (means None, see traffic_common.py).
- The ISL histogram (`isl_buckets`): Σ Δ of each `le` bucket of
  `dynamo_frontend_input_sequence_tokens_bucket` over the model's series, made per-bucket. A
  series' buckets are reset together, with its `_sum`/`_count`: when any of them went down (or
  `_created` changed), every bucket of that series counts from 0.
- The gauges (`dynamo_frontend_queued_requests`, `dynamo_frontend_inflight_requests`): their
  value in the current scrape, summed over the model's series; None without a series. Levels,
  not counters: nothing to difference.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.core.errors import SourceUnavailableError, WindowTooShortError
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

FIRST_SCRAPE = "first scrape taken; traffic is known from the next interval"
# The shortest window, as a share of the asked interval, read as an observation.
SHORTEST_WINDOW_SHARE = 0.1

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs: a series' identity
SeriesKey = tuple[str, Labels]  # (sample name, labels)


def _created_name(sample: str) -> str:
    """`x_total` → `x_created`, `h_sum`/`h_count` → `h_created` (prometheus_client's names)."""
    for suffix in ("_total", "_sum", "_count"):
        if sample.endswith(suffix):
            return sample[: -len(suffix)] + "_created"
    return sample + "_created"


_HISTOGRAM_SAMPLES = {f"{metric}{part}" for metric, _ in HISTOGRAMS.values() for part in ("_sum", "_count")}
_ISL_BUCKET = f"{INPUT_SEQUENCE_TOKENS}_bucket"
_WANTED = _HISTOGRAM_SAMPLES | set(REQUEST_COUNTERS) | {_ISL_BUCKET}
_WANTED |= {_created_name(name) for name in _WANTED}
_WANTED |= set(GAUGES.values())


@dataclass(frozen=True)
class Scrape:
    """The samples of one scrape that matter here, and when it was taken (monotonic seconds)."""

    taken_at: float
    samples: dict[SeriesKey, float]


def parse_metrics(text: str) -> dict[SeriesKey, float]:
    """The dynamo_frontend_* samples this source uses, from Prometheus text format.

    Raises ValueError (from the parser, or for a sample that is not a number) on garbage."""
    samples: dict[SeriesKey, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in _WANTED:
                value = float(sample.value)
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = value
    return samples


@dataclass
class Difference:
    """What changed between two scrapes, for one model."""

    num_req: float | None
    histograms: dict[str, tuple[float | None, float | None]]
    notes: list[str] = field(default_factory=list)
    # The ISL histogram: (upper bound, requests) per bucket, not cumulative; () when unknown.
    isl_buckets: tuple[tuple[float, float], ...] = ()


def _increase(
    prev: Mapping[SeriesKey, float], cur: Mapping[SeriesKey, float], names: tuple[str, ...], labels: Labels
) -> tuple[tuple[float, ...], bool]:
    """The increases of the samples `names` of one series (read and reset together, like a
    histogram's `_sum` and `_count`), and whether the series was reset in between."""
    now = tuple(cur[(name, labels)] for name in names)
    if any((name, labels) not in prev for name in names):  # a new series: counted from 0
        return now, False
    before = tuple(prev[(name, labels)] for name in names)
    created = (_created_name(names[0]), labels)
    reset = any(n < b for n, b in zip(now, before, strict=True)) or (
        created in cur and created in prev and cur[created] != prev[created]
    )
    if reset:
        return now, True
    return tuple(n - b for n, b in zip(now, before, strict=True)), False


def difference(
    prev: Mapping[SeriesKey, float], cur: Mapping[SeriesKey, float], model_name: str | None
) -> Difference:
    """Request count and histogram (Δsum, Δcount) between two scrapes over the series of
    `model_name` (every series when None). A field without any matching series is None."""
    notes: list[str] = []

    def matching(name: str) -> list[Labels]:
        return [labels for (n, labels) in cur if n == name and model_matches(dict(labels), model_name)]

    def describe(labels: Labels) -> str:
        return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"

    num_req: float | None = None
    for counter in REQUEST_COUNTERS:
        series = matching(counter)
        if not series:
            notes.append(f"no series of this model in {counter}")
            continue
        increases: list[float] = []
        for labels in series:
            (inc,), reset = _increase(prev, cur, (counter,), labels)
            if reset:
                notes.append(f"{counter}{describe(labels)} was reset (frontend restart?): counted from 0")
            if math.isfinite(inc):
                increases.append(inc)
            else:
                notes.append(f"skipped the non-finite increase of {counter}{describe(labels)}")
        if increases:
            num_req = math.fsum(increases)
            break

    histograms: dict[str, tuple[float | None, float | None]] = {}
    for obs_field, (metric, _) in HISTOGRAMS.items():
        names = (f"{metric}_sum", f"{metric}_count")
        series = [labels for labels in matching(names[1]) if (names[0], labels) in cur]
        if not series:
            histograms[obs_field] = (None, None)
            continue
        total_sum = total_count = 0.0
        for labels in series:
            (d_sum, d_count), reset = _increase(prev, cur, names, labels)
            if reset:
                notes.append(f"{metric}{describe(labels)} was reset (frontend restart?): counted from 0")
            total_sum += d_sum
            total_count += d_count
        histograms[obs_field] = (total_sum, total_count)
    buckets = per_bucket_counts(_bucket_increases(prev, cur, matching(_ISL_BUCKET)))
    return Difference(num_req=num_req, histograms=histograms, notes=notes, isl_buckets=buckets)


def _bucket_increases(
    prev: Mapping[SeriesKey, float], cur: Mapping[SeriesKey, float], bucket_series: list[Labels]
) -> dict[float, float]:
    """Σ increase of the ISL `_bucket` series per `le` bound (cumulative, as published). The
    buckets of one histogram series (its labels without `le`) are reset together with its
    `_sum`/`_count`, like `_increase`: a reset series counts from 0, a new one too."""
    series: dict[Labels, dict[float, Labels]] = {}
    for labels in bucket_series:
        bound = parse_le(dict(labels).get("le"))
        if bound is not None:
            series.setdefault(tuple(kv for kv in labels if kv[0] != "le"), {})[bound] = labels
    cumulative: dict[float, float] = {}
    for base, buckets in series.items():
        keys = [(_ISL_BUCKET, labels) for labels in buckets.values()]
        keys += [(f"{INPUT_SEQUENCE_TOKENS}{part}", base) for part in ("_sum", "_count")]
        created = (f"{INPUT_SEQUENCE_TOKENS}_created", base)
        reset = any(key in cur and key in prev and cur[key] < prev[key] for key in keys) or (
            created in cur and created in prev and cur[created] != prev[created]
        )
        for bound, labels in buckets.items():
            key = (_ISL_BUCKET, labels)
            increase = cur[key] if reset or key not in prev else cur[key] - prev[key]
            cumulative[bound] = cumulative.get(bound, 0.0) + increase
    return cumulative


def gauge_values(samples: Mapping[SeriesKey, float], model_name: str | None) -> dict[str, float | None]:
    """Each gauge of `GAUGES` now: Σ of the model's finite series; None where it has none."""
    values: dict[str, float | None] = {}
    for obs_field, name in GAUGES.items():
        found = [
            v
            for (n, labels), v in samples.items()
            if n == name and model_matches(dict(labels), model_name) and math.isfinite(v)
        ]
        values[obs_field] = math.fsum(found) if found else None
    return values


class FrontendScrapeSource(HttpSource):
    """Traffic observations from the frontend's `/metrics` (see the module docstring)."""

    name = "frontend_scrape"

    def __init__(
        self,
        url: str,
        *,
        model_name: str | None = None,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        # The frontend's base URL (`http://frontend:8000`) or its metrics URL itself.
        base = url.rstrip("/")
        self.url = base if base.endswith("/metrics") else f"{base}/metrics"
        self.model_name = model_name
        self.timeout_s = timeout_s
        self._client = client
        self._monotonic = monotonic
        self._baseline: Scrape | None = None
        # What the last observation had to work around (resets, fallback counter).
        self.last_notes: tuple[str, ...] = ()

    async def check(self) -> None:
        """The frontend answers with Prometheus text; the scrape becomes the baseline."""
        self._baseline = await self.scrape()

    async def observe(self, interval_s: float) -> TrafficObservation:
        current = await self.scrape()
        previous = self._baseline
        if previous is None:
            self._baseline = current
            raise SourceUnavailableError(self.name, FIRST_SCRAPE)
        window_s = current.taken_at - previous.taken_at
        if window_s < SHORTEST_WINDOW_SHARE * interval_s:
            raise WindowTooShortError(
                self.name,
                f"only {window_s:.2f} s since the last scrape, less than {SHORTEST_WINDOW_SHARE:g} of the "
                f"{interval_s:g} s interval: too short to read a rate from; the next observation covers it",
            )
        self._baseline = current
        diff = difference(previous.samples, current.samples, self.model_name)
        self.last_notes = tuple(diff.notes)
        for note in diff.notes:
            (log.warning if "reset" in note else log.debug)("frontend %s: %s", self.url, note)
        return build_observation(
            window_s,
            diff.num_req,
            diff.histograms,
            diff.isl_buckets,
            gauges=gauge_values(current.samples, self.model_name),
        )

    async def scrape(self) -> Scrape:
        """One GET of `/metrics`, parsed; `SourceUnavailableError` with the reason otherwise."""
        # Stamped when the request leaves, not when the answer is read: the server renders its
        # counters as the request arrives, while a busy event loop may read the answer much
        # later, and a late stamp on one scrape shortens the next window and inflates its rate
        # (a 1 s tick that read its answer 0.6 s late showed 2.5x the traffic).
        taken_at = self._monotonic()
        async with self._session() as client:
            try:
                resp = await client.get(
                    self.url, headers={"Accept": "text/plain;version=0.0.4"}, timeout=self.timeout_s
                )
            except httpx.TimeoutException as exc:
                raise self._fail(
                    f"{self.url}: no answer within {self.timeout_s:g} s ({describe_http_error(exc)})"
                ) from exc
            except httpx.ConnectError as exc:
                raise self._fail(f"cannot connect to {self.url}: {describe_http_error(exc)}") from exc
            except httpx.HTTPError as exc:
                raise self._fail(f"{self.url}: {describe_http_error(exc)}") from exc
        content_type = resp.headers.get("content-type", "").lower()
        what = f"{self.url} answered HTTP {resp.status_code}"
        if resp.status_code != 200:
            raise self._fail(f"{what}: {snippet(resp.text)!r}")
        if "html" in content_type or "json" in content_type:
            kind = "an HTML page" if "html" in content_type else "JSON"
            raise self._fail(f"{what} with {kind}, not Prometheus text format: {snippet(resp.text)!r}")
        try:
            samples = parse_metrics(resp.text)
        except ValueError as exc:
            raise self._fail(
                f"{what} with a body that is not Prometheus text format ({snippet(str(exc), 80)}):"
                f" {snippet(resp.text)!r}"
            ) from None
        return Scrape(taken_at=taken_at, samples=samples)
