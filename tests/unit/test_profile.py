"""Profiles: validation of Dynamo's keys (core) and every file layout the loader accepts (source).

Fixtures come from the H200 Llama-3.1-8B-FP8 profile copied into data/profiles/ (see its README);
broken and JSON variants are written into tmp_path from it."""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.core.errors import ProfileError
from app.core.perf.profile import profile_from_mappings, select_configuration
from app.sources.profile_files import load_profile

REPO_ROOT = Path(__file__).resolve().parents[2]
LIVE = REPO_ROOT / "data" / "profiles" / "h200-llama3.1-8b-fp8"
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
PREFILL_NPZ = LIVE / "selected_prefill_interpolation" / "raw_data.npz"
DECODE_NPZ = LIVE / "selected_decode_interpolation" / "raw_data.npz"


def npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


PREFILL = npz(PREFILL_NPZ)
DECODE = npz(DECODE_NPZ)


# --- the copied data is what the README says ------------------------------------------------------


def test_copied_profile_matches_the_readme() -> None:
    assert len(PREFILL["prefill_isl"]) == 17
    assert (PREFILL["prefill_isl"][0], PREFILL["prefill_isl"][-1]) == (100, 16372)
    assert len(DECODE["x_kv_usage"]) == 41
    assert (DECODE["y_context_length"].min(), DECODE["y_context_length"].max()) == (350.0, 13585.0)
    assert DECODE["max_kv_tokens"].tolist() == [945029]


# --- validation table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    name: str
    why: str
    side: str  # which mapping the change applies to
    change: Callable[[dict[str, Any]], None]
    key: str | None
    reason: str


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data[key] = value

    return change


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        del data[key]

    return change


def _at(key: str, index: int, value: float) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        array = np.array(data[key], dtype=np.float64)
        array[index] = value
        data[key] = array

    return change


