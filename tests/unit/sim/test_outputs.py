"""A replay's outputs (app/sim/replay/outputs.py, app/sim/replay/report.py) on a hand-built ReplayResult whose
expected numbers are worked out by hand below, not by the code under test."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from app.sim.replay.outputs import (
    DECISION_COLUMNS,
    REPLICA_COLUMNS,
    REQUEST_COLUMNS,
    summarize,
    target_changes,
    write_outputs,
)
from app.sim.replay.report import (
    HOLD,
    MIXED,
    SCALE_DOWN,
    SCALE_UP,
    _build_figure,
    binned_percentiles,
    decision_kinds,
    render_report,
)
from app.sim.replay.request_table import request_table
from app.sim.replay.results import DecisionEvent, OracleStep, ReplayResult
from app.sim.world.cluster import ReplicaSample
from app.sim.world.engines import SimRequest

TTFT_TARGET_MS = 250.0
ITL_TARGET_MS = 25.0
POLICY = "sla-policy<v2>"
TRACE = "tiny & trace.jsonl"
REASON_UP = 'ttft forecast 310 ms > 250 ms, "prefill" <short>'


def _request(
    i: int,
    arrival_s: float,
    osl: int,
    first_token_s: float | None = None,
    finish_s: float | None = None,
    *,
    decode: bool = True,
) -> SimRequest:
    r = SimRequest(i, arrival_s, isl=100 * (i + 1), osl=osl)
    if first_token_s is not None:
        r.prefill_engine = "prefill-1"
        r.first_token_s = first_token_s
        if decode and osl > 1:
            r.decode_engine = "decode-1"
            r.decode_start_s = first_token_s
    r.finish_s = finish_s
    return r


def _requests() -> list[SimRequest]:
    # (TTFT ms, mean ITL ms) per request, targets 250 / 25 ms:
    return [
        _request(0, 0.0, 5, 0.125, 0.175),  # 125, 12.5: met
        _request(1, 1.0, 3, 1.5, 1.52),  # 500, 10: misses TTFT only
        _request(2, 2.0, 3, 2.1, 2.2),  # 100, 50: misses ITL only
        _request(3, 3.0, 4, 3.2, None),  # 200, unfinished: a miss, though its TTFT was met
        _request(4, 4.0, 1, 4.05, 4.05),  # 50, one token (no ITL): met
        _request(5, 5.0, 1, 5.3, 5.3),  # 300, one token: misses TTFT
        _request(6, 6.0, 2),  # never started
        _request(7, 7.0, 1),  # never started, one token: no ITL, still a miss
    ]


TIMELINE = [
    ReplicaSample(0.0, "prefill", 1, 1, 1, 0, 0),
    ReplicaSample(0.0, "decode", 2, 2, 2, 0, 0),
    ReplicaSample(10.0, "prefill", 3, 3, 1, 2, 0),  # +2
    ReplicaSample(40.0, "prefill", 3, 3, 3, 0, 0),  # engines became ready: no action
    ReplicaSample(50.0, "prefill", 2, 3, 2, 0, 1),  # -1
    ReplicaSample(50.0, "decode", 1, 2, 1, 0, 1),  # -1
    ReplicaSample(52.0, "prefill", 2, 2, 2, 0, 0),
    ReplicaSample(55.0, "decode", 1, 1, 1, 0, 0),
]

DECISIONS = [
    DecisionEvent(10.0, {"prefill": 3, "decode": 2}, REASON_UP),
    DecisionEvent(30.0, None, "within SLO"),
    DecisionEvent(50.0, {"prefill": 2, "decode": 1}, "load fell, releasing"),
]


def _result(*, oracle_gpu_hours: float = 0.04, requests: list[SimRequest] | None = None) -> ReplayResult:
    return ReplayResult(
        policy=POLICY,
        trace=TRACE,
        ttft_target_ms=TTFT_TARGET_MS,
        itl_target_ms=ITL_TARGET_MS,
        startup_delay_s=30.0,
        truth_scale=1.2,
        gpus_per_engine={"prefill": 1, "decode": 2},
        requests=_requests() if requests is None else requests,
        timeline=list(TIMELINE),
        decisions=list(DECISIONS),
        gpu_hours=0.05,
        oracle_gpu_hours=oracle_gpu_hours,
        oracle_timeline=[
            OracleStep(0.0, {"prefill": 1, "decode": 1}),
            OracleStep(30.0, {"prefill": 2, "decode": 1}),
        ],
        end_s=60.0,
        wall_s=0.5,
        settings={"tick_s": 10.0, "profile": Path("profiles/x.json")},
    )


# --- summary --------------------------------------------------------------------------------------


def test_attainment_counts_unfinished_as_misses_and_one_token_outputs_by_ttft_only() -> None:
    s = summarize(_result())
    assert s["requests"] == 8
    assert s["completed"] == 5
    assert s["unfinished"] == 3
    assert s["slo_attainment"] == pytest.approx(2 / 8)  # requests 0 and 4
    assert s["ttft_attainment"] == pytest.approx(4 / 8)  # 0, 2, 3, 4
    assert s["itl_attainment"] == pytest.approx(4 / 8)  # 0, 1, 4, 5


def test_latency_percentiles_are_over_finished_requests() -> None:
    s = summarize(_result())
    # Finished TTFTs sorted: 50, 100, 125, 300, 500 ms (request 3's 200 ms is left out).
    assert s["ttft_ms"] == pytest.approx({"p50": 125.0, "p90": 420.0, "p99": 492.0, "mean": 215.0})
    # Finished multi-token ITLs sorted: 10, 12.5, 50 ms; p90 at index 1.8: 12.5 + 0.8 * 37.5.
    assert s["itl_ms"] == pytest.approx({"p50": 12.5, "p90": 42.5, "p99": 49.25, "mean": 72.5 / 3})


def test_scaling_actions_and_churn_count_target_changes_per_role() -> None:
    actions, churn = target_changes(TIMELINE)
    assert actions == {"prefill": 2, "decode": 1}
    assert churn == {"prefill": 3, "decode": 1}
    s = summarize(_result())
    assert s["scaling_actions"] == 3
    assert s["scaling_actions_by_role"] == {"prefill": 2, "decode": 1}
    assert s["replica_churn"] == 4


def test_summary_costs_times_and_settings() -> None:
    s = summarize(_result())
    assert s["policy"] == POLICY and s["trace"] == TRACE
    assert s["gpu_hours"] == pytest.approx(0.05)
    assert s["oracle_gpu_hours"] == pytest.approx(0.04)
    assert s["gpu_hours_over_oracle"] == pytest.approx(1.25)
    assert s["targets"] == {"ttft_ms": 250.0, "itl_ms": 25.0}
    assert s["startup_delay_s"] == 30.0 and s["truth_scale"] == 1.2
    assert s["simulated_s"] == 60.0 and s["wall_s"] == 0.5
    assert s["simulated_s_per_wall_s"] == pytest.approx(120.0)
    assert s["decisions"] == 3
    assert s["settings"]["tick_s"] == 10.0
    assert summarize(_result(oracle_gpu_hours=0.0))["gpu_hours_over_oracle"] is None


def test_summary_of_an_empty_run_has_no_numbers_to_make_up() -> None:
    s = summarize(_result(requests=[]))
    assert s["requests"] == 0 and s["completed"] == 0
    assert s["slo_attainment"] is None and s["ttft_attainment"] is None
    assert s["ttft_ms"] == {"p50": None, "p90": None, "p99": None, "mean": None}


# --- files ----------------------------------------------------------------------------------------


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def test_write_outputs_writes_every_file(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    paths = write_outputs(_result(), out)
    assert {k: p.name for k, p in paths.items()} == {
        "summary": "summary.json",
        "requests": "requests.csv.gz",
        "replicas": "replicas.csv",
        "decisions": "decisions.csv",
        "report": "report.html",
    }
    assert all(p.parent == out and p.is_file() for p in paths.values())

    summary = json.loads(paths["summary"].read_text(encoding="utf-8"))
    assert summary["slo_attainment"] == pytest.approx(2 / 8)
    assert summary["settings"] == {"tick_s": 10.0, "profile": "profiles/x.json"}

    header, rows = _read_csv(paths["replicas"])
    assert tuple(header) == REPLICA_COLUMNS
    assert len(rows) == len(TIMELINE)
    assert rows[2] == {
        "at_s": "10.0",
        "role": "prefill",
        "target": "3",
        "billed": "3",
        "ready": "1",
        "starting": "2",
        "draining": "0",
    }


def test_requests_csv_values_and_empty_cells_for_unknowns(tmp_path: Path) -> None:
    paths = write_outputs(_result(), tmp_path)
    header, rows = _read_csv(paths["requests"])
    assert tuple(header) == REQUEST_COLUMNS
    assert len(rows) == 8
    assert [r["id"] for r in rows] == [str(i) for i in range(8)]

    met = rows[0]
    assert (met["isl"], met["osl"], met["prefill_engine"], met["decode_engine"]) == (
        "100",
        "5",
        "prefill-1",
        "decode-1",
    )
    assert float(met["ttft_ms"]) == pytest.approx(125.0)
    assert float(met["itl_ms"]) == pytest.approx(12.5)
    assert float(met["e2e_s"]) == pytest.approx(0.175)
    assert met["met_slo"] == "1"

    unfinished = rows[3]
    assert float(unfinished["ttft_ms"]) == pytest.approx(200.0)
    assert (unfinished["itl_ms"], unfinished["e2e_s"], unfinished["met_slo"]) == ("", "", "0")

    one_token = rows[4]
    assert (one_token["decode_engine"], one_token["itl_ms"], one_token["met_slo"]) == ("", "", "1")

    for never_started in rows[6:]:
        assert [never_started[c] for c in REQUEST_COLUMNS[4:]] == ["", "", "", "", "", "0"]

    # The CSV and the summary apply the same rule.
    assert sum(int(r["met_slo"]) for r in rows) / len(rows) == pytest.approx(2 / 8)


def test_decisions_csv_quotes_reasons_and_leaves_no_change_targets_empty(tmp_path: Path) -> None:
    paths = write_outputs(_result(), tmp_path)
    header, rows = _read_csv(paths["decisions"])
    assert tuple(header) == DECISION_COLUMNS
    assert rows == [
        {"at_s": "10.0", "target_prefill": "3", "target_decode": "2", "reason": REASON_UP},
        {"at_s": "30.0", "target_prefill": "", "target_decode": "", "reason": "within SLO"},
        {"at_s": "50.0", "target_prefill": "2", "target_decode": "1", "reason": "load fell, releasing"},
    ]


def test_write_outputs_uses_the_given_summary(tmp_path: Path) -> None:
    given = summarize(_result()) | {"note": "from the caller"}
    paths = write_outputs(_result(), tmp_path, summary=given)
    assert json.loads(paths["summary"].read_text(encoding="utf-8"))["note"] == "from the caller"


def test_an_empty_run_still_writes_headers(tmp_path: Path) -> None:
    paths = write_outputs(_result(requests=[]), tmp_path)
    header, rows = _read_csv(paths["requests"])
    assert tuple(header) == REQUEST_COLUMNS and rows == []
    assert paths["report"].read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


# --- report ---------------------------------------------------------------------------------------


def test_report_is_one_self_contained_escaped_page() -> None:
    result = _result()
    page = render_report(result, summarize(result))
    assert page.startswith("<!DOCTYPE html>")
    assert page.rstrip().endswith("</html>")
    assert page.count("<body>") == 1 and page.count("</body>") == 1
    assert 'class="plotly-graph-div"' in page
    assert page.count("Plotly.newPlot") == 1
    assert page.count("* plotly.js v") == 1  # the library, inline, once
    assert "<script src=" not in page
    # Names and reasons are text, never markup.
    assert "sla-policy&lt;v2&gt;" in page and POLICY not in page
    assert "tiny &amp; trace.jsonl" in page
    assert "<short>" not in page
    # Headline numbers: 2/8 SLO attainment, GPU-hours 1.25 × the oracle's, 3 scaling actions.
    assert "25.00 %" in page
    assert "1.250" in page
    assert "3 (prefill 2, decode 1), churn 4" in page


def test_the_latency_panels_label_decades_only() -> None:
    # The same log axis as the live report (app/plotting.py): a label per decade.
    result = _result()
    fig = _build_figure(result, request_table(result.requests, TTFT_TARGET_MS, ITL_TARGET_MS))
    layout = fig.layout.to_plotly_json()
    axes = [a for n, a in layout.items() if n.startswith("yaxis") and a.get("type") == "log"]
    assert axes and all(a["dtick"] == 1 and a["minor"]["dtick"] == "D1" for a in axes), axes


def test_decision_kinds_compare_with_the_target_in_force() -> None:
    assert decision_kinds(DECISIONS, {"prefill": 1, "decode": 2}) == [SCALE_UP, HOLD, SCALE_DOWN]
    same = DecisionEvent(60.0, {"prefill": 2, "decode": 1}, "unchanged")
    mixed = DecisionEvent(70.0, {"prefill": 3, "decode": 0}, "rebalance")
    assert decision_kinds([*DECISIONS, same, mixed], {"prefill": 1, "decode": 2})[3:] == [HOLD, MIXED]


def test_binned_percentiles_match_numpy_per_bin() -> None:
    rng = np.random.default_rng(7)
    times_s = rng.uniform(0.0, 100.0, 2000)
    values = rng.lognormal(0.0, 1.0, 2000)
    values[::17] = np.nan  # unknown latencies are left out
    starts_s, pct = binned_percentiles(times_s, values, 10.0, (50.0, 99.0))
    assert starts_s.tolist() == [10.0 * k for k in range(10)]
    for k, start in enumerate(starts_s):
        in_bin = (times_s >= start) & (times_s < start + 10.0) & ~np.isnan(values)
        assert pct[:, k] == pytest.approx(np.percentile(values[in_bin], [50.0, 99.0]))


def test_binned_percentiles_by_hand() -> None:
    times_s = np.array([0.5, 1.0, 9.9, 25.0, 21.0])
    values = np.array([3.0, 1.0, 2.0, 10.0, 20.0])
    starts_s, pct = binned_percentiles(times_s, values, 10.0, (50.0, 100.0))
    assert starts_s.tolist() == [0.0, 20.0]  # the empty bin 10-20 s is not reported
    assert pct.tolist() == [[2.0, 15.0], [3.0, 20.0]]
