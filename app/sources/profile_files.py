"""Profiling data files (Dynamo's layouts) read into plain mappings, then validated by the core.

`load_profile(path)` accepts:

- a directory with `selected_prefill_interpolation/raw_data.npz` and
  `selected_decode_interpolation/raw_data.npz` (what a live Dynamo planner reads);
- a directory with `prefill/raw_data.npz` and `decode/raw_data.npz` (Dynamo's test data layout);
- a directory with the pre-swept `prefill.npz` and `decode.npz` (one row per configuration plus
  configuration columns), or either of those two files: the row is chosen by `select`
  (configuration column → value), the first row by default;
- a directory with `prefill_raw_data.json` and `decode_raw_data.json` (Dynamo's ConfigMap
  fallback), or either of those two files.

Each side (prefill, decode) takes the first of these that exists, in this order, as Dynamo falls
back from NPZ to JSON per side. NPZ files are read with `allow_pickle=False`. Any problem is a
`ProfileError` naming the file and, where it applies, the key.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from app.core.errors import ProfileError
from app.core.perf.profile import (
    DECODE_KEYS,
    PREFILL_KEYS,
    Profile,
    profile_from_mappings,
    select_configuration,
)

Side = Literal["prefill", "decode"]
Layout = Literal["flat_npz", "pre_swept", "json"]
_DATA_KEYS: dict[Side, tuple[str, ...]] = {"prefill": PREFILL_KEYS, "decode": DECODE_KEYS}


def _candidates(directory: Path, side: Side) -> list[tuple[Path, Layout]]:
    return [
        (directory / f"selected_{side}_interpolation" / "raw_data.npz", "flat_npz"),
        (directory / side / "raw_data.npz", "flat_npz"),
        (directory / f"{side}.npz", "pre_swept"),
        (directory / f"{side}_raw_data.json", "json"),
    ]


_FILE_NAMES: dict[str, tuple[Side, Layout]] = {
    "prefill.npz": ("prefill", "pre_swept"),
    "decode.npz": ("decode", "pre_swept"),
    "prefill_raw_data.json": ("prefill", "json"),
    "decode_raw_data.json": ("decode", "json"),
}


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an NPZ archive, without unpickling anything."""
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        # numpy's own message for a file that is not an archive is advice to unpickle it, which a
        # profile never needs: say what the file is not.
        reason = "not a zip archive" if "pickle" in str(exc) else _first_line(exc)
        raise ProfileError(str(path), None, f"not a readable NPZ archive ({reason})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ProfileError(str(path), None, "a single .npy array, not an NPZ archive of named arrays")
    out: dict[str, np.ndarray] = {}
    with archive:
        for key in archive.files:
            try:
                out[key] = archive[key]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
                raise ProfileError(str(path), key, f"cannot be read ({_first_line(exc)})") from None
    return out


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ProfileError(str(path), None, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(
            str(path), None, f"not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})"
        ) from None
    except OSError as exc:
        raise ProfileError(str(path), None, f"cannot be read ({exc.strerror})") from None
    if not isinstance(data, dict):
        raise ProfileError(str(path), None, f"expected a JSON object of keys, got {type(data).__name__}")
    return data


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _read_side(path: Path, layout: Layout, side: Side, select: Mapping[str, object] | None) -> dict[str, Any]:
    if layout == "json":
        return read_json(path)
    data = read_npz(path)
    if layout == "pre_swept":
        return select_configuration(data, select, path=str(path), data_keys=_DATA_KEYS[side])
    return data


def _locate(path: Path) -> dict[Side, tuple[Path, Layout]]:
    try:
        exists, is_file = path.exists(), path.is_file()
    except (OSError, ValueError) as exc:  # a name too long, an embedded NUL
        raise ProfileError(str(path), None, f"not a usable path ({_first_line(exc)})") from None
    if not exists:
        raise ProfileError(str(path), None, "no such file or directory")
    if is_file:
        known = _FILE_NAMES.get(path.name)
        if known is None:
            raise ProfileError(
                str(path),
                None,
                "expected a profile directory, or one of " + ", ".join(sorted(_FILE_NAMES)),
            )
        side, layout = known
        other: Side = "decode" if side == "prefill" else "prefill"
        sibling = path.with_name(path.name.replace(side, other, 1))
        if not sibling.is_file():
            raise ProfileError(str(sibling), None, f"missing: {path.name} needs its {other} companion")
        return {side: (path, layout), other: (sibling, layout)}

    found: dict[Side, tuple[Path, Layout]] = {}
    for side in ("prefill", "decode"):
        candidates = _candidates(path, side)
        match = next(((p, layout) for p, layout in candidates if p.is_file()), None)
        if match is None:
            looked = ", ".join(str(p.relative_to(path)) for p, _ in candidates)
            raise ProfileError(str(path), None, f"no {side} profiling data (looked for {looked})")
        found[side] = match
    return found


def load_profile(path: str | Path, *, select: Mapping[str, object] | None = None) -> Profile:
    """Read and validate a profile; `select` picks a configuration of pre-swept files."""
    path = Path(path)
    files = _locate(path)
    if select and all(layout != "pre_swept" for _, layout in files.values()):
        raise ProfileError(
            str(path), "select", "only pre-swept prefill.npz / decode.npz files hold several configurations"
        )
    (prefill_path, prefill_layout), (decode_path, decode_layout) = files["prefill"], files["decode"]
    prefill = _read_side(prefill_path, prefill_layout, "prefill", select)
    decode = _read_side(decode_path, decode_layout, "decode", select)
    return profile_from_mappings(
        prefill,
        decode,
        source=str(path),
        prefill_path=str(prefill_path),
        decode_path=str(decode_path),
    )