BAD = [
    Bad(
        "prefill-key-missing",
        "a profile without TTFT cannot give expected_ttft_ms",
        "prefill",
        _drop("prefill_ttft"),
        "prefill_ttft",
        "missing (keys present: prefill_isl, prefill_thpt_per_gpu)",
    ),
    Bad(
        "prefill-2d",
        "a pre-swept row block is not one configuration",
        "prefill",
        _set("prefill_isl", PREFILL["prefill_isl"].reshape(1, -1)),
        "prefill_isl",
        "expected a 1-D array, got shape (1, 17)",
    ),
    Bad(
        "prefill-lengths-differ",
        "each ISL needs its TTFT and throughput",
        "prefill",
        _set("prefill_thpt_per_gpu", PREFILL["prefill_thpt_per_gpu"][:16]),
        "prefill_thpt_per_gpu",
        "has 16 values but prefill_isl has 17",
    ),
    Bad(
        "prefill-not-numeric",
        "strings in a JSON profile",
        "prefill",
        _set("prefill_ttft", ["fast"] * 17),
        "prefill_ttft",
        "not numeric",
    ),
    Bad(
        "prefill-nan",
        "NaN would poison every interpolated value",
        "prefill",
        _at("prefill_ttft", 3, float("nan")),
        "prefill_ttft",
        "value nan at index 3 is not finite",
    ),
    Bad(
        "prefill-isl-zero",
        "ISL is a token count",
        "prefill",
        _at("prefill_isl", 0, 0),
        "prefill_isl",
        "value 0 at index 0 is not > 0 tokens",
    ),
    Bad(
        "prefill-isl-repeated",
        "cubic interpolation needs distinct ISLs",
        "prefill",
        _at("prefill_isl", 1, 100),
        "prefill_isl",
        "ISL 100 appears more than once",
    ),
    Bad(
        "prefill-ttft-negative",
        "a latency is positive",
        "prefill",
        _at("prefill_ttft", 2, -1.5),
        "prefill_ttft",
        "value -1.5 at index 2 is not > 0 ms",
    ),
    Bad(
        "prefill-thpt-negative",
        "throughput cannot be negative",
        "prefill",
        _at("prefill_thpt_per_gpu", 5, -10),
        "prefill_thpt_per_gpu",
        "value -10 at index 5 is not >= 0 tokens/s/GPU",
    ),
    Bad(
        "prefill-too-few",
        "interp1d(kind='cubic') needs four points",
        "prefill",
        lambda d: d.update({k: np.asarray(v)[:3] for k, v in d.items()}),
        "prefill_isl",
        "3 points; cubic interpolation needs at least 4",
    ),
    Bad(
        "decode-kv-above-one",
        "KV usage is a fraction of the cache",
        "decode",
        _at("x_kv_usage", 7, 1.2),
        "x_kv_usage",
        "value 1.2 at index 7 is not a fraction in [0, 1]",
    ),
    Bad(
        "decode-kv-negative",
        "KV usage is a fraction of the cache",
        "decode",
        _at("x_kv_usage", 0, -0.01),
        "x_kv_usage",
        "value -0.01 at index 0 is not a fraction in [0, 1]",
    ),
    Bad(
        "decode-context-zero",
        "context length is a token count",
        "decode",
        _at("y_context_length", 4, 0),
        "y_context_length",
        "value 0 at index 4 is not > 0 tokens",
    ),
    Bad(
        "decode-itl-zero",
        "an ITL of 0 ms would meet every target",
        "decode",
        _at("z_itl", 9, 0),
        "z_itl",
        "value 0 at index 9 is not > 0 ms",
    ),
    Bad(
        "decode-thpt-inf",
        "infinite throughput would plan zero engines",
        "decode",
        _at("z_thpt_per_gpu", 2, float("inf")),
        "z_thpt_per_gpu",
        "value inf at index 2 is not finite",
    ),
    Bad(
        "decode-lengths-differ",
        "every point needs all four coordinates",
        "decode",
        _set("z_itl", DECODE["z_itl"][:40]),
        "z_itl",
        "has 40 values but x_kv_usage has 41",
    ),
    Bad(
        "decode-max-kv-missing",
        "concurrency -> KV usage needs the cache size",
        "decode",
        _drop("max_kv_tokens"),
        "max_kv_tokens",
        "missing (keys present: x_kv_usage, y_context_length, z_itl, z_thpt_per_gpu)",
    ),
    Bad(
        "decode-max-kv-two-values",
        "one cache size per profile",
        "decode",
        _set("max_kv_tokens", np.array([945029, 1])),
        "max_kv_tokens",
        "expected one integer, got shape (2,)",
    ),
    Bad(
        "decode-max-kv-fraction",
        "a token count is whole",
        "decode",
        _set("max_kv_tokens", 945029.5),
        "max_kv_tokens",
        "expected a positive integer, got 945030",
    ),
    Bad(
        "decode-max-kv-zero",
        "the KV usage formula divides by it",
        "decode",
        _set("max_kv_tokens", [0]),
        "max_kv_tokens",
        "expected a positive integer, got 0",
    ),
    Bad(
        "decode-max-kv-text",
        "a JSON string is not a count",
        "decode",
        _set("max_kv_tokens", "lots"),
        "max_kv_tokens",
        "not numeric",
    ),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.name)
def test_invalid_profile_names_file_and_key(case: Bad) -> None:
    prefill, decode = dict(PREFILL), dict(DECODE)
    case.change(prefill if case.side == "prefill" else decode)
    with pytest.raises(ProfileError) as caught:
        profile_from_mappings(prefill, decode, source="test", prefill_path="p.npz", decode_path="d.npz")
    err = caught.value
    assert (err.path, err.key, err.reason) == (
        "p.npz" if case.side == "prefill" else "d.npz",
        case.key,
        case.reason,
    ), case.why
    assert str(err) == f"{err.path}: {case.key}: {case.reason}"


