"""`planner replay` as a real process: its outputs, and one-line errors for bad input."""

from __future__ import annotations

import csv
import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = REPO_ROOT / "data" / "traces" / "mooncake_trace_arxiv_first1000.jsonl"


def replay(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "replay", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _slice(tmp_path: Path, rows: int) -> Path:
    """The first `rows` requests of the bundled Mooncake arXiv slice (real timing)."""
    path = tmp_path / "slice.jsonl"
    path.write_text("".join(MOONCAKE.read_text().splitlines(keepends=True)[:rows]))
    return path


@pytest.mark.timeout(300)
@pytest.mark.parametrize("policy", ["planner", "static", "reactive", "oracle"])
def test_a_replay_writes_its_outputs(tmp_path: Path, policy: str) -> None:
    trace = _slice(tmp_path, 300)
    out = tmp_path / "out"
    run = replay(
        "--trace", str(trace), "--policy", policy, "--rate-scale", "3", "--startup-delay-s", "30",
        "--ttft-ms", "2000", "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert f"{policy}: 900 requests" in run.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == policy
    assert summary["requests"] == 900
    assert summary["completed"] == 900
    assert summary["targets"] == {"ttft_ms": 2000.0, "itl_ms": 30.0}
    assert summary["startup_delay_s"] == 30.0
    for key in ("p50", "p90", "p99"):
        assert summary["ttft_ms"][key] > 0 and summary["itl_ms"][key] > 0
    assert summary["ttft_ms"]["p50"] <= summary["ttft_ms"]["p90"] <= summary["ttft_ms"]["p99"]
    assert summary["gpu_hours"] > 0 and summary["oracle_gpu_hours"] > 0

    with gzip.open(out / "requests.csv.gz", "rt") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 900
    met = sum(int(r["met_slo"]) for r in rows)
    assert met / 900 == pytest.approx(summary["slo_attainment"])
    with (out / "replicas.csv").open() as f:
        replicas = list(csv.DictReader(f))
    assert {r["role"] for r in replicas} == {"prefill", "decode"}
    assert replicas[0]["at_s"] == "0.0"
    html = (out / "report.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html>")
    assert policy in html


def test_flags_reach_the_run(tmp_path: Path) -> None:
    trace = _slice(tmp_path, 100)
    out = tmp_path / "out"
    run = replay(
        "--trace", str(trace), "--policy", "seed", "--truth-scale", "1.2", "--itl-ms", "40",
        "--prefill-gpus", "2", "--seed", "3", "--modes", "throughput", "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["truth_scale"] == 1.2
    assert summary["targets"]["itl_ms"] == 40.0
    assert summary["gpus_per_engine"] == {"prefill": 2, "decode": 1}
    assert summary["settings"]["seed"] == 3
    assert summary["settings"]["modes"] == ["throughput"]


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        ("none", ["--trace", "missing.jsonl"], "planner: error: --trace: "),
        ("garbage", ["--trace", "{trace}"], "planner: error: --trace: "),
        ("empty", ["--trace", "{trace}"], "empty trace file"),
        ("header", ["--trace", "{trace}"], "no requests"),
        ("good", ["--trace", "{trace}", "--truth-scale", "0"], "--truth-scale: must be a number > 0"),
        ("good", ["--trace", "{trace}", "--policy", "magic"], "--policy: invalid choice: 'magic'"),
        ("good", ["--trace", "{trace}", "--modes", "load,fast"], "--modes: expected load,throughput"),
        (
            "good",
            ["--trace", "{trace}", "--modes", "load"],
            "--modes: the seed's modes; use them with --policy seed",
        ),
        ("good", ["--trace", "{trace}", "--config", "nope.yaml"], "nope.yaml: replay file not found"),
        ("good", ["--trace", "{trace}", "--profile", "/nonexistent"], "profile: "),
        (
            "good",
            ["--trace", "{trace}", "--startup-delay-s", "-1"],
            "--startup-delay-s: must be a number >= 0",
        ),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(
    tmp_path: Path, setup: str, args: list[str], message: str
) -> None:
    trace = tmp_path / "trace.jsonl"
    if setup == "garbage":
        trace.write_text("this is not a trace\n")
    elif setup == "empty":
        trace.write_text("\n")
    elif setup == "header":
        trace = tmp_path / "trace.csv"
        trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    elif setup == "good":
        trace = _slice(tmp_path, 5)
    out = tmp_path / "out"
    run = replay(*[a.replace("{trace}", str(trace)) for a in args], "--out", str(out))
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("planner: error: ")
    assert message in lines[0]
    assert not (out / "summary.json").exists()


PROGRESS = re.compile(
    r"^replay planner: sim (\d+)(?:/(\d+))? s (?:\((\d+)%\)|\(draining after the last arrival at \d+ s\)), "
    r"(\d+) ticks, (\d+)/(\d+) requests done, ([\d.]+) s wall$"
)
SUMMARY = re.compile(r"^planner: \d+ requests, .*; ([\d.]+) s wall in all \(([\d.]+) s replaying ")


def test_a_replay_shows_progress_and_its_whole_wall_time(tmp_path: Path) -> None:
    """A replay printed nothing until its end, then a time that left out loading the trace, the
    oracle and writing the outputs (0.1 s for a command of several seconds)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    command = [
        sys.executable,
        "-m",
        "app.cli",
        "replay",
        "--trace",
        str(MOONCAKE),
        "--out",
        str(tmp_path / "out"),
    ]
    stderr_path = tmp_path / "stderr.log"
    with stderr_path.open("w") as stderr:
        started = time.monotonic()
        proc = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        assert proc.stdout is not None
        summary, seen_s = None, None
        for line in proc.stdout:
            if SUMMARY.match(line):
                summary, seen_s = line, time.monotonic() - started
        assert proc.wait(timeout=300) == 0, stderr_path.read_text()
    assert summary is not None and seen_s is not None, "no summary line"
    reported_s, replaying_s = (float(x) for x in SUMMARY.match(summary).groups())  # type: ignore[union-attr]
    # The command's time, from its process's start to the summary: at most what the test saw
    # (plus rounding), and short of it by no more than the process's creation.
    assert seen_s - 1.0 <= reported_s <= seen_s + 0.1, (reported_s, seen_s)
    assert replaying_s < reported_s

    progress = [m for m in map(PROGRESS.match, stderr_path.read_text().splitlines()) if m]
    assert len(progress) >= 3, stderr_path.read_text()  # the trace is 177 s: a line at least per 60 s
    sims = [int(m.group(1)) for m in progress]
    done = [int(m.group(5)) for m in progress]
    walls = [float(m.group(7)) for m in progress]
    assert sims == sorted(sims) and done == sorted(done) and walls == sorted(walls)
    assert {int(m.group(6)) for m in progress} == {1000}
    assert all(w <= reported_s for w in walls)


def test_quiet_prints_no_progress(tmp_path: Path) -> None:
    run = replay("--trace", str(_slice(tmp_path, 100)), "--quiet", "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert SUMMARY.match(run.stdout.splitlines()[0])


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("/proc/nope/x", "planner: error: --out: cannot write to /proc/nope/x: "),
        ("{tmp}/a-file/x", "planner: error: --out: cannot write to {tmp}/a-file/x: Not a directory"),
        ("{tmp}/a-file", "planner: error: --out: {tmp}/a-file exists and is not a folder"),
    ],
    ids=["proc", "under-a-file", "a-file"],
)
def test_a_bad_out_fails_before_the_replay(tmp_path: Path, out: str, message: str) -> None:
    """It was a traceback after the whole replay."""
    (tmp_path / "a-file").write_text("")
    out = out.replace("{tmp}", str(tmp_path))
    run = replay("--trace", str(MOONCAKE), "--out", out)
    assert run.returncode == 2
    # One line and nothing else: not even the trace was read, let alone replayed.
    assert run.stderr.splitlines() == [run.stderr.strip()], run.stderr
    assert run.stderr.startswith(message.replace("{tmp}", str(tmp_path))), run.stderr
    assert run.stdout == ""
