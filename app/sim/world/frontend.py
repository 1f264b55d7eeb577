"""What the simulated frontend counts: Dynamo's `dynamo_frontend_*` counters and histograms.

Counters are cumulative, as a real frontend's are; a window is the difference of two snapshots
(`FrontendCounters.window`), which is what the planner's direct-scrape source computes from two
`/metrics` scrapes. `render_prometheus` writes the Prometheus text exposition for the demo's
`/metrics` endpoint.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from app.core.types import TrafficObservation
from app.sources.traffic_common import (
    INFLIGHT_REQUESTS,
    INPUT_SEQUENCE_TOKENS,
    ITL_SECONDS,
    OUTPUT_SEQUENCE_TOKENS,
    QUEUED_REQUESTS,
    REQUEST_DURATION_SECONDS,
    REQUESTS_STARTED_TOTAL,
    REQUESTS_TOTAL,
    TTFT_SECONDS,
)

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
_DURATION_BUCKETS_S = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; last is +Inf
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, weight: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += weight
        self.total += value * weight
        self.count += weight


@dataclass(frozen=True)
class CounterSnapshot:
    at_s: float
    started: int
    completed: int
    sums: dict[str, float]
    counts: dict[str, int]
    isl_buckets: tuple[int, ...] = ()  # per bucket, not cumulative
    queued: int = 0  # the queued-requests gauge when the snapshot was taken


class FrontendCounters:
    """Per request: started at arrival; TTFT at the first token; ISL, OSL, ITL and duration at
    completion. ITL is one sample per token after the first (the mean is token-weighted)."""

    def __init__(self, model: str = "model") -> None:
        self.model = model
        self.started = 0
        self.completed = 0
        # Requests waiting at the router because no engine of their role serves (the cluster
        # keeps it): what Dynamo's `dynamo_frontend_queued_requests` gauge shows at zero engines.
        self.queued = 0
        self.histograms = {
            "ttft_ms": Histogram(_LATENCY_BUCKETS_S),
            "itl_ms": Histogram(_LATENCY_BUCKETS_S),
            "isl": Histogram(_TOKEN_BUCKETS),
            "osl": Histogram(_TOKEN_BUCKETS),
            "request_duration_s": Histogram(_DURATION_BUCKETS_S),
        }

    def on_arrival(self) -> None:
        self.started += 1

    def on_first_token(self, ttft_s: float) -> None:
        self.histograms["ttft_ms"].observe(ttft_s)

    def on_complete(self, isl: int, osl: int, itl_s: float | None, duration_s: float) -> None:
        self.completed += 1
        h = self.histograms
        h["isl"].observe(isl)
        h["osl"].observe(osl)
        if itl_s is not None:
            h["itl_ms"].observe(itl_s, osl - 1)
        h["request_duration_s"].observe(duration_s)

    def on_cut_off(self, n: int) -> None:
        """Requests that ended without finishing (their engine was removed): they leave the
        in-flight gauge and count as requests, with no latency or length observed."""
        self.completed += n

    def snapshot(self, at_s: float) -> CounterSnapshot:
        return CounterSnapshot(
            at_s=at_s,
            started=self.started,
            completed=self.completed,
            sums={k: h.total for k, h in self.histograms.items()},
            counts={k: h.count for k, h in self.histograms.items()},
            isl_buckets=tuple(self.histograms["isl"].counts),
            queued=self.queued,
        )

    @staticmethod
    def window(before: CounterSnapshot, after: CounterSnapshot) -> TrafficObservation:
        """The traffic between two snapshots, as the planner's sources report it: means are
        Δsum ÷ Δcount (None when nothing was observed), latencies in ms."""
        means: dict[str, float | None] = {}
        for key, factor in (("ttft_ms", 1000.0), ("itl_ms", 1000.0), ("isl", 1.0), ("osl", 1.0)):
            n = after.counts[key] - before.counts[key]
            means[key] = (after.sums[key] - before.sums[key]) / n * factor if n else None
        n = after.counts["request_duration_s"] - before.counts["request_duration_s"]
        duration = (after.sums["request_duration_s"] - before.sums["request_duration_s"]) / n if n else None
        bounds = (*_TOKEN_BUCKETS, float("inf"))
        isl_buckets = (
            tuple(
                (float(b), float(n1 - n0))
                for b, n0, n1 in zip(
                    bounds, before.isl_buckets or [0] * len(bounds), after.isl_buckets, strict=True
                )
            )
            if after.isl_buckets
            else ()
        )
        return TrafficObservation(
            duration_s=after.at_s - before.at_s,
            num_req=float(after.started - before.started),
            isl=means["isl"],
            osl=means["osl"],
            ttft_ms=means["ttft_ms"],
            itl_ms=means["itl_ms"],
            request_duration_s=duration,
            isl_buckets=isl_buckets,
            queued_requests=float(after.queued),
            inflight_requests=float(after.started - after.completed),
        )

    def render_prometheus(self) -> str:
        """Prometheus text exposition, with the frontend's metric names and a `model` label."""
        label = f'model="{self.model}"'
        lines: list[str] = []
        for name, value in ((REQUESTS_STARTED_TOTAL, self.started), (REQUESTS_TOTAL, self.completed)):
            family = name.removesuffix("_total")
            lines += [f"# TYPE {family} counter", f"{name}{{{label}}} {value}"]
        for name, value in (
            (QUEUED_REQUESTS, self.queued),
            (INFLIGHT_REQUESTS, self.started - self.completed),
        ):
            lines += [f"# TYPE {name} gauge", f"{name}{{{label}}} {value}"]
        names = {
            "ttft_ms": TTFT_SECONDS,
            "itl_ms": ITL_SECONDS,
            "isl": INPUT_SEQUENCE_TOKENS,
            "osl": OUTPUT_SEQUENCE_TOKENS,
            "request_duration_s": REQUEST_DURATION_SECONDS,
        }
        for key, name in names.items():
            h = self.histograms[key]
            lines.append(f"# TYPE {name} histogram")
            cumulative = 0
            for bound, count in zip((*h.bounds, float("inf")), h.counts, strict=True):
                cumulative += count
                le = "+Inf" if bound == float("inf") else repr(float(bound))
                lines.append(f'{name}_bucket{{{label},le="{le}"}} {cumulative}')
            lines.append(f"{name}_sum{{{label}}} {h.total!r}")
            lines.append(f"{name}_count{{{label}}} {h.count}")
        return "\n".join(lines) + "\n"
