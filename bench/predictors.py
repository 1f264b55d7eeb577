"""Load-predictor benchmark: the cost of one throughput tick's prediction work, and the
one-step-ahead forecast error of each predictor on real traffic.

(a) Tick time. The Azure conversation trace (data/traces/AzureLLMInferenceTrace_conv.csv) is
    bucketed at 15 s, which gives 233 complete intervals with real request counts, ISLs and
    OSLs. A `TrafficPredictor` (three series: num_req, isl, osl) is warmed with the first 200;
    its first forecast (where ARIMA runs `auto_arima`) is timed on its own; then each of the
    next `--ticks` intervals is one tick: `observe(interval)` + `forecast()`, timed with
    `time.perf_counter`. Median and p99 over those ticks (p99 of 30 samples is close to the max).

(b) Forecast error, MAPE of the next interval's request count, `mean(|ŷ - y| / y) · 100`,
    one step ahead: at step t the predictor has seen y[0..t-1], predicts y[t], then observes it.
    A predictor that raises falls back to the last value (as `TrafficPredictor` does); below its
    minimum number of points a predictor answers the last value, and the table says on how many
    steps the model itself answered.
    - ServeGen m-large 14-day rate curve (data/traces/language_m-large_aggregate_rate.csv):
      count = rate × 600 per 600 s window, 2,016 windows; the first 144 (one day) only warm the
      predictor; steps 144..2015 are evaluated (1,872 forecasts). With `--stride K` (default 1)
      prophet forecasts only every K-th step (it refits from scratch per forecast, so skipped
      steps change nothing in the evaluated ones); ARIMA then adds the skipped points in one
      `model.update`.
    - Azure conv trace at 10-minute and 3-minute buckets. The trace is 3,502 s long, so the last
      bucket is partial (502 s of 600, 82 s of 180) and is dropped: 5 and 19 complete intervals.
      Every step from t = 1 is evaluated (4 and 18 forecasts). With 5 intervals no model reaches
      its 5-point minimum before the last step, so at 10 minutes every predictor is the constant
      one: that row says so rather than measuring anything.

    .venv/bin/python -m bench.predictors [--ticks 30] [--stride 1]

Prints markdown tables and writes bench/results/predictors.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from app.core.seed.predictors import SeriesPredictor, TrafficPredictor, make_predictor
from app.core.traces import bucket_requests
from app.core.types import TrafficObservation
from app.sources.traces import load_trace

REPO_ROOT = Path(__file__).resolve().parent.parent

TRACES = REPO_ROOT / "data" / "traces"
AZURE = TRACES / "AzureLLMInferenceTrace_conv.csv"
SERVEGEN = TRACES / "language_m-large_aggregate_rate.csv"
RESULTS = REPO_ROOT / "bench" / "results" / "predictors.json"

KINDS = ("constant", "arima", "kalman", "prophet")
WARM_INTERVALS = 200
TICK_INTERVAL_S = 15.0
SERVEGEN_WINDOW_S = 600.0
SERVEGEN_WARMUP = 144  # one day of 600 s windows


@dataclass(frozen=True)
class Variant:
    label: str
    kind: str
    params: dict[str, Any]


def variants(step_s: float) -> list[Variant]:
    return [
        Variant("constant", "constant", {}),
        Variant("arima", "arima", {}),
        Variant("arima log1p", "arima", {"log1p": True}),
        Variant("kalman", "kalman", {}),
        Variant("kalman log1p", "kalman", {"log1p": True}),
        Variant("prophet", "prophet", {"step_s": step_s}),
    ]


def complete_buckets(interval_s: float) -> list[TrafficObservation]:
    """Azure buckets without the last one, which the trace's end cuts short."""
    requests = load_trace(AZURE)
    buckets = bucket_requests(requests, interval_s)
    if requests[-1].arrival_s < len(buckets) * interval_s:
        buckets = buckets[:-1]
    return buckets


# --- (a) tick time --------------------------------------------------------------------------------


def time_ticks(kind: str, ticks: int) -> dict[str, Any]:
    buckets = complete_buckets(TICK_INTERVAL_S)
    if len(buckets) < WARM_INTERVALS + ticks:
        raise SystemExit(f"need {WARM_INTERVALS + ticks} intervals, the trace has {len(buckets)}")
    params = {"step_s": TICK_INTERVAL_S} if kind == "prophet" else {}
    traffic = TrafficPredictor(kind, params)
    assert traffic.warm(buckets[:WARM_INTERVALS]) == WARM_INTERVALS

    t0 = time.perf_counter()
    first = traffic.forecast()
    first_ms = (time.perf_counter() - t0) * 1e3
    assert first is not None

    samples_ms: list[float] = []
    notes: list[str] = []
    for obs in buckets[WARM_INTERVALS : WARM_INTERVALS + ticks]:
        t0 = time.perf_counter()
        traffic.observe(obs)
        forecast = traffic.forecast()
        samples_ms.append((time.perf_counter() - t0) * 1e3)
        assert forecast is not None
        notes.extend(forecast.notes)
    return {
        "kind": kind,
        "ticks": ticks,
        "first_forecast_ms": first_ms,
        "median_ms": statistics.median(samples_ms),
        "p99_ms": float(np.percentile(samples_ms, 99)),
        "max_ms": max(samples_ms),
        "samples_ms": samples_ms,
        "notes": notes,
    }


# --- (b) forecast error ---------------------------------------------------------------------------


