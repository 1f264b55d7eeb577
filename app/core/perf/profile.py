"""Pre-deployment profiling data (Dynamo's NPZ keys), validated into typed arrays.

`app/sources/profile_files.py` reads the files into plain mappings (key → array or list); this
module checks them and never touches a file. Every problem is a `ProfileError` naming the file and
the key, so an operator can fix the data without reading a traceback.

Keys (Dynamo's, units in the comments):
- prefill: `prefill_isl` (tokens), `prefill_ttft` (ms at batch size 1), `prefill_thpt_per_gpu`
  (prefill tokens/s/GPU); 1-D, same length.
- decode: `x_kv_usage` (fraction of the KV cache, 0–1), `y_context_length` (tokens, ISL + OSL/2),
  `z_itl` (ms), `z_thpt_per_gpu` (output tokens/s/GPU); 1-D, same length; `max_kv_tokens` (a
  positive integer, scalar or one element).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.core.errors import ProfileError

PREFILL_KEYS = ("prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu")
DECODE_KEYS = ("x_kv_usage", "y_context_length", "z_itl", "z_thpt_per_gpu")
MAX_KV_KEY = "max_kv_tokens"
# Configuration columns of Dynamo's pre-swept files, in its order.
CONFIG_KEYS = (
    "gpu_type",
    "model",
    "framework",
    "framework_version",
    "tp",
    "dp",
    "pp",
    "block_size",
    "max_batch_size",
    "gpu_count",
)
# interp1d(kind="cubic") needs four points; a 2-D triangulation needs three.
MIN_PREFILL_POINTS = 4
MIN_DECODE_POINTS = 3


@dataclass(frozen=True, eq=False)
class PrefillData:
    """Prefill measurements, sorted by ISL."""

    isl_tokens: np.ndarray
    ttft_ms: np.ndarray
    thpt_per_gpu: np.ndarray
    path: str = ""


@dataclass(frozen=True, eq=False)
class DecodeData:
    """Decode measurements: scattered points over (KV usage, context length), in file order."""

    kv_usage: np.ndarray
    context_tokens: np.ndarray
    itl_ms: np.ndarray
    thpt_per_gpu: np.ndarray
    max_kv_tokens: int
    path: str = ""


@dataclass(frozen=True, eq=False)
class Profile:
    prefill: PrefillData
    decode: DecodeData
    source: str  # where it came from, for messages and diagnostics


def _array(data: Mapping[str, Any], key: str, path: str) -> np.ndarray:
    if key not in data:
        present = ", ".join(sorted(str(k) for k in data)) or "none"
        raise ProfileError(path, key, f"missing (keys present: {present})")
    value = data[key]
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ProfileError(path, key, "not numeric") from None
    if array.ndim != 1:
        raise ProfileError(path, key, f"expected a 1-D array, got shape {tuple(array.shape)}")
    if not np.all(np.isfinite(array)):
        bad = int(np.flatnonzero(~np.isfinite(array))[0])
        raise ProfileError(path, key, f"value {array[bad]} at index {bad} is not finite")
    return array


def _same_length(arrays: dict[str, np.ndarray], path: str) -> int:
    first_key, first = next(iter(arrays.items()))
    for key, array in arrays.items():
        if len(array) != len(first):
            raise ProfileError(path, key, f"has {len(array)} values but {first_key} has {len(first)}")
    return len(first)


def _check(array: np.ndarray, key: str, path: str, ok: np.ndarray, wanted: str) -> None:
    if not np.all(ok):
        bad = int(np.flatnonzero(~ok)[0])
        raise ProfileError(path, key, f"value {array[bad]:g} at index {bad} is not {wanted}")


def _max_kv_tokens(data: Mapping[str, Any], path: str) -> int:
    if MAX_KV_KEY not in data:
        present = ", ".join(sorted(str(k) for k in data)) or "none"
        raise ProfileError(path, MAX_KV_KEY, f"missing (keys present: {present})")
    try:
        array = np.asarray(data[MAX_KV_KEY])
        values = array.astype(np.float64).ravel()
    except (TypeError, ValueError):
        raise ProfileError(path, MAX_KV_KEY, "not numeric") from None
    if array.dtype == np.bool_ or values.size != 1:
        raise ProfileError(path, MAX_KV_KEY, f"expected one integer, got shape {tuple(array.shape)}")
    value = float(values[0])
    if not np.isfinite(value) or value <= 0 or value != int(value):
        raise ProfileError(path, MAX_KV_KEY, f"expected a positive integer, got {value:g}")
    return int(value)


def prefill_from_mapping(data: Mapping[str, Any], *, path: str) -> PrefillData:
    arrays = {key: _array(data, key, path) for key in PREFILL_KEYS}
    n = _same_length(arrays, path)
    if n < MIN_PREFILL_POINTS:
        raise ProfileError(
            path, "prefill_isl", f"{n} points; cubic interpolation needs at least {MIN_PREFILL_POINTS}"
        )
    isl, ttft, thpt = arrays["prefill_isl"], arrays["prefill_ttft"], arrays["prefill_thpt_per_gpu"]
    _check(isl, "prefill_isl", path, isl > 0, "> 0 tokens")
    _check(ttft, "prefill_ttft", path, ttft > 0, "> 0 ms")
    _check(thpt, "prefill_thpt_per_gpu", path, thpt >= 0, ">= 0 tokens/s/GPU")
    order = np.argsort(isl, kind="stable")
    isl, ttft, thpt = isl[order], ttft[order], thpt[order]
    repeated = np.flatnonzero(np.diff(isl) == 0)
    if repeated.size:
        raise ProfileError(path, "prefill_isl", f"ISL {isl[repeated[0]]:g} appears more than once")
    for array in (isl, ttft, thpt):
        array.flags.writeable = False
    return PrefillData(isl_tokens=isl, ttft_ms=ttft, thpt_per_gpu=thpt, path=path)


def decode_from_mapping(data: Mapping[str, Any], *, path: str) -> DecodeData:
    arrays = {key: _array(data, key, path) for key in DECODE_KEYS}
    n = _same_length(arrays, path)
    if n < MIN_DECODE_POINTS:
        raise ProfileError(
            path, "x_kv_usage", f"{n} points; 2-D interpolation needs at least {MIN_DECODE_POINTS}"
        )
    kv, ctx = arrays["x_kv_usage"], arrays["y_context_length"]
    itl, thpt = arrays["z_itl"], arrays["z_thpt_per_gpu"]
    _check(kv, "x_kv_usage", path, (kv >= 0) & (kv <= 1), "a fraction in [0, 1]")
    _check(ctx, "y_context_length", path, ctx > 0, "> 0 tokens")
    _check(itl, "z_itl", path, itl > 0, "> 0 ms")
    _check(thpt, "z_thpt_per_gpu", path, thpt >= 0, ">= 0 tokens/s/GPU")
    max_kv = _max_kv_tokens(data, path)
    for array in (kv, ctx, itl, thpt):
        array.flags.writeable = False
    return DecodeData(
        kv_usage=kv, context_tokens=ctx, itl_ms=itl, thpt_per_gpu=thpt, max_kv_tokens=max_kv, path=path
    )


def profile_from_mappings(
    prefill: Mapping[str, Any],
    decode: Mapping[str, Any],
    *,
    source: str,
    prefill_path: str,
    decode_path: str,
) -> Profile:
    """Validate Dynamo's prefill and decode keys into a `Profile`; `ProfileError` names file and key."""
    return Profile(
        prefill=prefill_from_mapping(prefill, path=prefill_path),
        decode=decode_from_mapping(decode, path=decode_path),
        source=source,
    )


