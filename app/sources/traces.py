"""Request-trace files for predictor warm start (and later replay): read, validate, normalise.

`load_trace(path)` detects the format from the first non-empty line and returns the requests
sorted by arrival, with arrival times in seconds relative to the earliest request:

- **Mooncake JSONL** (FAST'25): one object per line with `timestamp` (ms), `input_length` and
  `output_length` (non-negative integers); other keys (`hash_ids`, ...) are ignored.
- **Azure LLM inference trace** CSV (Splitwise, 2023/2024): header
  `TIMESTAMP,ContextTokens,GeneratedTokens`, `TIMESTAMP` like `2023-11-16 18:17:03.9799600`
  (fraction digits beyond microseconds are dropped).
- **Dynamo request trace v1** JSONL: records with `schema == "dynamo.request.trace.v1"` (the
  record itself or wrapped in `{"event": {...}}`); only `event_type == "request_end"` records
  are requests, other event types (`tool_end`, ...) are skipped. Fields, as Dynamo's
  `planner/offline/trace_data.py` reads them: `request.request_received_ms` (absolute ms),
  `request.replay.input_length`, `request.output_tokens`. Dynamo's sink writes rotating
  `.jsonl.gz` segments, so gzip files are read too, and `path` may be a directory of
  `.jsonl` / `.jsonl.gz` shards (one format for all of them; the time origin is the earliest
  request across the shards; `x.jsonl` next to `x.jsonl.gz` is refused as a duplicate).

Every problem is a `ValueError` naming the file, the line and the field, e.g.
`trace.jsonl:3: input_length: must be a non-negative integer, got "12"`. A file without any
request is an error too: a configured warm-up trace that warms nothing is a mistake.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any, Literal

from app.core.traces import TraceRequest

__all__ = ["TraceFormat", "TraceRequest", "detect_format", "load_trace"]

TraceFormat = Literal["mooncake", "azure", "dynamo"]

DYNAMO_SCHEMA = "dynamo.request.trace.v1"
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

# (arrival in the file's own time unit and origin, isl, osl); converted to relative seconds at the end
_Row = tuple[float, int, int]


def load_trace(path: str | Path) -> list[TraceRequest]:
    """Read a Mooncake, Azure or Dynamo v1 trace file (or a directory of Dynamo/Mooncake shards)."""
    files = _trace_files(Path(path))
    formats = {f: detect_format(f) for f in files}
    first_format = formats[files[0]]
    for f, fmt in formats.items():
        if fmt != first_format:
            raise ValueError(f"{f}: {fmt} trace mixed with {first_format} trace {files[0]} in {path}")
    if first_format == "azure" and len(files) > 1:
        raise ValueError(f"{path}: a directory of Azure CSV traces is not supported; give one file")

    rows: list[_Row] = []
    for f in files:
        rows.extend(_read_rows(f, first_format))
    if not rows:
        raise ValueError(f"{path}: no requests in the trace")

    # Mooncake and Dynamo times are ms, Azure times are already seconds (from the first row).
    per_s = 1.0 if first_format == "azure" else 1000.0
    origin = min(r[0] for r in rows)
    requests = [TraceRequest((t - origin) / per_s, isl, osl) for t, isl, osl in rows]
    requests.sort(key=lambda r: r.arrival_s)  # stable: ties keep file order
    return requests


def detect_format(path: str | Path) -> TraceFormat:
    """The format of one trace file, from its first non-empty line."""
    path = Path(path)
    with _reading(path), _open(path) as stream:
        for line_no, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                fmt = _json_record_format(_parse_json(path, line_no, line))
                if fmt is None:
                    raise ValueError(
                        f"{path}:{line_no}: unrecognised JSON trace record: expected Mooncake "
                        f"(timestamp, input_length, output_length) or schema {DYNAMO_SCHEMA!r}"
                    )
                return fmt
            header = tuple(c.strip().lstrip("\ufeff") for c in next(csv.reader([line])))
            if all(c in header for c in AZURE_COLUMNS):
                return "azure"
            raise ValueError(
                f"{path}:{line_no}: unrecognised trace format: neither JSON lines nor a CSV "
                f"header with {', '.join(AZURE_COLUMNS)}"
            )
    raise ValueError(f"{path}: empty trace file")


def _trace_files(path: Path) -> list[Path]:
    if path.is_dir():
        shards = sorted(
            p for p in path.rglob("*") if p.is_file() and p.name.endswith((".jsonl", ".jsonl.gz"))
        )
        plain = {p for p in shards if p.name.endswith(".jsonl")}
        for p in shards:
            if p.name.endswith(".gz") and p.with_name(p.name[:-3]) in plain:
                raise ValueError(f"{path}: both {p.with_name(p.name[:-3]).name} and {p.name}; keep one")
        if not shards:
            raise ValueError(f"{path}: no .jsonl or .jsonl.gz trace files in the directory")
        return shards
    if not path.is_file():
        raise ValueError(f"{path}: no such trace file")
    return [path]


def _open(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")


def _read_rows(path: Path, fmt: TraceFormat) -> Iterator[_Row]:
    with _reading(path):
        if fmt == "azure":
            yield from _azure_rows(path)
        else:
            yield from _jsonl_rows(path, fmt)


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Undecodable or unreadable files become a ValueError naming the file."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except (OSError, EOFError) as exc:  # e.g. a truncated or fake gzip file
        raise ValueError(f"{path}: cannot read: {exc}") from exc


# --- JSON lines -----------------------------------------------------------------------------------


def _parse_json(path: Path, line_no: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{line_no}: invalid JSON: {exc.msg} (column {exc.colno})") from exc
    if not isinstance(record, dict):
        raise ValueError(f"{path}:{line_no}: a trace record must be a JSON object")
    return record


def _dynamo_event(record: dict[str, Any]) -> Any:
    return record.get("event", record)


def _json_record_format(record: dict[str, Any]) -> TraceFormat | None:
    event = _dynamo_event(record)
    if isinstance(event, dict) and event.get("schema") == DYNAMO_SCHEMA:
        return "dynamo"
    if all(k in record for k in ("timestamp", "input_length", "output_length")):
        return "mooncake"
    return None


def _jsonl_rows(path: Path, fmt: TraceFormat) -> Iterator[_Row]:
    with _open(path) as stream:
        for line_no, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            record = _parse_json(path, line_no, line)
            found = _json_record_format(record)
            if found != fmt:
                raise ValueError(
                    f"{path}:{line_no}: expected a {fmt} record like the first line, "
                    f"found {found or 'an unrecognised record'}"
                )
            where = f"{path}:{line_no}"
            if fmt == "mooncake":
                yield (
                    _number(record, "timestamp", where),
                    _length(record, "input_length", where),
                    _length(record, "output_length", where),
                )
                continue
            event = _dynamo_event(record)
            if event.get("event_type") != "request_end":
                continue
            request = event.get("request")
            if not isinstance(request, dict):
                raise ValueError(f"{where}: request: missing or not an object in a request_end record")
            replay = request.get("replay")
            if not isinstance(replay, dict):
                raise ValueError(f"{where}: request.replay: missing or not an object")
            yield (
                _number(request, "request_received_ms", where, prefix="request."),
                _length(replay, "input_length", where, prefix="request.replay."),
                _length(request, "output_tokens", where, prefix="request."),
            )


def _number(record: dict[str, Any], key: str, where: str, prefix: str = "") -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}: {prefix}{key}: must be a finite number, got {json.dumps(value)}")
    return float(value)


def _length(record: dict[str, Any], key: str, where: str, prefix: str = "") -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: {prefix}{key}: must be a non-negative integer, got {json.dumps(value)}")
    return value


# --- Azure CSV ------------------------------------------------------------------------------------


def _azure_rows(path: Path) -> Iterator[_Row]:
    first: datetime | None = None
    with _open(path) as stream:
        reader = csv.reader(stream)
        header: tuple[str, ...] = ()
        for row in reader:
            if any(c.strip() for c in row):
                header = tuple(c.strip().lstrip("\ufeff") for c in row)
                break
        columns = {name: header.index(name) for name in AZURE_COLUMNS}
        for row in reader:
            line_no = reader.line_num
            if not any(c.strip() for c in row):
                continue
            where = f"{path}:{line_no}"
            if len(row) != len(header):
                raise ValueError(f"{where}: expected {len(header)} columns, got {len(row)}")
            stamp = _azure_timestamp(row[columns["TIMESTAMP"]], where)
            if first is None:
                first = stamp
            yield (
                (stamp - first) / timedelta(seconds=1),
                _azure_int(row[columns["ContextTokens"]], "ContextTokens", where),
                _azure_int(row[columns["GeneratedTokens"]], "GeneratedTokens", where),
            )


def _azure_timestamp(text: str, where: str) -> datetime:
    text = text.strip()
    whole, _, fraction = text.partition(".")
    try:
        stamp = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
        if fraction:
            if not fraction.isdigit():
                raise ValueError(fraction)
            stamp += timedelta(microseconds=int(fraction[:6].ljust(6, "0")))
    except ValueError:
        raise ValueError(
            f"{where}: TIMESTAMP: expected 'YYYY-MM-DD HH:MM:SS[.fraction]', got {text!r}"
        ) from None
    return stamp


def _azure_int(text: str, column: str, where: str) -> int:
    text = text.strip()
    if not text.isdigit():
        raise ValueError(f"{where}: {column}: must be a non-negative integer, got {text!r}")
    return int(text)
