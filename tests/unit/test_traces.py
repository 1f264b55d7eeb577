"""Trace files (Mooncake JSONL, Azure CSV, Dynamo request trace v1) and their bucketing into
per-interval traffic observations.

Real traces are read from the repository copy in data/traces/ (never from outside it); hand-written
fixtures, broken ones included, are in tests/data/traces/. Expected values on the real traces are
computed here independently of `app/sources/traces.py` (csv/json and `datetime.fromisoformat`)."""

from __future__ import annotations

import csv
import gzip
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from app.core.seed.predictors import TrafficPredictor
from app.core.traces import TraceRequest, bucket_requests
from app.core.types import TrafficObservation
from app.sources.traces import detect_format, load_trace

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = REPO_ROOT / "data" / "traces"
FIXTURES = REPO_ROOT / "tests" / "data" / "traces"
AZURE = DATA / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = DATA / "mooncake_trace_arxiv_first1000.jsonl"

R = TraceRequest

# --- load_trace on the fixtures -------------------------------------------------------------------


@dataclass(frozen=True)
class LoadCase:
    name: str
    why: str
    file: str
    format: str
    expected: list[TraceRequest]


LOAD_CASES = [
    LoadCase(
        "dynamo_v1",
        "request_end rows only (tool_end skipped), bare or wrapped in 'event'; absolute ms made "
        "relative to the earliest request and sorted; ISL from request.replay.input_length",
        "dynamo_request_trace_v1.jsonl",
        "dynamo",
        [R(0.0, 128, 16), R(10.0, 192, 32), R(30.5, 320, 48), R(74.999, 64, 8), R(180.0, 1000, 100)],
    ),
    LoadCase(
        "mooncake",
        "timestamps are ms; float timestamps allowed; sorted by arrival; hash_ids ignored",
        "mooncake_small.jsonl",
        "mooncake",
        [
            R(0.0, 100, 10),
            R(0.5, 300, 30),
            R(59.999, 200, 20),
            R(60.0, 1000, 50),
            R(130.0, 150, 15),
            R(130.5005, 50, 5),
        ],
    ),
    LoadCase(
        "azure",
        "seconds since the first row; 7-digit fractions truncated to microseconds "
        "(…46.6805909 → 60.0 exactly); a timestamp without fraction is accepted",
        "azure_small.csv",
        "azure",
        [
            R(0.0, 374, 44),
            R(4.314579, 396, 109),
            R(60.0, 879, 34),
            R(119.31941, 100, 1),
            R(120.31941, 200, 3),
        ],
    ),
]


@pytest.mark.parametrize("case", LOAD_CASES, ids=lambda c: c.name)
def test_load_trace_fixture(case: LoadCase) -> None:
    path = FIXTURES / case.file
    assert detect_format(path) == case.format, case.why
    assert load_trace(path) == case.expected, case.why


# --- broken files ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BadCase:
    name: str
    why: str
    file: str
    message: str  # after "<path>:"


BAD_CASES = [
    BadCase(
        "mooncake_string_length",
        "a quoted number is not an integer; names line and field",
        "bad_mooncake_input_length.jsonl",
        '3: input_length: must be a non-negative integer, got "12"',
    ),
    BadCase(
        "mooncake_negative_output",
        "token counts cannot be negative",
        "bad_mooncake_negative_output.jsonl",
        "2: output_length: must be a non-negative integer, got -1",
    ),
    BadCase(
        "mooncake_truncated_line",
        "invalid JSON names the line",
        "bad_mooncake_truncated.jsonl",
        "2: invalid JSON: Invalid control character at (column 50)",
    ),
    BadCase(
        "mixed_formats",
        "the first line decides the format; a Dynamo record after Mooncake rows is refused",
        "bad_mixed_formats.jsonl",
        "2: expected a mooncake record like the first line, found dynamo",
    ),
    BadCase(
        "dynamo_without_replay",
        "Dynamo's warm-up reads ISL from request.replay.input_length only",
        "bad_dynamo_no_replay.jsonl",
        "2: request.replay: missing or not an object",
    ),
    BadCase(
        "dynamo_string_received_ms",
        "request_received_ms must be a number",
        "bad_dynamo_received_ms.jsonl",
        '1: request.request_received_ms: must be a finite number, got "5"',
    ),
    BadCase(
        "dynamo_no_request_end",
        "a trace that warms nothing is a configuration mistake",
        "bad_dynamo_no_requests.jsonl",
        " no requests in the trace",
    ),
    BadCase(
        "azure_bad_timestamp",
        "unparseable TIMESTAMP names line 3 (the header is line 1)",
        "bad_azure_timestamp.csv",
        "3: TIMESTAMP: expected 'YYYY-MM-DD HH:MM:SS[.fraction]', got '2023-11-16 18:15:4x.6805900'",
    ),
    BadCase(
        "azure_negative_tokens",
        "GeneratedTokens must be a non-negative integer",
        "bad_azure_tokens.csv",
        "2: GeneratedTokens: must be a non-negative integer, got '-5'",
    ),
    BadCase(
        "azure_short_row",
        "a missing column is reported, not read as zero",
        "bad_azure_short_row.csv",
        "3: expected 3 columns, got 2",
    ),
    BadCase(
        "unknown_csv_header",
        "a CSV that is not the Azure format",
        "bad_unknown_header.csv",
        "1: unrecognised trace format: neither JSON lines nor a CSV header with "
        "TIMESTAMP, ContextTokens, GeneratedTokens",
    ),
    BadCase(
        "unknown_json_record",
        "JSON that is neither Mooncake nor Dynamo v1",
        "bad_unknown_json.jsonl",
        "1: unrecognised JSON trace record: expected Mooncake (timestamp, input_length, "
        "output_length) or schema 'dynamo.request.trace.v1'",
    ),
    BadCase("empty_file", "nothing to detect", "bad_empty.jsonl", " empty trace file"),
]


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.name)
def test_load_trace_rejects(case: BadCase) -> None:
    path = FIXTURES / case.file
    with pytest.raises(ValueError) as info:
        load_trace(path)
    assert str(info.value) == f"{path}:{case.message}", case.why