def test_valid_profile_is_typed_and_sorted_by_isl() -> None:
    order = np.arange(17)[::-1]  # the same points, listed from the largest ISL down
    prefill = {k: v[order] for k, v in PREFILL.items()}
    decode = {**DECODE, "max_kv_tokens": 945029}  # JSON gives a scalar
    profile = profile_from_mappings(prefill, decode, source="s", prefill_path="p", decode_path="d")
    assert profile.prefill.isl_tokens.tolist() == PREFILL["prefill_isl"].astype(float).tolist()
    assert profile.prefill.ttft_ms.tolist() == PREFILL["prefill_ttft"].tolist()
    assert profile.prefill.thpt_per_gpu.tolist() == PREFILL["prefill_thpt_per_gpu"].tolist()
    assert profile.decode.kv_usage.tolist() == DECODE["x_kv_usage"].tolist()
    assert profile.decode.context_tokens.tolist() == DECODE["y_context_length"].tolist()
    assert profile.decode.itl_ms.tolist() == DECODE["z_itl"].tolist()
    assert profile.decode.thpt_per_gpu.tolist() == DECODE["z_thpt_per_gpu"].tolist()
    assert (profile.decode.max_kv_tokens, profile.source) == (945029, "s")
    assert (profile.prefill.path, profile.decode.path) == ("p", "d")
    assert profile.prefill.isl_tokens.flags.writeable is False


# --- pre-swept configuration selection (core, no files) ---------------------------------------------


def two_configurations() -> dict[str, Any]:
    """A pre-swept prefill block with two rows: tp 1 (the measured data) and tp 2 (doubled throughput)."""
    rows = {
        "prefill_isl": np.vstack([PREFILL["prefill_isl"]] * 2),
        "prefill_ttft": np.vstack([PREFILL["prefill_ttft"]] * 2),
        "prefill_thpt_per_gpu": np.vstack(
            [PREFILL["prefill_thpt_per_gpu"], PREFILL["prefill_thpt_per_gpu"] * 2]
        ),
    }
    columns = {
        "gpu_type": np.array([["h200_sxm"], ["h200_sxm"]]),
        "framework": np.array([["vllm"], ["vllm"]]),
        "tp": np.array([[1], [2]]),
    }
    return {**rows, **columns}


@dataclass(frozen=True)
class Select:
    name: str
    why: str
    select: dict[str, object] | None
    row: int | None  # the row picked, or None for an error
    key: str | None = None
    reason: str = ""


SELECT = [
    Select("default-first-row", "Dynamo's default configuration is the first", None, 0),
    Select("empty-select", "no criteria is the default", {}, 0),
    Select("by-int", "tp 2 is the second row", {"tp": 2}, 1),
    Select("by-text-from-a-flag", "'2' from a command line matches the integer column", {"tp": "2"}, 1),
    Select("several-columns", "every column must match", {"gpu_type": "h200_sxm", "tp": 1}, 0),
    Select(
        "unknown-column",
        "a misspelt column is an error, not the first row",
        {"tensor_parallel": 2},
        None,
        "tensor_parallel",
        "not a configuration column (columns: gpu_type, framework, tp)",
    ),
    Select(
        "data-key-is-not-a-column",
        "data arrays cannot select",
        {"prefill_isl": 100},
        None,
        "prefill_isl",
        "not a configuration column (columns: gpu_type, framework, tp)",
    ),
    Select(
        "no-such-value",
        "names the column and what it offers",
        {"tp": 4},
        None,
        "tp",
        "no configuration has 4 (available: 1, 2)",
    ),
    Select(
        "several-columns-second-row",
        "the first row fails tp, the second matches all",
        {"tp": 2, "framework": "vllm", "gpu_type": "h200_sxm"},
        1,
    ),
]


