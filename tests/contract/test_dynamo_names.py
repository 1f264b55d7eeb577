"""Every Dynamo name the planner depends on, checked against what Dynamo 1.6.1 really exports.

The fixtures in tests/data/dynamo-1.6.1/ were recorded from a live stack (the real
`dynamo.frontend` and `dynamo.mocker` workers of ai-dynamo 1.6.1, deploy/dynamo-local/, by
tests/data/dynamo-1.6.1/record.py): the frontend's `/metrics`, raw ZMQ messages of the workers'
ForwardPassMetrics publishers, and the file-discovery records. docs/dynamo-live.md lists the names.

The last test also asks Dynamo 1.6.1 itself (its venv, .venv-dynamo) for its FPM schema and has
it decode the recorded messages; it is skipped only when that venv is absent (CI installs it).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
from pathlib import Path

import msgpack
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.core.perf.fpm import ForwardPassMetrics
from app.sources import traffic_common as names
from app.sources.dynamo_discovery import DEFAULT_COMPONENTS, FPM_TOPIC, FileDiscovery
from app.sources.fpm_wire import unwrap_event_frame
from app.sources.frontend_scrape import difference, parse_metrics
from tests.support import REPO_ROOT

DATA = REPO_ROOT / "tests" / "data" / "dynamo-1.6.1"
METRICS = (DATA / "frontend_metrics.txt").read_text()
FPM_MESSAGES = json.loads((DATA / "fpm_event_plane.json").read_text())["messages"]
MODEL = "tiny"  # the recorded stack's model name
DYNAMO_PYTHON = Path(os.environ.get("DYNAMO_PYTHON", REPO_ROOT / ".venv-dynamo" / "bin" / "python"))


# --- the frontend's /metrics ---------------------------------------------------------------------


def families() -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(METRICS)}


@pytest.mark.parametrize("field", sorted(names.HISTOGRAMS))
def test_every_histogram_the_planner_reads_is_exported_with_its_unit(field: str) -> None:
    metric, factor = names.HISTOGRAMS[field]
    family = families().get(metric)
    assert family is not None, f"Dynamo 1.6.1's frontend exports no {metric}"
    assert family.type == "histogram"
    samples = {s.name for s in family.samples if s.labels.get("model") == MODEL}
    assert {f"{metric}_sum", f"{metric}_count", f"{metric}_bucket"} <= samples
    # The unit the planner converts from: seconds (×1000 to ms) or tokens (×1).
    unit = "seconds" if metric.endswith("_seconds") else "tokens"
    assert (unit, factor) in {("seconds", 1000.0), ("seconds", 1.0), ("tokens", 1.0)}
    if field.endswith("_ms"):
        assert unit == "seconds" and factor == 1000.0
    assert unit in family.documentation.lower() or metric.endswith("_duration_seconds")


@pytest.mark.parametrize("field", sorted(names.GAUGES))
def test_every_gauge_scale_to_zero_wakes_on_is_exported_per_model(field: str) -> None:
    metric = names.GAUGES[field]
    family = families().get(metric)
    assert family is not None, f"Dynamo 1.6.1's frontend exports no {metric}"
    assert family.type == "gauge"
    assert [s.labels for s in family.samples] == [{"model": MODEL}]


def test_the_request_counters_and_their_labels() -> None:
    fams = families()
    started = fams["dynamo_frontend_requests_started"]  # the parser drops `_total`
    assert started.type == "counter"
    labels = [s.labels for s in started.samples if s.name == names.REQUESTS_STARTED_TOTAL]
    # One series per (endpoint, request_type): the planner sums every series of the model.
    assert {(lab["endpoint"], lab["request_type"]) for lab in labels} == {
        ("completions", "stream"),
        ("completions", "unary"),
    }
    assert all(lab["model"] == MODEL for lab in labels)
    total = [s.labels for s in fams["dynamo_frontend_requests"].samples if s.name == names.REQUESTS_TOTAL]
    assert total and all(
        {"model", "status", "endpoint", "request_type", "error_type"} <= set(t) for t in total
    )


def test_frontend_series_carry_model_but_no_namespace_label() -> None:
    """The frontend itself labels its series with `model` only: a `dynamo_namespace` label (the
    Prometheus source groups by it and examples filter on it) comes from the scrape configuration
    (Dynamo's Kubernetes PodMonitor), never from the frontend's own exposition."""
    for metric, _ in names.HISTOGRAMS.values():
        for sample in families()[metric].samples:
            assert "model" in sample.labels
            assert "dynamo_namespace" not in sample.labels


def test_the_isl_histogram_buckets_end_with_inf() -> None:
    bounds = [
        s.labels["le"]
        for s in families()[names.INPUT_SEQUENCE_TOKENS].samples
        if s.name.endswith("_bucket") and s.labels.get("model") == MODEL
    ]
    assert bounds[-1] == "+Inf" and len(bounds) > 5


def test_the_scrape_parser_reads_every_series_it_needs() -> None:
    """From nothing to the recorded scrape: every field of the observation is known."""
    samples = parse_metrics(METRICS)
    diff = difference({}, samples, MODEL)
    assert diff.num_req is not None and diff.num_req > 0
    assert not [n for n in diff.notes if "no series" in n and "requests_started" in n], diff.notes
    for field, (total, count) in diff.histograms.items():
        assert total is not None and count is not None and count > 0, field
    assert diff.isl_buckets and math.isclose(sum(c for _, c in diff.isl_buckets), diff.histograms["isl"][1])
    # The model label matches case-insensitively (the frontend lower-cases names).
    assert difference({}, samples, MODEL.upper()).num_req == diff.num_req


# --- ForwardPassMetrics on the event plane -------------------------------------------------------


def frames(message: dict) -> list[bytes]:
    return [bytes.fromhex(h) for h in message["frames"]]


WIRE_KEYS = {
    "version",
    "worker_id",
    "dp_rank",
    "counter_id",
    "wall_time",
    "scheduled_requests",
    "queued_requests",
}


@pytest.mark.parametrize("i", range(len(FPM_MESSAGES)))
def test_event_plane_messages_are_four_frames_with_an_enveloped_record(i: int) -> None:
    message = FPM_MESSAGES[i]
    topic, publisher_id, sequence, frame = frames(message)
    assert topic == FPM_TOPIC.encode()
    assert len(publisher_id) == 8 and len(sequence) == 8
    envelope = msgpack.unpackb(frame[5:], raw=False)
    assert set(envelope) == {"publisher_id", "sequence", "published_at", "topic", "payload"}
    assert envelope["publisher_id"] == int.from_bytes(publisher_id, "big")
    assert envelope["sequence"] == int.from_bytes(sequence, "big")
    payload = unwrap_event_frame(frame)
    assert payload == envelope["payload"]
    obj = msgpack.unpackb(payload, raw=False)
    assert set(obj) == WIRE_KEYS and obj["version"] == 1
    record = ForwardPassMetrics.from_wire(obj)
    ours = record.as_wire()
    # Every field the planner reads has Dynamo's name, nested the same way.
    assert set(ours) | {"version", "counter_id"} == WIRE_KEYS
    assert set(ours["scheduled_requests"]) == set(obj["scheduled_requests"])
    assert set(ours["queued_requests"]) == set(obj["queued_requests"])
    assert record.worker_id == obj["worker_id"] and record.worker_id.isdigit()  # a decimal u64
    assert record.wall_time_s == obj["wall_time"]  # seconds


def test_the_recording_has_busy_iterations_and_heartbeats_of_both_roles() -> None:
    seen = set()
    for message in FPM_MESSAGES:
        record = ForwardPassMetrics.from_wire(msgpack.unpackb(unwrap_event_frame(frames(message)[3])))
        seen.add((message["component"], record.is_heartbeat))
    assert seen == {("prefill", True), ("prefill", False), ("backend", True), ("backend", False)}


@pytest.mark.parametrize(
    "frame, reason",
    [
        (b"\x01\x00", "shorter than its 5-byte header"),
        (b"\x02\x00\x00\x00\x01\x80", "version 2"),
        (b"\x01\x00\x00\x00\x05\x80", "says 5 bytes"),
        (b"\x01\x00\x00\x00\x01\xc1", "not msgpack"),
        (b"\x01\x00\x00\x00\x01\x80", "payload missing"),
    ],
    ids=["short", "version", "length", "not-msgpack", "no-payload"],
)
def test_a_bad_event_frame_says_what_is_wrong(frame: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        unwrap_event_frame(frame)


# --- discovery -----------------------------------------------------------------------------------


@pytest.fixture
def discovery_dir(tmp_path: Path) -> Path:
    """The recorded records, fresh (discovery ignores records untouched for 10 s)."""
    root = tmp_path / "kv"
    shutil.copytree(DATA / "discovery", root)
    now = time.time()
    for path in root.rglob("*"):
        os.utime(path, (now, now))
    return root


def test_discovery_names_each_roles_fpm_publisher(discovery_dir: Path) -> None:
    d = FileDiscovery(discovery_dir)
    prefill = d.fpm_addresses(DEFAULT_COMPONENTS["prefill"])
    decode = d.fpm_addresses(DEFAULT_COMPONENTS["decode"])
    assert len(prefill) == 1 and len(decode) == 1 and prefill != decode
    assert all(a.startswith("tcp://127.0.0.1:") for a in prefill + decode)


def test_discovery_worker_ids_are_the_fpm_worker_ids(discovery_dir: Path) -> None:
    d = FileDiscovery(discovery_dir)
    cards = {w.component: w for w in d.workers()}
    assert {c: w.worker_type for c, w in cards.items()} == {"prefill": "prefill", "backend": "decode"}
    fpm_ids = {
        m["component"]: ForwardPassMetrics.from_wire(
            msgpack.unpackb(unwrap_event_frame(frames(m)[3]))
        ).worker_id
        for m in FPM_MESSAGES
    }
    assert {c: str(w.instance_id) for c, w in cards.items()} == fpm_ids


def test_stale_records_are_not_workers(discovery_dir: Path) -> None:
    d = FileDiscovery(discovery_dir, clock=lambda: time.time() + 60)
    assert d.fpm_publishers() == [] and d.workers() == []
    assert FileDiscovery(discovery_dir / "missing").fpm_publishers() == []


# --- Dynamo 1.6.1 itself -------------------------------------------------------------------------

DYNAMO_CHECK = r"""
import json, sys
import msgspec
from dynamo.common import forward_pass_metrics as f
from dynamo.prometheus_names import frontend_service as fs
out = {
    "fields": list(f.ForwardPassMetrics.__struct_fields__),
    "scheduled": list(f.ScheduledRequestMetrics.__struct_fields__),
    "queued": list(f.QueuedRequestMetrics.__struct_fields__),
    "version": f.FPM_VERSION,
    "decoded": [msgspec.to_builtins(f.decode(bytes.fromhex(p))) for p in json.loads(sys.stdin.read())],
    "names": {k: getattr(fs, k) for k in dir(fs) if k.isupper()},
}
print(json.dumps(out))
"""


@pytest.mark.skipif(
    not DYNAMO_PYTHON.exists(), reason="Dynamo's venv is absent: bash bench/install_dynamo.sh"
)
def test_dynamo_1_6_1_agrees_with_the_planners_names() -> None:
    payloads = [unwrap_event_frame(frames(m)[3]).hex() for m in FPM_MESSAGES]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"DYN_LOG": "error"}
    done = subprocess.run(
        [str(DYNAMO_PYTHON), "-c", DYNAMO_CHECK],
        input=json.dumps(payloads),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    dynamo = json.loads(done.stdout.strip().splitlines()[-1])
    probe = ForwardPassMetrics(worker_id="1", dp_rank=0, wall_time_s=0.5).as_wire()
    assert set(dynamo["fields"]) == set(probe) | {"version", "counter_id"}
    assert dynamo["scheduled"] == list(probe["scheduled_requests"])
    assert dynamo["queued"] == list(probe["queued_requests"])
    assert dynamo["version"] == 1
    for payload, theirs in zip(payloads, dynamo["decoded"], strict=True):
        ours = ForwardPassMetrics.from_wire(msgpack.unpackb(bytes.fromhex(payload)))
        assert ours.as_wire() == {k: v for k, v in theirs.items() if k not in ("version", "counter_id")}
    # The frontend's metric names, from Dynamo's own list (prefix dynamo_frontend_).
    exported = {f"dynamo_frontend_{v}" for v in dynamo["names"].values() if isinstance(v, str)}
    for metric, _ in names.HISTOGRAMS.values():
        assert metric in exported, metric
    assert names.REQUESTS_STARTED_TOTAL in exported and names.REQUESTS_TOTAL in exported
