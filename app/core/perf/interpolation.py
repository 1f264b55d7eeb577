"""Throughput and latency from profiling data, by the reference planner's interpolation method.

This follows Dynamo's E1 interpolators (`perf_interpolation.py`; reference notes §3.2) step for
step, so the same data gives the same figures:

- prefill: cubic `interp1d` over ISL for TTFT and for throughput per GPU, the query ISL clamped
  into the measured range;
- decode: ITL and throughput per GPU on a regular `resolution × resolution` grid over KV usage
  `[0, 1]` and context `[0, max measured context]`, by cubic scattered-data interpolation
  (`griddata`), cells that cubic leaves empty (outside the convex hull) filled by nearest
  neighbour; lookups round to the nearest cell;
- best decode throughput for an ITL target at a context length: on that context row, the cell
  with the highest KV usage whose ITL meets the target, scanning from high KV usage down (the
  interpolated ITL is not monotonic); if none does, the KV-usage-0 cell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.interpolate

from app.core.errors import ProfileError
from app.core.perf.profile import DecodeData, PrefillData, Profile


def _finite(value: float, name: str) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


class PrefillInterpolator:
    def __init__(self, data: PrefillData) -> None:
        self.data = data
        self.min_isl_tokens = float(data.isl_tokens[0])
        self.max_isl_tokens = float(data.isl_tokens[-1])
        try:
            self._ttft = scipy.interpolate.interp1d(data.isl_tokens, data.ttft_ms, kind="cubic")
            self._thpt = scipy.interpolate.interp1d(data.isl_tokens, data.thpt_per_gpu, kind="cubic")
        except ValueError as exc:
            raise ProfileError(data.path, "prefill_isl", f"cannot interpolate: {exc}") from None

    def clamp(self, isl_tokens: float) -> float:
        isl = _finite(isl_tokens, "isl_tokens")
        return max(self.min_isl_tokens, min(isl, self.max_isl_tokens))

    def ttft_ms(self, isl_tokens: float) -> float:
        """Time to first token of one request alone (ms)."""
        return float(self._ttft(self.clamp(isl_tokens)))

    def thpt_per_gpu(self, isl_tokens: float) -> float:
        """Prefill tokens per second per GPU at this ISL."""
        return float(self._thpt(self.clamp(isl_tokens)))

    def ttft_ms_many(self, isl_tokens: np.ndarray) -> np.ndarray:
        """`ttft_ms` of many ISLs at once (same clamping), for tables."""
        clamped = np.clip(np.asarray(isl_tokens, dtype=float), self.min_isl_tokens, self.max_isl_tokens)
        return np.asarray(self._ttft(clamped), dtype=float)


@dataclass(frozen=True)
class DecodePoint:
    """One cell of the decode grid: what a decode engine delivers there."""

    thpt_per_gpu: float  # output tokens/s/GPU
    itl_ms: float
    kv_usage: float  # fraction of the KV cache in use


def _grid(data: DecodeData, values: np.ndarray, key: str, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    points = (data.kv_usage, data.context_tokens)
    try:
        grid = scipy.interpolate.griddata(points, values, (X, Y), method="cubic")
        empty = np.isnan(grid)
        if np.any(empty):
            nearest = scipy.interpolate.griddata(points, values, (X, Y), method="nearest")
            grid[empty] = nearest[empty]
    except (ValueError, RuntimeError) as exc:  # scipy.spatial.QhullError is a RuntimeError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ProfileError(
            data.path, key, f"cannot interpolate over (x_kv_usage, y_context_length): {first}"
        ) from None
    grid.flags.writeable = False
    return grid


class DecodeInterpolator:
    def __init__(self, data: DecodeData, resolution: int = 100) -> None:
        if resolution < 2:
            raise ValueError(f"resolution must be at least 2, got {resolution}")
        self.data = data
        self.resolution = resolution
        self.max_kv_tokens = data.max_kv_tokens
        # Axes of the grid; grids are indexed [iy (context), ix (kv usage)].
        self.kv_usage_axis = np.linspace(0, 1, resolution)
        self.context_axis = np.linspace(0, float(np.max(data.context_tokens)), resolution)
        X, Y = np.meshgrid(self.kv_usage_axis, self.context_axis)
        self.itl_grid_ms = _grid(data, data.itl_ms, "z_itl", X, Y)
        self.thpt_grid_per_gpu = _grid(data, data.thpt_per_gpu, "z_thpt_per_gpu", X, Y)

    def _index(self, value: float, axis: np.ndarray) -> int:
        step = axis[1] - axis[0]
        return int(np.clip(np.round((value - axis[0]) / step), 0, self.resolution - 1))

    def context_index(self, context_tokens: float) -> int:
        return self._index(_finite(context_tokens, "context_tokens"), self.context_axis)

    def grid_index(self, concurrency: float, context_tokens: float) -> tuple[int, int]:
        """(ix, iy): the cell of `concurrency` requests of `context_tokens` each."""
        concurrency = _finite(concurrency, "concurrency")
        kv_usage = concurrency * _finite(context_tokens, "context_tokens") / self.max_kv_tokens
        return self._index(kv_usage, self.kv_usage_axis), self.context_index(context_tokens)

    def itl_ms(self, concurrency: float, context_tokens: float) -> float:
        ix, iy = self.grid_index(concurrency, context_tokens)
        return float(self.itl_grid_ms[iy, ix])

    def thpt_per_gpu(self, concurrency: float, context_tokens: float) -> float:
        ix, iy = self.grid_index(concurrency, context_tokens)
        return float(self.thpt_grid_per_gpu[iy, ix])

    def point(self, ix: int, iy: int) -> DecodePoint:
        return DecodePoint(
            thpt_per_gpu=float(self.thpt_grid_per_gpu[iy, ix]),
            itl_ms=float(self.itl_grid_ms[iy, ix]),
            kv_usage=float(self.kv_usage_axis[ix]),
        )

    def best_throughput_per_gpu(self, itl_ms: float, context_tokens: float) -> DecodePoint:
        """The highest-KV-usage cell on the context row whose ITL is at most `itl_ms`; when no cell
        meets it, the KV-usage-0 cell (its ITL is then above the target: check `itl_ms`)."""
        target = float(itl_ms)  # NaN qualifies no cell, as in the reference
        iy = self.context_index(context_tokens)
        row = self.itl_grid_ms[iy]
        for ix in range(self.resolution - 1, -1, -1):
            if row[ix] <= target:
                return self.point(ix, iy)
        return self.point(0, iy)


@dataclass(frozen=True, eq=False)
class PerfModel:
    """Both interpolators of one profile: what the replica formulas consult."""

    prefill: PrefillInterpolator
    decode: DecodeInterpolator
    source: str = ""

    @classmethod
    def from_profile(cls, profile: Profile, *, resolution: int = 100) -> PerfModel:
        return cls(
            prefill=PrefillInterpolator(profile.prefill),
            decode=DecodeInterpolator(profile.decode, resolution=resolution),
            source=profile.source,
        )

    def prefill_ttft_ms(self, isl_tokens: float) -> float:
        return self.prefill.ttft_ms(isl_tokens)

    def prefill_thpt_per_gpu(self, isl_tokens: float) -> float:
        return self.prefill.thpt_per_gpu(isl_tokens)

    def decode_itl_ms(self, concurrency: float, context_tokens: float) -> float:
        return self.decode.itl_ms(concurrency, context_tokens)

    def best_decode_throughput_per_gpu(self, itl_ms: float, context_tokens: float) -> DecodePoint:
        return self.decode.best_throughput_per_gpu(itl_ms, context_tokens)