def test_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(ValueError, match="nope.jsonl: no such trace file"):
        load_trace(path)


# --- shards and gzip ------------------------------------------------------------------------------


def _gzip(src: Path, dst: Path) -> None:
    with src.open("rb") as fin, gzip.open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout)


def test_directory_of_shards_equals_one_file(tmp_path: Path) -> None:
    # Dynamo writes rotating .jsonl.gz segments: split the fixture in two, gzip one of them.
    lines = (FIXTURES / "dynamo_request_trace_v1.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "seg.000001.jsonl").write_text("".join(lines[:3]))
    (tmp_path / "plain.jsonl").write_text("".join(lines[3:]))
    _gzip(tmp_path / "plain.jsonl", tmp_path / "seg.000002.jsonl.gz")
    (tmp_path / "plain.jsonl").unlink()
    (tmp_path / "notes.txt").write_text("not a shard")
    assert load_trace(tmp_path) == load_trace(FIXTURES / "dynamo_request_trace_v1.jsonl")


def test_directory_rejects_plain_and_gzip_copies(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "mooncake_small.jsonl", tmp_path / "a.jsonl")
    _gzip(tmp_path / "a.jsonl", tmp_path / "a.jsonl.gz")
    with pytest.raises(ValueError) as info:
        load_trace(tmp_path)
    assert str(info.value) == f"{tmp_path}: both a.jsonl and a.jsonl.gz; keep one"


def test_directory_rejects_mixed_formats(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "mooncake_small.jsonl", tmp_path / "a.jsonl")
    shutil.copy(FIXTURES / "dynamo_request_trace_v1.jsonl", tmp_path / "b.jsonl")
    with pytest.raises(ValueError) as info:
        load_trace(tmp_path)
    assert str(info.value) == (
        f"{tmp_path / 'b.jsonl'}: dynamo trace mixed with mooncake trace {tmp_path / 'a.jsonl'} in {tmp_path}"
    )


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("fake.jsonl.gz", b'{"timestamp": 0}\n', "cannot read: Not a gzipped file (b'{\"')"),
        (
            "latin1.jsonl",
            b'{"timestamp": 0, "input_length": 1, "output_length": 1, "x": "\xe9"}\n',
            "not UTF-8 text (invalid continuation byte at byte 62)",
        ),
        ("binary.csv", b"\xff\xfe\x00T\x00I", "not UTF-8 text (invalid start byte at byte 0)"),
    ],
    ids=["gz_suffix_not_gzip", "latin1_in_json", "binary_file"],
)
def test_unreadable_files_are_value_errors(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        load_trace(path)
    assert str(info.value) == f"{path}: {message}"


def test_truncated_gzip_is_a_clear_error(tmp_path: Path) -> None:
    _gzip(FIXTURES / "mooncake_small.jsonl", tmp_path / "full.jsonl.gz")
    data = (tmp_path / "full.jsonl.gz").read_bytes()
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) - 12])
    with pytest.raises(ValueError, match=r"cut\.jsonl\.gz: cannot read: "):
        load_trace(tmp_path / "cut.jsonl.gz")