@pytest.mark.parametrize("case", SELECT, ids=lambda c: c.name)
def test_select_configuration(case: Select) -> None:
    data = two_configurations()
    keys = ("prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu")
    if case.row is None:
        with pytest.raises(ProfileError) as caught:
            select_configuration(data, case.select, path="prefill.npz", data_keys=keys)
        assert (caught.value.path, caught.value.key, caught.value.reason) == (
            "prefill.npz",
            case.key,
            case.reason,
        ), case.why
        return
    chosen = select_configuration(data, case.select, path="prefill.npz", data_keys=keys)
    assert sorted(chosen) == sorted(keys)
    assert chosen["prefill_thpt_per_gpu"].tolist() == data["prefill_thpt_per_gpu"][case.row].tolist(), (
        case.why
    )


def test_select_no_row_matches_every_value() -> None:
    data = two_configurations()
    data["framework"] = np.array([["vllm"], ["sglang"]])
    with pytest.raises(ProfileError) as caught:
        select_configuration(
            data, {"tp": 1, "framework": "sglang"}, path="prefill.npz", data_keys=("prefill_isl",)
        )
    assert (caught.value.key, caught.value.reason) == (
        "tp,framework",
        "no configuration matches all of them (available: tp=1, framework=vllm; tp=2, framework=sglang)",
    )


# --- file layouts (source) ------------------------------------------------------------------------


def make_testdata_layout(tmp_path: Path) -> Path:
    """Dynamo's test-data layout: prefill/raw_data.npz and decode/raw_data.npz."""
    root = tmp_path / "testdata"
    for side, source in (("prefill", PREFILL_NPZ), ("decode", DECODE_NPZ)):
        (root / side).mkdir(parents=True)
        shutil.copy(source, root / side / "raw_data.npz")
    return root


def make_json_layout(tmp_path: Path, *, decode_only: bool = False) -> Path:
    """Dynamo's ConfigMap fallback: the same keys as JSON, max_kv_tokens a scalar."""
    root = tmp_path / "json"
    root.mkdir()
    decode = {k: v.tolist() for k, v in DECODE.items()}
    decode["max_kv_tokens"] = int(DECODE["max_kv_tokens"][0])
    (root / "decode_raw_data.json").write_text(json.dumps(decode))
    if decode_only:
        (root / "selected_prefill_interpolation").mkdir()
        shutil.copy(PREFILL_NPZ, root / "selected_prefill_interpolation" / "raw_data.npz")
    else:
        (root / "prefill_raw_data.json").write_text(json.dumps({k: v.tolist() for k, v in PREFILL.items()}))
    return root


@dataclass(frozen=True)
class Layout:
    name: str
    why: str
    make: Callable[[Path], Path]
    prefill_file: str  # relative to the returned path's directory
    decode_file: str
    select: dict[str, object] | None = None


LAYOUTS = [
    Layout(
        "live",
        "what a live Dynamo planner reads",
        lambda tmp: LIVE,
        "selected_prefill_interpolation/raw_data.npz",
        "selected_decode_interpolation/raw_data.npz",
    ),
    Layout(
        "testdata",
        "Dynamo's planner test data",
        make_testdata_layout,
        "prefill/raw_data.npz",
        "decode/raw_data.npz",
    ),
    Layout(
        "pre-swept-dir", "the shipped pre-swept results", lambda tmp: PRE_SWEPT, "prefill.npz", "decode.npz"
    ),
    Layout(
        "pre-swept-file",
        "either file of the pair names the pair",
        lambda tmp: PRE_SWEPT / "decode.npz",
        "prefill.npz",
        "decode.npz",
    ),
    Layout(
        "pre-swept-selected",
        "the configuration columns of the shipped row",
        lambda tmp: PRE_SWEPT,
        "prefill.npz",
        "decode.npz",
        {"gpu_type": "h200_sxm", "model": "nvidia/Llama-3.1-8B-Instruct-FP8", "tp": "1", "gpu_count": 8},
    ),
    Layout(
        "json",
        "Dynamo's ConfigMap fallback",
        make_json_layout,
        "prefill_raw_data.json",
        "decode_raw_data.json",
    ),
    Layout(
        "json-file",
        "either JSON file names the pair",
        lambda tmp: make_json_layout(tmp) / "prefill_raw_data.json",
        "prefill_raw_data.json",
        "decode_raw_data.json",
    ),
    Layout(
        "npz-prefill-json-decode",
        "Dynamo falls back to JSON per side",
        lambda tmp: make_json_layout(tmp, decode_only=True),
        "selected_prefill_interpolation/raw_data.npz",
        "decode_raw_data.json",
    ),
]


