"""The planner reading real NVIDIA Dynamo 1.6.1's frontend through a real Prometheus.

The stack is deploy/dynamo-local/stack.py's (the real `dynamo.frontend`, one prefill and one
decode `dynamo.mocker`, file discovery, on loopback); `prometheus` (tests/support_frontend.py's
PrometheusServer, job "frontend") scrapes the frontend's `/metrics` every two seconds. Requests of
known lengths go to `/v1/completions` (the stack's tokenizer is word-level: load.py's prompt of n
words is n tokens, and `ignore_eos` with `max_tokens` fixes the output length), then the window
is read back twice: through the planner's PrometheusSource configured as `planner serve` would
configure it for this deployment (deploy/dynamo-local/planner.yaml with `sources.prometheus`),
and through the direct frontend scrape (FrontendScrapeSource) over the same requests.

Why the count can be compared exactly. The frontend creates its `model` series only with the
model's first request (before it, `/metrics` has none of them, docs/dynamo-live.md), and
`increase()` cannot count a series' first sample: its value is not an increase Prometheus saw.
So one warm-up request goes first and is scraped; then the batch. The window ends at the
timestamp of a scrape holding the whole batch (`at=`: no extrapolation to the end) and starts
exactly at the timestamp of a scrape taken after the warm-up and before the batch (Prometheus
2.x includes a sample at the window's start: no extrapolation there either; the planner's
windows are whole seconds, so the two scrapes are chosen a whole number of seconds apart, see
`whole_seconds_apart`). Then increase() = last - first: the batch's count, sums and buckets,
exactly what the direct scrape differences too.

Skipped only when Dynamo's venv (.venv-dynamo, `bash bench/install_dynamo.sh`) or the `prometheus`
binary is absent; CI installs both and fails on skips. Wall time about 30 s; 4 small processes.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.config import read_yaml_mapping, validate_deployments
from app.core.types import TrafficObservation
from app.sources.frontend_scrape import FrontendScrapeSource
from app.sources.prometheus import PrometheusSource
from app.sources.traffic import make_traffic_source
from tests.support import REPO_ROOT, free_port
from tests.support_frontend import PROMETHEUS_ENV, PrometheusServer, prometheus_binary, wait_until

LOCAL = REPO_ROOT / "deploy" / "dynamo-local"
sys.path.insert(0, str(LOCAL))
import load as loadgen  # noqa: E402
from stack import MODEL_NAME, Stack, StackConfig, dynamo_available  # noqa: E402

NO_DYNAMO = "Dynamo's venv is absent: bash bench/install_dynamo.sh (or DYNAMO_PYTHON)"
NO_PROMETHEUS = (
    f"no prometheus binary: install Debian's `prometheus` package (CI does) or set {PROMETHEUS_ENV}"
)
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not dynamo_available(), reason=NO_DYNAMO),
    pytest.mark.skipif(prometheus_binary() is None, reason=NO_PROMETHEUS),
]

STARTED = f'dynamo_frontend_requests_started_total{{model="{MODEL_NAME}"}}'
# The frontend records a request in each of these once it is answered; all must hold the batch.
COUNTS = [
    f'dynamo_frontend_{name}_count{{model="{MODEL_NAME}"}}'
    for name in (
        "time_to_first_token_seconds",
        "input_sequence_tokens",
        "output_sequence_tokens",
        "request_duration_seconds",
    )
]
# The batch: (ISL, OSL) per request, several lengths so that a mean is not just one request's.
BATCH = [(isl, osl) for isl in (300, 700, 1200) for osl in (8, 20)] * 2
WARM_UP = loadgen.Request(0.0, 50, 4)
# Two seconds, not one: Prometheus snaps a late scrape's timestamp to the interval's schedule only
# while its tolerance is under 1% of the interval, and at 1 s (9 ms) scrapes on a loaded CI
# machine ran 4-16 ms late, so no two were a whole number of seconds apart; at 2 s it is 19 ms.
SCRAPE_INTERVAL_S = 2
SPARE_SCRAPES_S = 4.0 * SCRAPE_INTERVAL_S  # scrapes kept on either side of the batch


@dataclass
class Live:
    stack: Stack
    prometheus: PrometheusServer


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    binary = prometheus_binary()
    assert binary is not None  # the skip above
    # Mockers at the H200 profile's own speed (speedup 1): the test is about names, labels and
    # units, not load; 0.5 s simulated start-up keeps the stack's start short.
    stack = Stack(
        StackConfig(workdir=str(tmp_path_factory.mktemp("dynamo")), port=free_port(), startup_s=0.5)
    )
    work = Path(tmp_path_factory.mktemp("prometheus"))
    prometheus = PrometheusServer(
        binary, work, [f"127.0.0.1:{stack.config.port}"], scrape_interval_s=SCRAPE_INTERVAL_S
    )
    try:
        stack.start(prefill=1, decode=1, timeout_s=120)
        prometheus.start()
        yield Live(stack, prometheus)
    finally:
        prometheus.stop()
        stack.stop()


def planner_source(prometheus_url: str) -> PrometheusSource:
    """The traffic source `planner serve` builds for the live stack's deployment, with
    Prometheus instead of the direct scrape. The frontend exports no `dynamo_namespace` label
    (only a PodMonitor's relabelling would add one), so the matcher is the scrape job's."""
    raw = read_yaml_mapping(LOCAL / "planner.yaml")
    deployment = raw["deployments"][0]
    deployment["sources"] = {"prometheus": {"url": prometheus_url, "labels": {"job": "frontend"}}}
    config = validate_deployments(raw, "planner.yaml with sources.prometheus").deployments[0]
    source = make_traffic_source(config)
    assert isinstance(source, PrometheusSource)
    return source


def latest_scrape(prometheus: PrometheusServer) -> float:
    (at,) = prometheus.values(f"timestamp({STARTED})")
    return at


def scraped_all(prometheus: PrometheusServer, n: int) -> bool:
    return all(prometheus.values(q) == [float(n)] for q in [STARTED, *COUNTS])


def whole_seconds_apart(
    prometheus: PrometheusServer, *, quiet: tuple[float, float], full: tuple[float, float]
) -> tuple[float, float]:
    """Two scrape timestamps (s): one from `quiet[0]` on whose request count is `quiet[1]` (the
    warm-up only), one from `full[0]` on with `full[1]` (the whole batch), a whole number of
    seconds apart to the millisecond, so that a window of whole seconds ending on the second
    starts on the first. Prometheus aligns scrape timestamps to the interval only when a scrape
    is at most `--scrape.timestamp-tolerance` late (19 ms at this test's 2 s interval,
    tests/support_frontend.py); on a busy machine some may be later still, so the test looks for
    a pair among four intervals of scrapes on either side."""
    (series,) = prometheus.query(f"{STARTED}[2m]")
    samples = [(round(float(t) * 1000), float(v)) for t, v in series["values"]]
    starts = [t for t, v in samples if v == quiet[1] and t >= round(quiet[0] * 1000)]
    ends = [t for t, v in samples if v == full[1] and t >= round(full[0] * 1000)]
    for end in ends:
        for start in reversed(starts):
            if (end - start) % 1000 == 0:
                return start / 1000, end / 1000
    raise AssertionError(f"no two scrapes a whole number of seconds apart: {starts} and {ends}")


def send(url: str, requests: list[loadgen.Request]) -> list[loadgen.Result]:
    results = asyncio.run(loadgen.run_load(url, requests, model=MODEL_NAME, timeout_s=60))
    assert [r.status for r in results] == [200] * len(requests), [r.error for r in results]
    # The tokenizer is one word, one token: the frontend counts what the load sent.
    assert [r.output_tokens for r in results] == [r.osl for r in requests]
    return results


@pytest.mark.timeout(150)
async def test_prometheus_reads_the_real_frontend_as_the_direct_scrape_does(live: Live) -> None:
    t0 = time.monotonic()
    prometheus, url = live.prometheus, live.stack.url
    # The warm-up: the frontend's model series exist from here (see the module docstring).
    await asyncio.to_thread(send, url, [WARM_UP])
    await asyncio.to_thread(
        wait_until,
        lambda: scraped_all(prometheus, 1),
        f"prometheus scraped the warm-up\n{prometheus.log_tail()}",
    )
    first_quiet = latest_scrape(prometheus)  # holds the warm-up, answered; no batch yet
    await asyncio.sleep(SPARE_SCRAPES_S)  # more such scrapes: candidates for the window's start
    direct = FrontendScrapeSource(url, model_name=MODEL_NAME)
    await direct.check()  # its baseline: the same state (nothing is sent in between)

    # Spread over ~3 s: scrapes land while requests are in flight, as in service.
    schedule = [loadgen.Request(0.25 * i, isl, osl) for i, (isl, osl) in enumerate(BATCH)]
    results = await asyncio.to_thread(send, url, schedule)
    n = len(BATCH)
    await asyncio.to_thread(
        wait_until,
        lambda: scraped_all(prometheus, 1 + n),
        f"prometheus scraped the batch\n{prometheus.log_tail()}",
    )
    first_full = latest_scrape(prometheus)  # holds the whole batch, answered
    await asyncio.sleep(SPARE_SCRAPES_S)  # candidates for the window's end
    from_direct = await direct.observe(0)

    start, at = whole_seconds_apart(prometheus, quiet=(first_quiet, 1.0), full=(first_full, 1.0 + n))
    window_s = round(at - start)
    source = planner_source(prometheus.url)
    through = await source.observe(window_s, at=at)
    assert source.last_notes == ()  # the preferred counter, no skipped values
    # The matcher examples/ and Dynamo's PodMonitor use finds nothing on a plain scrape: the
    # frontend has no `dynamo_namespace` label. Unknown, not zero (and not the job's traffic).
    namespaced = PrometheusSource(
        prometheus.url, labels={"dynamo_namespace": "dynamo"}, model_name=MODEL_NAME
    )
    unknown = TrafficObservation(float(window_s), None, None, None)
    assert await namespaced.observe(window_s, at=at) == unknown

    # The count, exactly: the batch, not the warm-up (increase() = last - first, both sources).
    assert through.num_req == float(n) == from_direct.num_req
    # ISL and OSL: the load's own lengths, exactly (word-level tokenizer, ignore_eos).
    assert through.isl == pytest.approx(sum(isl for isl, _ in BATCH) / n, abs=1e-9)
    assert through.osl == pytest.approx(sum(osl for _, osl in BATCH) / n, abs=1e-9)
    # The ISL histogram: every request in a bucket, the same buckets the direct scrape reads.
    assert sum(c for _, c in through.isl_buckets) == float(n)
    assert through.isl_buckets == from_direct.isl_buckets
    assert through.isl_buckets[-1][0] == math.inf
    # Every mean as the direct scrape of the same requests: Prometheus stores the frontend's
    # float64 sums and counts, so only the subtraction's rounding may differ.
    agree(through, from_direct)

    # Units: TTFT and ITL in ms, the duration in s. The frontend's own request duration is what
    # the client waited, less its HTTP round trip; and a request's duration is its TTFT plus
    # (OSL - 1) inter-token gaps (the frontend records OSL - 1 ITL observations per request), so
    # the means must rebuild it. A second mistaken for a millisecond is off by 1000 in either.
    assert through.ttft_ms is not None and through.itl_ms is not None and through.request_duration_s
    client_s = sum(r.latency_s for r in results) / n
    assert 0.5 * client_s < through.request_duration_s <= client_s
    rebuilt_s = (n * through.ttft_ms + through.itl_ms * sum(osl - 1 for _, osl in BATCH)) / 1000.0
    assert rebuilt_s == pytest.approx(n * through.request_duration_s, rel=0.2)
    assert 1.0 < through.ttft_ms < 10_000.0 and 0.1 < through.itl_ms < 1_000.0
    print(
        f"\n{n} requests through Prometheus over {window_s} s: ISL {through.isl:.1f}, OSL {through.osl:.2f},"
        f" TTFT {through.ttft_ms:.2f} ms, ITL {through.itl_ms:.3f} ms,"
        f" duration {through.request_duration_s * 1000:.1f} ms (client {client_s * 1000:.1f} ms);"
        f" direct scrape TTFT {from_direct.ttft_ms:.2f} ms, ITL {from_direct.itl_ms:.3f} ms;"
        f" {time.monotonic() - t0:.1f} s"
    )


def agree(a: TrafficObservation, b: TrafficObservation) -> None:
    for name in ("isl", "osl", "ttft_ms", "itl_ms", "request_duration_s"):
        x, y = getattr(a, name), getattr(b, name)
        assert x is not None and y is not None, name
        assert x == pytest.approx(y, rel=1e-9), name