# --- bucket_requests ------------------------------------------------------------------------------


def obs(num_req: float, isl: float | None, osl: float | None, duration_s: float = 60.0) -> TrafficObservation:
    return TrafficObservation(duration_s=duration_s, num_req=num_req, isl=isl, osl=osl)


@dataclass(frozen=True)
class BucketCase:
    name: str
    why: str
    requests: list[TraceRequest]
    interval_s: float
    expected: list[TrafficObservation]


BUCKET_CASES = [
    BucketCase("empty", "no requests, no intervals", [], 60.0, []),
    BucketCase(
        "one_bucket",
        "count and mean ISL/OSL of one interval",
        [R(0.0, 100, 10), R(59.9, 300, 31)],
        60.0,
        [obs(2, 200.0, 20.5)],
    ),
    BucketCase(
        "boundary_goes_to_next",
        "an arrival exactly at the interval boundary opens the next interval",
        [R(0.0, 100, 10), R(60.0, 50, 5)],
        60.0,
        [obs(1, 100.0, 10.0), obs(1, 50.0, 5.0)],
    ),
    BucketCase(
        "gap_is_zero_with_unknown_sizes",
        "empty intervals between traffic are emitted: 0 requests, ISL/OSL unknown (None)",
        [R(1.0, 100, 10), R(200.0, 40, 4)],
        60.0,
        [obs(1, 100.0, 10.0), obs(0, None, None), obs(0, None, None), obs(1, 40.0, 4.0)],
    ),
    BucketCase(
        "starts_at_first_non_empty",
        "intervals before the first request are not emitted",
        [R(130.0, 10, 1), R(125.0, 30, 3)],
        60.0,
        [obs(2, 20.0, 2.0)],
    ),
    BucketCase(
        "fractional_interval",
        "any positive interval; duration_s is the interval",
        [R(0.0, 1, 1), R(0.25, 3, 3), R(0.5, 5, 5)],
        0.5,
        [obs(2, 2.0, 2.0, 0.5), obs(1, 5.0, 5.0, 0.5)],
    ),
]


@pytest.mark.parametrize("case", BUCKET_CASES, ids=lambda c: c.name)
def test_bucket_requests(case: BucketCase) -> None:
    assert bucket_requests(case.requests, case.interval_s) == case.expected, case.why


@pytest.mark.parametrize(
    ("requests", "interval_s", "message"),
    [
        ([R(0.0, 1, 1)], 0.0, "interval_s must be a positive finite number, got 0.0"),
        ([R(0.0, 1, 1)], math.inf, "interval_s must be a positive finite number, got inf"),
        ([R(0.0, 1, 1), R(-1.0, 1, 1)], 60.0, "request 1: arrival_s must be finite and >= 0, got -1.0"),
        ([R(math.nan, 1, 1)], 60.0, "request 0: arrival_s must be finite and >= 0, got nan"),
        ([R(0.0, -1, 1)], 60.0, "request 0: token counts must be >= 0, got isl_tokens=-1, osl_tokens=1"),
    ],
    ids=["zero_interval", "infinite_interval", "negative_arrival", "nan_arrival", "negative_isl"],
)
def test_bucket_requests_rejects(requests: list[TraceRequest], interval_s: float, message: str) -> None:
    with pytest.raises(ValueError) as info:
        bucket_requests(requests, interval_s)
    assert str(info.value) == message


def test_bucketed_fixture() -> None:
    # The Dynamo fixture at 60 s: r0, r1, r2 | r3 | nothing | r4
    got = bucket_requests(load_trace(FIXTURES / "dynamo_request_trace_v1.jsonl"), 60.0)
    assert got == [
        obs(3, (128 + 192 + 320) / 3, (16 + 32 + 48) / 3),
        obs(1, 64.0, 8.0),
        obs(0, None, None),
        obs(1, 1000.0, 100.0),
    ]


# --- the real traces (repository copies) ----------------------------------------------------------


def _azure_independent() -> list[tuple[float, int, int]]:
    with AZURE.open(newline="") as f:
        rows = list(csv.DictReader(f))
    stamps = [datetime.fromisoformat(r["TIMESTAMP"]) for r in rows]  # 3.11 truncates the 7th digit
    t0 = min(stamps)
    return [
        ((s - t0).total_seconds(), int(r["ContextTokens"]), int(r["GeneratedTokens"]))
        for s, r in zip(stamps, rows, strict=True)
    ]


def _mooncake_independent() -> list[tuple[float, int, int]]:
    with MOONCAKE.open() as f:
        rows = [json.loads(line) for line in f if line.strip()]
    t0 = min(r["timestamp"] for r in rows)
    return [((r["timestamp"] - t0) / 1000, r["input_length"], r["output_length"]) for r in rows]