def _cell(value: Any) -> Any:
    """A configuration cell as a plain Python value (numpy scalars and 1-element rows unwrapped)."""
    array = np.asarray(value)
    if array.size == 1:
        return array.ravel()[0].item()
    return [v.item() for v in array.ravel()]


def _matches(cell: Any, wanted: object) -> bool:
    # "1" from a command line matches the integer column 1; a list cell matches any of its values.
    cells = cell if isinstance(cell, list) else [cell]
    return any(c == wanted or str(c) == str(wanted) for c in cells)


def select_configuration(
    data: Mapping[str, Any],
    select: Mapping[str, object] | None,
    *,
    path: str,
    data_keys: tuple[str, ...],
) -> dict[str, Any]:
    """One configuration of a pre-swept file: the first row whose configuration columns equal every
    `select` value (the first row when `select` is empty), with the data keys as 1-D rows.

    Pre-swept files stack one row per configuration (`(n_cfg, n_pts)`; a 1-D array is one row),
    with configuration columns of shape `(n_cfg, 1)`. Dynamo's `select_data` does the same."""
    rows: dict[str, np.ndarray] = {}
    for key in (*data_keys, MAX_KV_KEY):
        if key not in data:
            continue
        array = np.asarray(data[key])
        if key == MAX_KV_KEY and array.ndim <= 1 and array.size == 1:
            array = array.reshape(1, 1)
        elif array.ndim == 1:
            array = array.reshape(1, -1)
        if array.ndim != 2:
            raise ProfileError(path, key, f"expected one row per configuration, got shape {array.shape}")
        rows[key] = array
    counts = {key: array.shape[0] for key, array in rows.items()}
    n_cfg = max(counts.values(), default=0)
    if n_cfg == 0:
        raise ProfileError(path, data_keys[0], "missing (no data rows)")
    for key, count in counts.items():
        if count != n_cfg:
            raise ProfileError(path, key, f"has {count} configuration rows, others have {n_cfg}")

    chosen = 0
    if select:
        columns: dict[str, list[Any]] = {}
        for key in select:
            if key not in data or key in data_keys or key == MAX_KV_KEY:
                known = ", ".join(k for k in data if k not in data_keys and k != MAX_KV_KEY) or "none"
                raise ProfileError(path, key, f"not a configuration column (columns: {known})")
            column = np.asarray(data[key])
            cells = [_cell(column[i]) for i in range(column.shape[0])] if column.ndim else [_cell(column)]
            if len(cells) != n_cfg:
                raise ProfileError(path, key, f"has {len(cells)} rows, the data has {n_cfg}")
            columns[key] = cells
        matching = [i for i in range(n_cfg) if all(_matches(columns[k][i], w) for k, w in select.items())]
        if not matching:
            # Name the first column that rules every row out, with the values it offers.
            for key, wanted in select.items():
                if not any(_matches(c, wanted) for c in columns[key]):
                    available = ", ".join(sorted({str(c) for c in columns[key]}))
                    raise ProfileError(path, key, f"no configuration has {wanted!r} (available: {available})")
            combos = "; ".join(", ".join(f"{k}={columns[k][i]}" for k in select) for i in range(n_cfg))
            raise ProfileError(
                path, ",".join(select), f"no configuration matches all of them (available: {combos})"
            )
        chosen = matching[0]

    out: dict[str, Any] = {key: array[chosen] for key, array in rows.items()}
    return out