def one_step_mape(variant: Variant, series: Sequence[float], start: int, stride: int = 1) -> dict[str, Any]:
    predictor = make_predictor(variant.kind, variant.params)
    assert isinstance(predictor, SeriesPredictor)
    for y in series[:start]:
        predictor.observe(y)
    errors: list[float] = []
    model_steps = failures = 0
    t0 = time.perf_counter()
    for t in range(start, len(series)):
        if (t - start) % stride == 0:
            assert predictor.last_value is not None
            try:
                prediction = predictor.predict()
                value = prediction.value
                model_steps += prediction.note is None
            except Exception:
                value = predictor.last_value
                failures += 1
            errors.append(abs(value - series[t]) / series[t])
        predictor.observe(series[t])
    return {
        "predictor": variant.label,
        "params": variant.params,
        "forecasts": len(errors),
        "model_steps": model_steps,
        "failures": failures,
        "mape_pct": 100.0 * statistics.fmean(errors),
        "seconds": time.perf_counter() - t0,
    }


def servegen_counts() -> list[float]:
    lines = SERVEGEN.read_text().splitlines()
    assert lines[0].split(",")[:2] == ["window_start_s", "total_rate_rps"]
    return [float(line.split(",")[1]) * SERVEGEN_WINDOW_S for line in lines[1:] if line.strip()]


# --- output ---------------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list[str]]) -> str:
    right = ["---:" if i else "---" for i in range(len(headers))]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(right) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def tick_table(ticks: int) -> list[dict[str, Any]]:
    print(f"## (a) one throughput tick: observe + forecast, 3 series, warm history {WARM_INTERVALS}\n")
    print(f"Azure conv trace at {TICK_INTERVAL_S:g} s intervals; {ticks} ticks per predictor.\n")
    timings = [time_ticks(kind, ticks) for kind in KINDS]
    print(
        table(
            ["predictor", "ticks", "first forecast ms", "median ms", "p99 ms", "max ms"],
            [
                [
                    t["kind"],
                    str(t["ticks"]),
                    f"{t['first_forecast_ms']:.1f}",
                    f"{t['median_ms']:.2f}",
                    f"{t['p99_ms']:.2f}",
                    f"{t['max_ms']:.2f}",
                ]
                for t in timings
            ],
        )
    )
    return timings


def error_table(stride: int) -> list[dict[str, Any]]:
    counts = servegen_counts()
    datasets: list[tuple[str, list[float], int, float, int]] = [
        ("ServeGen m-large 14 d, 600 s", counts, SERVEGEN_WARMUP, SERVEGEN_WINDOW_S, stride),
    ]
    for interval_s in (600.0, 180.0):
        series = [float(b.num_req or 0.0) for b in complete_buckets(interval_s)]
        datasets.append((f"Azure conv, {interval_s / 60:g} min", series, 1, interval_s, 1))

    errors: list[dict[str, Any]] = []
    print("\n## (b) MAPE of the next interval's request count, one step ahead\n")
    for name, series, start, interval_s, slow_stride in datasets:
        for variant in variants(interval_s):
            slow = variant.kind in ("arima", "prophet")
            result = one_step_mape(variant, series, start, slow_stride if slow else 1)
            errors.append({"dataset": name, "intervals": len(series), "warmup": start, **result})
    print(
        table(
            ["data", "intervals", "predictor", "forecasts", "model answered", "MAPE %", "run s"],
            [
                [
                    e["dataset"],
                    str(e["intervals"]),
                    e["predictor"],
                    str(e["forecasts"]),
                    str(e["model_steps"]) + (f" ({e['failures']} failed)" if e["failures"] else ""),
                    f"{e['mape_pct']:.2f}",
                    f"{e['seconds']:.1f}",
                ]
                for e in errors
            ],
        )
    )
    print(
        "\n'model answered': forecasts the model made itself; the others are the last value "
        "(fewer points than the predictor's minimum, or a failure)."
    )
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ticks", type=int, default=30, help="timed ticks per predictor (default 30)")
    parser.add_argument(
        "--stride",
        type=int,
        default=1,
        help="on ServeGen, arima and prophet forecast every K-th step only (default 1: every step)",
    )
    parser.add_argument(
        "--part",
        choices=("all", "ticks", "errors"),
        default="all",
        help="ticks: only (a); errors: only (b) (default: both)",
    )
    args = parser.parse_args()
    timings: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    if args.part in ("all", "ticks"):
        timings = tick_table(args.ticks)
    if args.part in ("all", "errors"):
        errors = error_table(args.stride)

    # A partial run keeps the other part's results from the previous run.
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() and args.part != "all" else {}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "parameters": {
                    "ticks": args.ticks,
                    "part": args.part,
                    "stride": args.stride,
                    "warm_intervals": WARM_INTERVALS,
                    "tick_interval_s": TICK_INTERVAL_S,
                    "servegen_warmup": SERVEGEN_WARMUP,
                },
                "machine": {
                    "cpus": os.cpu_count(),
                    "load_average": os.getloadavg(),
                    "python": platform.python_version(),
                    "libraries": {
                        lib: version(lib)
                        for lib in ("numpy", "pmdarima", "statsmodels", "filterpy", "prophet")
                    },
                },
                "tick_timings": timings or previous.get("tick_timings", []),
                "forecast_errors": errors or previous.get("forecast_errors", []),
            },
            indent=2,
        )
    )
    print(f"\nwrote {RESULTS.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
