"""`planner plan` as a real process: the sanity figures, the table, and one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
H200 = REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"
PRE_SWEPT = (
    REPO_ROOT
    / "data"
    / "profiles"
    / "pre-swept"
    / "h200_sxm"
    / "vllm"
    / "nvidia"
    / "Llama-3.1-8B-Instruct-FP8"
)
SANITY = ("--isl", "3000", "--osl", "150", "--ttft-ms", "500", "--itl-ms", "50")


def planner(*args: str, tmp_path: Path, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    """`planner ARGS` with exactly these PLANNER_* variables (none inherited from the shell)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
    env.update(
        {
            "PLANNER_DATABASE_URL": f"sqlite:///{tmp_path / 'unused.db'}",
            "PLANNER_CONFIG": str(REPO_ROOT / "examples" / "planner.yaml"),
            "PLANNER_HOST": "127.0.0.1",
            "PLANNER_PORT": "8080",
            "PLANNER_API_TOKENS": "",
            "PLANNER_LOG_LEVEL": "INFO",
            "PYTHONPATH": str(REPO_ROOT),
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "plan", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@dataclass(frozen=True)
class Sanity:
    name: str
    why: str
    args: tuple[str, ...]
    num_prefill: int
    num_decode: int


SANITY_CASES = [
    Sanity("10-rps", "product sanity figure: 1 prefill + 1 decode", ("--rps", "10", *SANITY), 1, 1),
    Sanity("20-rps", "product sanity figure: 2 prefill + 1 decode", ("--rps", "20", *SANITY), 2, 1),
    Sanity(
        "20-rps-pre-swept",
        "the pre-swept copy of the same data gives the same answer",
        ("--rps", "20", *SANITY, "--profile", str(PRE_SWEPT)),
        2,
        1,
    ),
    Sanity(
        "20-rps-two-gpu-prefill",
        "2-GPU prefill engines: ceil(60000/49481/2) = 1",
        ("--rps", "20", *SANITY, "--prefill-gpus", "2"),
        1,
        1,
    ),
    Sanity(
        "idle-min-zero",
        "no load and no minimum: nothing",
        ("--rps", "0", *SANITY, "--min-replicas", "0"),
        0,
        0,
    ),
    Sanity("500-rps", "ceil(1500000/49481) = 31, ceil(75000/6795) = 12", ("--rps", "500", *SANITY), 31, 12),
]


@pytest.mark.parametrize("case", SANITY_CASES, ids=lambda c: c.name)
def test_plan_json(case: Sanity, tmp_path: Path) -> None:
    result = planner(*case.args, "--json", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert len(lines) == 1, "--json prints one JSON object"
    out = json.loads(lines[0])
    assert (out["num_prefill"], out["num_decode"]) == (case.num_prefill, case.num_decode), case.why
    assert out["prefill_thpt_per_gpu"] == pytest.approx(49481.093527696125, rel=1e-9)
    assert out["decode_thpt_per_gpu"] == pytest.approx(6794.772011902521, rel=1e-9)
    assert out["expected_ttft_ms"] == pytest.approx(60.45866867507649, rel=1e-9)
    assert out["expected_itl_ms"] == pytest.approx(41.70781893771626, rel=1e-9)
    assert (out["isl"], out["osl"], out["ttft_ms"], out["itl_ms"]) == (3000, 150, 500, 50)
    assert (out["ttft_met"], out["itl_met"], out["decode_kv_usage"], out["decode_context_tokens"]) == (
        True,
        True,
        1.0,
        3075,
    )


def test_plan_json_echoes_the_inputs(tmp_path: Path) -> None:
    result = planner("--rps", "10", *SANITY, "--decode-gpus", "2", "--json", tmp_path=tmp_path)
    out = json.loads(result.stdout)
    assert {k: out[k] for k in ("profile", "rps", "prefill_gpus", "decode_gpus", "min_replicas")} == {
        "profile": str(H200),
        "rps": 10,
        "prefill_gpus": 1,
        "decode_gpus": 2,
        "min_replicas": 1,
    }
    assert out["prefill_reason"] == "30000 tok/s / 49481 tok/s/GPU / 1 GPU -> 1"
    assert out["decode_reason"] == (
        "1500 tok/s / 6795 tok/s/GPU / 2 GPU -> 1; ITL 50 ms met at 41.7 ms (kv 100%, context 3075)"
    )


def test_plan_table(tmp_path: Path) -> None:
    result = planner("--rps", "20", *SANITY, "--ttft-ms", "50", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"profile  {H200}",
        "load     20 req/s, ISL 3000, OSL 150 tokens",
        "",
        "role     replicas GPUs/engine  tok/s/GPU  expected latency",
        "prefill         2           1    49481.1  TTFT 60.5 ms (MISSES 50 ms)",
        "decode          1           1     6794.8  ITL 41.7 ms (meets 50 ms) at 100% KV usage",
        "",
        "prefill: 60000 tok/s / 49481 tok/s/GPU / 1 GPU -> 2",
        "decode: 3000 tok/s / 6795 tok/s/GPU / 1 GPU -> 1; ITL 50 ms met at 41.7 ms (kv 100%, context 3075)",
    ]


def test_relative_profile_is_relative_to_the_working_directory(tmp_path: Path) -> None:
    shutil.copytree(H200, tmp_path / "mine")
    result = planner("--rps", "20", *SANITY, "--profile", "mine", "--json", tmp_path=tmp_path, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["num_prefill"] == 2


# --- errors: one line, naming the flag (or the file and key), exit 2 --------------------------------


def _broken_profile(tmp: Path) -> Path:
    root = tmp / "broken"
    shutil.copytree(H200, root)
    target = root / "selected_decode_interpolation" / "raw_data.npz"
    with np.load(target, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k != "z_thpt_per_gpu"}
    np.savez(target, **arrays)
    return root


@dataclass(frozen=True)
class Fail:
    name: str
    why: str
    args: tuple[str, ...]
    message: str  # the whole stderr line; "{tmp}" is tmp_path


BASE = ("--rps", "10", "--osl", "150", "--ttft-ms", "500", "--itl-ms", "50")
FAIL_CASES = [
    Fail(
        "missing-isl",
        "required flags are named",
        BASE,
        "planner: error: the following arguments are required: --isl",
    ),
    Fail(
        "isl-not-a-number",
        "names the flag and the value",
        (*BASE, "--isl", "lots"),
        "planner: error: argument --isl: must be a number > 0 and <= 1e+07, got 'lots'",
    ),
    Fail(
        "isl-zero",
        "an empty prompt has no prefill",
        (*BASE, "--isl", "0"),
        "planner: error: argument --isl: must be a number > 0 and <= 1e+07, got '0'",
    ),
    Fail(
        "itl-negative",
        "a latency target is positive",
        ("--rps", "10", "--isl", "3000", "--osl", "150", "--ttft-ms", "500", "--itl-ms", "-5"),
        "planner: error: argument --itl-ms: must be a number > 0 and <= 3.6e+06, got '-5'",
    ),
    Fail(
        "rps-nan",
        "float('nan') parses; it must not pass",
        ("--rps", "nan", "--isl", "3000", "--osl", "150", "--ttft-ms", "500", "--itl-ms", "50"),
        "planner: error: argument --rps: must be a number >= 0 and <= 1e+06, got 'nan'",
    ),
    Fail(
        "rps-inf",
        "infinite load has no replica count",
        ("--rps", "inf", "--isl", "3000", "--osl", "150", "--ttft-ms", "500", "--itl-ms", "50"),
        "planner: error: argument --rps: must be a number >= 0 and <= 1e+06, got 'inf'",
    ),
    Fail(
        "rps-finite-but-absurd",
        "1e308 req/s is finite, and overflowed the replica count into a traceback",
        ("--rps", "1e308", "--isl", "3000", "--osl", "150", "--ttft-ms", "500", "--itl-ms", "50"),
        "planner: error: argument --rps: must be a number >= 0 and <= 1e+06, got '1e308'",
    ),
    Fail(
        "isl-absurd",
        "a 1e308-token prompt printed a 300-digit context length",
        (*BASE, "--isl", "1e308"),
        "planner: error: argument --isl: must be a number > 0 and <= 1e+07, got '1e308'",
    ),
    Fail(
        "itl-target-absurd",
        "a target of 1e308 ms is a unit mistake, not an SLA",
        ("--rps", "10", "--isl", "3000", "--osl", "150", "--ttft-ms", "500", "--itl-ms", "1e308"),
        "planner: error: argument --itl-ms: must be a number > 0 and <= 3.6e+06, got '1e308'",
    ),
    Fail(
        "prefill-gpus-absurd",
        "no engine spans 10^23 GPUs",
        (*BASE, "--isl", "3000", "--prefill-gpus", "100000000000000000000000"),
        "planner: error: argument --prefill-gpus: must be an integer >= 1 and <= 1024, "
        "got '100000000000000000000000'",
    ),
    Fail(
        "prefill-gpus-zero",
        "an engine has at least one GPU",
        (*BASE, "--isl", "3000", "--prefill-gpus", "0"),
        "planner: error: argument --prefill-gpus: must be an integer >= 1 and <= 1024, got '0'",
    ),
    Fail(
        "decode-gpus-fraction",
        "GPUs come whole",
        (*BASE, "--isl", "3000", "--decode-gpus", "1.5"),
        "planner: error: argument --decode-gpus: must be an integer >= 1 and <= 1024, got '1.5'",
    ),
    Fail(
        "min-replicas-negative",
        "a count",
        (*BASE, "--isl", "3000", "--min-replicas", "-1"),
        "planner: error: argument --min-replicas: must be an integer >= 0 and <= 100000, got '-1'",
    ),
    Fail(
        "profile-missing",
        "a typo in the path",
        (*BASE, "--isl", "3000", "--profile", "{tmp}/nope"),
        "planner: error: --profile: {tmp}/nope: no such file or directory",
    ),
    Fail(
        "profile-broken",
        "names the file and the key",
        (*BASE, "--isl", "3000", "--profile", "{tmp}/broken"),
        "planner: error: --profile: {tmp}/broken/selected_decode_interpolation/raw_data.npz: z_thpt_per_gpu: "
        "missing (keys present: max_kv_tokens, x_kv_usage, y_context_length, z_itl)",
    ),
]


@pytest.mark.parametrize("case", FAIL_CASES, ids=lambda c: c.name)
def test_plan_errors(case: Fail, tmp_path: Path) -> None:
    _broken_profile(tmp_path)
    args = tuple(a.replace("{tmp}", str(tmp_path)) for a in case.args)
    result = planner(*args, tmp_path=tmp_path)
    assert result.returncode == 2, case.why
    assert result.stdout == ""
    assert result.stderr.splitlines() == [case.message.replace("{tmp}", str(tmp_path))], case.why