@pytest.mark.parametrize("case", LAYOUTS, ids=lambda c: c.name)
def test_every_layout_loads_the_same_numbers(case: Layout, tmp_path: Path) -> None:
    path = case.make(tmp_path)
    profile = load_profile(path, select=case.select)
    directory = path if path.is_dir() else path.parent
    assert profile.source == str(path)
    assert (profile.prefill.path, profile.decode.path) == (
        str(directory / case.prefill_file),
        str(directory / case.decode_file),
    ), case.why
    assert profile.prefill.isl_tokens.tolist() == PREFILL["prefill_isl"].astype(float).tolist()
    assert profile.prefill.ttft_ms.tolist() == PREFILL["prefill_ttft"].tolist()
    assert profile.prefill.thpt_per_gpu.tolist() == PREFILL["prefill_thpt_per_gpu"].tolist()
    assert profile.decode.itl_ms.tolist() == DECODE["z_itl"].tolist()
    assert profile.decode.thpt_per_gpu.tolist() == DECODE["z_thpt_per_gpu"].tolist()
    assert profile.decode.kv_usage.tolist() == DECODE["x_kv_usage"].tolist()
    assert profile.decode.context_tokens.tolist() == DECODE["y_context_length"].tolist()
    assert profile.decode.max_kv_tokens == 945029


def test_pre_swept_picks_the_selected_row(tmp_path: Path) -> None:
    # Two configurations on disk: the loader must take the tp 2 row from both files.
    prefill = two_configurations()
    decode_rows = {k: np.vstack([v, v]) for k, v in DECODE.items() if k != "max_kv_tokens"}
    decode_rows["z_thpt_per_gpu"][1] *= 3
    decode = {
        **decode_rows,
        "max_kv_tokens": np.array([[945029], [500000]]),
        "gpu_type": prefill["gpu_type"],
        "framework": prefill["framework"],
        "tp": prefill["tp"],
    }
    np.savez(tmp_path / "prefill.npz", **prefill)
    np.savez(tmp_path / "decode.npz", **decode)
    profile = load_profile(tmp_path, select={"tp": 2})
    assert profile.prefill.thpt_per_gpu.tolist() == (PREFILL["prefill_thpt_per_gpu"] * 2).tolist()
    assert profile.decode.thpt_per_gpu.tolist() == (DECODE["z_thpt_per_gpu"] * 3).tolist()
    assert profile.decode.max_kv_tokens == 500000
    first = load_profile(tmp_path)
    assert first.decode.max_kv_tokens == 945029


# --- broken files ---------------------------------------------------------------------------------


def _live_copy(tmp: Path) -> Path:
    root = tmp / "live"
    shutil.copytree(LIVE, root)
    return root


def _rewrite_decode(tmp: Path, **changes: Any) -> Path:
    root = _live_copy(tmp)
    data = {k: v for k, v in DECODE.items() if k not in changes or changes[k] is not None}
    data.update({k: v for k, v in changes.items() if v is not None})
    np.savez(root / "selected_decode_interpolation" / "raw_data.npz", **data)
    return root


def _garbage_prefill(tmp: Path) -> Path:
    root = _live_copy(tmp)
    (root / "selected_prefill_interpolation" / "raw_data.npz").write_bytes(b"this is not a zip archive\n")
    return root