@dataclass(frozen=True)
class RealCase:
    name: str
    why: str
    path: Path
    independent: Callable[[], list[tuple[float, int, int]]]
    total: int  # from data/traces/README.md
    interval_s: float


REAL_CASES = [
    RealCase(
        "azure_conv_600s", "README: 19,366 rows over ~3,502 s", AZURE, _azure_independent, 19_366, 600.0
    ),
    RealCase(
        "azure_conv_180s", "3-minute buckets of the same trace", AZURE, _azure_independent, 19_366, 180.0
    ),
    RealCase(
        "mooncake_arxiv_60s",
        "README: 1,000 rows over 0 → 177 s",
        MOONCAKE,
        _mooncake_independent,
        1_000,
        60.0,
    ),
]


@pytest.mark.parametrize("case", REAL_CASES, ids=lambda c: c.name)
def test_real_trace_buckets(case: RealCase) -> None:
    rows = case.independent()
    requests = load_trace(case.path)
    assert len(requests) == case.total == len(rows), case.why
    assert sorted(rows) == sorted((r.arrival_s, r.isl_tokens, r.osl_tokens) for r in requests)

    buckets = bucket_requests(requests, case.interval_s)
    last_s = max(t for t, _, _ in rows)
    assert len(buckets) == math.floor(last_s / case.interval_s) + 1
    first = [(isl, osl) for t, isl, osl in rows if t < case.interval_s]
    assert buckets[0] == obs(
        len(first),
        sum(i for i, _ in first) / len(first),
        sum(o for _, o in first) / len(first),
        case.interval_s,
    )
    assert sum(b.num_req for b in buckets) == case.total
    # Mean × count adds back up to the trace's token totals (integers, so rounding is exact).
    assert sum(round(b.num_req * b.isl) for b in buckets if b.num_req) == sum(i for _, i, _ in rows)
    assert sum(round(b.num_req * b.osl) for b in buckets if b.num_req) == sum(o for _, _, o in rows)


@pytest.mark.parametrize(
    ("path", "interval_s", "counts"),
    [
        (AZURE, 600.0, [2867, 3118, 4123, 4068, 3125, 2065]),
        (MOONCAKE, 60.0, [313, 330, 357]),
    ],
    ids=["azure_conv_600s", "mooncake_arxiv_60s"],
)
def test_real_trace_bucket_counts_literal(path: Path, interval_s: float, counts: list[int]) -> None:
    # Literal figures (computed once with datetime.fromisoformat / json and a Counter), so a change
    # that broke both the parser and the independent readers above could not slip through.
    assert [b.num_req for b in bucket_requests(load_trace(path), interval_s)] == counts


def test_azure_trace_span() -> None:
    # README: 3,502 s; the last request arrives 3501.721937 s after the first.
    assert load_trace(AZURE)[-1].arrival_s == 3501.721937


# --- warm start -----------------------------------------------------------------------------------


def test_warm_start_from_mooncake_trace() -> None:
    buckets = bucket_requests(load_trace(MOONCAKE), 60.0)
    rows = _mooncake_independent()
    last_start = 60.0 * (len(buckets) - 1)
    last = [(isl, osl) for t, isl, osl in rows if t >= last_start]

    predictor = TrafficPredictor("constant", {})
    assert predictor.warm(buckets) == len(buckets) == 3
    forecast = predictor.forecast()
    assert forecast is not None
    assert (forecast.num_req, forecast.isl, forecast.osl) == (
        len(last),
        sum(i for i, _ in last) / len(last),
        sum(o for _, o in last) / len(last),
    )
    assert forecast.notes == ()
    # The idle skip is re-armed: a quiet first live interval is not taken as traffic stopping.
    predictor.observe(TrafficObservation(60.0, 0.0, None, None))
    assert predictor.history_len == 3
    assert predictor.forecast() == forecast


def test_warm_start_from_dynamo_fixture_with_gap() -> None:
    # r0..r2 | r3 | (empty) | r4: the empty interval's 0 requests are history, its sizes unknown.
    predictor = TrafficPredictor("kalman", {"min_points": 3})
    buckets = bucket_requests(load_trace(FIXTURES / "dynamo_request_trace_v1.jsonl"), 60.0)
    assert predictor.warm(buckets) == 4
    assert predictor.history_lens == {"num_req": 4, "isl": 3, "osl": 3}
    forecast = predictor.forecast()
    assert forecast is not None
    assert (forecast.isl, forecast.osl) != (1000.0, 100.0)  # 3 of 3 points: the filter answers
    assert forecast.notes == ()