def _truncated_prefill(tmp: Path) -> Path:
    root = _live_copy(tmp)
    target = root / "selected_prefill_interpolation" / "raw_data.npz"
    target.write_bytes(PREFILL_NPZ.read_bytes()[:300])
    return root


def _npy_instead(tmp: Path) -> Path:
    root = _live_copy(tmp)
    with open(root / "selected_prefill_interpolation" / "raw_data.npz", "wb") as f:
        np.save(f, PREFILL["prefill_isl"])
    return root


def _json(tmp: Path, text: str) -> Path:
    root = make_json_layout(tmp)
    (root / "prefill_raw_data.json").write_text(text)
    return root


def _not_utf8(tmp: Path) -> Path:
    root = make_json_layout(tmp)
    (root / "prefill_raw_data.json").write_bytes(b"\xff\xfe{")
    return root


def _lonely_pre_swept(tmp: Path) -> Path:
    shutil.copy(PRE_SWEPT / "prefill.npz", tmp / "prefill.npz")
    return tmp / "prefill.npz"


@dataclass(frozen=True)
class Broken:
    name: str
    why: str
    make: Callable[[Path], Path]
    file: str  # "{tmp}" is tmp_path, "{path}" the path given to load_profile
    key: str | None
    reason: str  # exact, or a prefix ending in "(" when the rest comes from a library
    select: dict[str, object] | None = None


BROKEN = [
    Broken(
        "missing-path",
        "a typo in --profile",
        lambda tmp: tmp / "nope",
        "{tmp}/nope",
        None,
        "no such file or directory",
    ),
    Broken(
        "empty-directory",
        "lists what it looked for",
        lambda tmp: tmp,
        "{path}",
        None,
        "no prefill profiling data (looked for selected_prefill_interpolation/raw_data.npz, "
        "prefill/raw_data.npz, prefill.npz, prefill_raw_data.json)",
    ),
    Broken(
        "unknown-file",
        "a file that is not one of the known names",
        lambda tmp: Path(shutil.copy(PREFILL_NPZ, tmp / "raw_data.npz")),
        "{path}",
        None,
        "expected a profile directory, or one of decode.npz, decode_raw_data.json, prefill.npz, "
        "prefill_raw_data.json",
    ),
    Broken(
        "pre-swept-without-companion",
        "prefill.npz needs decode.npz next to it",
        _lonely_pre_swept,
        "{tmp}/decode.npz",
        None,
        "missing: prefill.npz needs its decode companion",
    ),
    Broken(
        "not-a-zip",
        "a corrupted upload: what the file is not, never numpy's advice to unpickle it",
        _garbage_prefill,
        "{tmp}/live/selected_prefill_interpolation/raw_data.npz",
        None,
        "not a readable NPZ archive (not a zip archive)",
    ),
    Broken(
        "truncated-zip",
        "a half-copied file",
        _truncated_prefill,
        "{tmp}/live/selected_prefill_interpolation/raw_data.npz",
        None,
        "not a readable NPZ archive (",
    ),
    Broken(
        "npy-not-npz",
        "one array has no keys",
        _npy_instead,
        "{tmp}/live/selected_prefill_interpolation/raw_data.npz",
        None,
        "a single .npy array, not an NPZ archive of named arrays",
    ),
    Broken(
        "pickled-object-array",
        "never unpickle a profile (allow_pickle=False)",
        lambda tmp: _rewrite_decode(tmp, z_itl=np.array([{"ms": 1.0}] * 41, dtype=object)),
        "{tmp}/live/selected_decode_interpolation/raw_data.npz",
        "z_itl",
        "cannot be read (",
    ),
    Broken(
        "key-missing",
        "a decode file without ITL",
        lambda tmp: _rewrite_decode(tmp, z_itl=None),
        "{tmp}/live/selected_decode_interpolation/raw_data.npz",
        "z_itl",
        "missing (keys present: max_kv_tokens, x_kv_usage, y_context_length, z_thpt_per_gpu)",
    ),
    Broken(
        "value-out-of-range",
        "validation names the file it came from",
        lambda tmp: _rewrite_decode(tmp, x_kv_usage=DECODE["x_kv_usage"] * 2),
        "{tmp}/live/selected_decode_interpolation/raw_data.npz",
        "x_kv_usage",
        "value 1.16515 at index 6 is not a fraction in [0, 1]",
    ),
    Broken(
        "json-syntax",
        "a hand-edited ConfigMap",
        lambda tmp: _json(tmp, '{"prefill_isl": [1, 2,\n'),
        "{tmp}/json/prefill_raw_data.json",
        None,
        "not valid JSON (line 2 column 1: Expecting value)",
    ),
    Broken(
        "json-not-object",
        "keys are needed",
        lambda tmp: _json(tmp, "[1, 2, 3]"),
        "{tmp}/json/prefill_raw_data.json",
        None,
        "expected a JSON object of keys, got list",
    ),
    Broken(
        "json-nan",
        "Python's json accepts NaN; the profile must not",
        lambda tmp: _json(
            tmp,
            json.dumps({**{k: v.tolist() for k, v in PREFILL.items()}, "prefill_ttft": [float("nan")] * 17}),
        ),
        "{tmp}/json/prefill_raw_data.json",
        "prefill_ttft",
        "value nan at index 0 is not finite",
    ),
    Broken(
        "json-not-utf8",
        "binary garbage in a JSON file",
        _not_utf8,
        "{tmp}/json/prefill_raw_data.json",
        None,
        "not UTF-8 text (invalid start byte at byte 0)",
    ),
    Broken(
        "select-on-flat-layout",
        "only pre-swept files have configurations to choose from",
        lambda tmp: LIVE,
        "{path}",
        "select",
        "only pre-swept prefill.npz / decode.npz files hold several configurations",
        {"tp": 1},
    ),
    Broken(
        "select-no-match",
        "names the column and the values on offer",
        lambda tmp: PRE_SWEPT,
        "{path}/prefill.npz",
        "tp",
        "no configuration has 2 (available: 1)",
        {"tp": 2},
    ),
]


@pytest.mark.parametrize("case", BROKEN, ids=lambda c: c.name)
def test_broken_profile_names_file_and_key(case: Broken, tmp_path: Path) -> None:
    path = case.make(tmp_path)
    with pytest.raises(ProfileError) as caught:
        load_profile(path, select=case.select)
    err = caught.value
    expected_file = case.file.format(tmp=tmp_path, path=path)
    assert (err.path, err.key) == (expected_file, case.key), case.why
    if case.reason.endswith("("):
        assert err.reason.startswith(case.reason) and err.reason.endswith(")"), err.reason
    else:
        assert err.reason == case.reason, case.why


def test_npz_is_never_unpickled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The loader must ask numpy for allow_pickle=False on every file it opens.
    seen: list[bool] = []
    real = np.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("allow_pickle", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(np, "load", spy)
    load_profile(LIVE)
    load_profile(PRE_SWEPT)
    assert seen == [False, False, False, False]


def test_zip_member_with_a_bad_crc_names_the_key(tmp_path: Path) -> None:
    root = _live_copy(tmp_path)
    target = root / "selected_decode_interpolation" / "raw_data.npz"
    raw = bytearray(target.read_bytes())
    with zipfile.ZipFile(target) as archive:
        info = archive.getinfo("z_itl.npy")
    # Flip a byte inside the stored data of z_itl.npy (after its 30-byte local header and name).
    offset = info.header_offset + 30 + len(info.filename) + len(info.extra) + 200
    raw[offset] ^= 0xFF
    target.write_bytes(bytes(raw))
    with pytest.raises(ProfileError) as caught:
        load_profile(root)
    assert (caught.value.path, caught.value.key) == (str(target), "z_itl")
