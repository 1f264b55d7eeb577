"""The simulated world's latencies: how long one engine iteration really takes.

The truth is a profile (by default the planner's own), with every latency multiplied by `scale`,
so a policy can be graded in a world that differs from its model (`--truth-scale 1.2`:
everything 20% slower than the profile says). A *world* (`--truth NAME[,NAME...]`, names from
`WORLDS`, combinable) changes the latency's shape as well:

- `profile` (the default): the profile read through the same interpolation the planner uses.
  - prefill: an iteration that computes `n` prompt tokens (one chunk of up to
    `max_num_batched_tokens`, possibly from several requests) takes the profile's TTFT at ISL `n`;
  - decode: an iteration over a batch takes the profile's ITL at the batch's KV usage
    (Σ context ÷ the profile's `max_kv_tokens`) and mean context length, on its 100 × 100 grid.
- `smooth`: least-squares fits to the profile's measured points instead of its interpolated
  grid, both with non-negative coefficients (NNLS), so they only grow: prefill
  `a + b·n + c·n²` over the (ISL, TTFT) points; decode `a + b·batch + c·Σ context` over the
  decode points (batch = KV usage × `max_kv_tokens` ÷ context, Σ context = KV usage ×
  `max_kv_tokens`). The profile's grid levels off near 42.6 ms at high KV use; the fit does not.
  On the H200 profile: prefill 16.50 + 0.01518·n + 4.210e-7·n² ms (169.2 ms at 8,192 tokens,
  the profile's 170.0); decode 6.09 + 0.02033·batch + 2.934e-5·Σ context ms (RMS residual
  3.7 ms over the 41 points; 1,600 requests of 350 tokens: 55.0 ms, the profile's 42.6).
- `one-prompt`: a prefill iteration computes one prompt only (no packing of several prompts into
  one chunk); a long prompt is still chunked at `max_num_batched_tokens`.
- `prefix-cost`: a chunk's cost grows with the prefix already computed (attention): an
  iteration takes `k × Σ chunk × (prefix + chunk / 2)` more, over its requests (token², with
  `k = PREFIX_COST_MS_PER_TOKEN2`). Over a whole prompt that sums to `k × ISL² / 2`, however it
  is chunked. On the H200 profile a first 8,192-token chunk takes 198.8 ms (the profile's 170.0
  plus its own half, k × 8,192²/2), the 10th of an 85,000-token prompt 717.0 ms, the whole
  prompt alone 4.86 s (the profile's 1.76 s).
- `rising-decode`: the profile's ITL grid, but each context row keeps rising past the profile's
  plateau (`_rising_rows`), and engines schedule at most `max_num_seqs` requests (the
  deployment's `decode.max_num_seqs`, else `RISING_DECODE_MAX_NUM_SEQS`). With `smooth` the
  decode is the fit (it never levels off) and this world only adds the cap. On the H200 profile
  the row of context 412 tokens peaks at 46.0 ms at KV use 0.37 (cell 37) and goes on by
  (46.0 - 4.4) / 37 = 1.13 ms per cell of 1/99 of the KV (115.9 ms when full; the profile: 42.6).

In every world a deployment's `decode.max_num_seqs` caps the decode engines' batch.

Lookups are precomputed into plain lists: the simulator calls these millions of times.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize

from app.core.perf.interpolation import PerfModel
from app.core.perf.profile import DecodeData, PrefillData

WORLDS = ("profile", "smooth", "one-prompt", "prefix-cost", "rising-decode")

# prefix-cost, calibrated on data/profiles/h200-llama3.1-8b-fp8: the profile's prefill of 8,192
# tokens takes 169.99 ms; the last full 8,192-token chunk of an 85,000-token prompt (its 10th,
# after a prefix of 73,728 tokens) should take about 717 ms, as attention to a long prefix does.
# k = (717 - 169.99) ms / (8,192 × (73,728 + 8,192 / 2)) token² ≈ 8.580e-7 ms per token².
PREFIX_COST_MS_PER_TOKEN2 = (717.0 - 169.99) / (8192 * (73_728 + 8192 / 2))
# rising-decode: the most requests an engine schedules when the deployment does not say (vLLM's
# default max_num_seqs for large GPUs).
RISING_DECODE_MAX_NUM_SEQS = 256
# rising-decode: a context row's plateau starts at its first cell within this share of the row's
# highest ITL (cells past the profile's measured points are filled by nearest neighbour: flat).
PLATEAU_TOLERANCE = 1e-3


def parse_worlds(text: str) -> tuple[str, ...]:
    """`"one-prompt,prefix-cost"` -> `("one-prompt", "prefix-cost")`; ValueError for a name not
    in `WORLDS`."""
    names = tuple(name.strip() for name in str(text).split(","))
    for name in names:
        if name not in WORLDS:
            raise ValueError(
                f"unknown world {name!r} (choose from {', '.join(WORLDS)}; combine them with commas)"
            )
    return tuple(dict.fromkeys(names))  # repeats once


def fit_prefill_ms(data: PrefillData) -> tuple[float, float, float]:
    """(a, b, c) >= 0 of the least-squares TTFT ≈ a + b·n + c·n² (ms, n in tokens) over the
    profile's measured points."""
    n = data.isl_tokens / 1000.0  # per thousand tokens: the columns stay of similar size
    a, b, c = scipy.optimize.nnls(np.column_stack([np.ones_like(n), n, n * n]), data.ttft_ms)[0]
    return float(a), float(b) / 1e3, float(c) / 1e6


def fit_decode_ms(data: DecodeData) -> tuple[float, float, float]:
    """(a, b, c) >= 0 of the least-squares ITL ≈ a + b·batch + c·Σ context (ms; batch in
    requests, Σ context in tokens) over the profile's measured points."""
    sum_kv = data.kv_usage * data.max_kv_tokens
    batch = sum_kv / data.context_tokens
    design = np.column_stack([np.ones_like(batch), batch / 100.0, sum_kv / 1e5])
    a, b, c = scipy.optimize.nnls(design, data.itl_ms)[0]
    return float(a), float(b) / 100.0, float(c) / 1e5


def _rising_rows(grid_ms: np.ndarray, columns: int) -> np.ndarray:
    """The ITL grid with each context row kept up to its *knee*, the first cell within
    `PLATEAU_TOLERANCE` of the row's highest ITL (where the profile stops rising), and a straight
    line from there on with the row's mean slope below the knee, (ITL at the knee − ITL at KV
    usage 0) ÷ knee cells. `columns` cells per row: more than the grid's when the engines hold
    more KV than the profile's, so that the ITL keeps rising there too."""
    rows, cells = grid_ms.shape
    out = np.empty((rows, max(columns, cells)))
    ix = np.arange(out.shape[1], dtype=float)
    for iy in range(rows):
        row = grid_ms[iy]
        knee = int(np.argmax(row >= row.max() * (1.0 - PLATEAU_TOLERANCE)))
        slope = (row[knee] - row[0]) / knee if knee else 0.0
        out[iy, :cells] = row
        out[iy, knee:] = row[knee] + slope * (ix[knee:] - knee)
    return out


class TruthModel:
    def __init__(
        self,
        model: PerfModel,
        *,
        scale: float = 1.0,
        max_num_batched_tokens: int = 8192,
        max_kv_tokens: int | None = None,
        world: str = "profile",
        max_num_seqs: int | None = None,
    ) -> None:
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"truth scale must be a positive number, got {scale!r}")
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be at least 1, got {max_num_batched_tokens}")
        if max_num_seqs is not None and max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {max_num_seqs}")
        self.model = model
        self.scale = scale
        self.world = parse_worlds(world)
        smooth = "smooth" in self.world
        self.max_num_batched_tokens = int(max_num_batched_tokens)
        # A deployment may declare its engines' KV capacity; the profile's otherwise.
        self.max_kv_tokens = int(max_kv_tokens or model.decode.max_kv_tokens)
        # The most requests a decode engine schedules at once; None: only the KV capacity limits.
        if max_num_seqs is None and "rising-decode" in self.world:
            max_num_seqs = RISING_DECODE_MAX_NUM_SEQS
        self.max_num_seqs = max_num_seqs
        self.one_prompt = "one-prompt" in self.world
        # The smooth world's fitted coefficients (ms), for reports and tests; None elsewhere.
        self.smooth_prefill_ms: tuple[float, float, float] | None = None
        self.smooth_decode_ms: tuple[float, float, float] | None = None
        # Seconds per token² of Σ chunk × (prefix + chunk / 2); 0 outside the prefix-cost world.
        self.prefix_cost_s_per_token2 = (
            PREFIX_COST_MS_PER_TOKEN2 * scale / 1000.0 if "prefix-cost" in self.world else 0.0
        )
        # The ITL grid is indexed by KV usage of the profile's capacity, whatever the engines have.
        self._grid_kv_tokens = int(model.decode.max_kv_tokens)
        tokens = np.arange(self.max_num_batched_tokens + 1)
        if smooth:
            self.smooth_prefill_ms = a, b, c = fit_prefill_ms(model.prefill.data)
            prefill_ms = a + b * tokens + c * tokens.astype(float) ** 2
        else:
            prefill_ms = model.prefill.ttft_ms_many(tokens)
        self._prefill_s: list[float] = (prefill_ms * scale / 1000.0).tolist()
        decode = model.decode
        grid_ms = decode.itl_grid_ms
        self._last_index = decode.resolution - 1
        if "rising-decode" in self.world and not smooth:
            # Enough cells for a batch holding the engines' whole KV capacity.
            columns = int(self.max_kv_tokens / self._grid_kv_tokens * self._last_index + 0.5) + 1
            grid_ms = _rising_rows(grid_ms, columns)
        self._itl_s: list[list[float]] = (grid_ms * scale / 1000.0).tolist()
        self._ix_last = len(self._itl_s[0]) - 1
        self._context_step = float(decode.context_axis[1] - decode.context_axis[0])
        if smooth:
            self.smooth_decode_ms = a, b, c = fit_decode_ms(decode.data)
            self._decode_s = (a * scale / 1000.0, b * scale / 1000.0, c * scale / 1000.0)
            # Chosen once: a branch in decode_iteration_s would cost in the simulator's hot loop.
            self.decode_iteration_s = self._decode_linear_s  # type: ignore[method-assign]

    def prefill_iteration_s(self, tokens: int, prefix_tokens2: float = 0.0) -> float:
        """One prefill iteration computing `tokens` prompt tokens (at most max_num_batched_tokens);
        `prefix_tokens2` = Σ over its requests of chunk × (prefix already computed + chunk / 2),
        what the prefix-cost world charges for (the other worlds ignore it)."""
        return self._prefill_s[tokens] + self.prefix_cost_s_per_token2 * prefix_tokens2

    def prefill_request_s(self, isl_tokens: int) -> float:
        """A request alone on an idle engine: its prompt in chunks of max_num_batched_tokens
        (with the prefix-cost world's k × ISL² / 2, the sum of its chunks' prefix terms)."""
        isl = int(isl_tokens)
        full, rest = divmod(isl, self.max_num_batched_tokens)
        table = self._prefill_s
        chunks_s = full * table[self.max_num_batched_tokens] + (table[rest] if rest else 0.0)
        return chunks_s + self.prefix_cost_s_per_token2 * (isl * isl / 2)

    def decode_iteration_s(self, sum_kv_tokens: float, num_requests: int) -> float:
        """One decode iteration of `num_requests` requests holding `sum_kv_tokens` of context."""
        last = self._last_index
        ix_last = self._ix_last
        ix = int(sum_kv_tokens / self._grid_kv_tokens * last + 0.5)
        iy = int(sum_kv_tokens / num_requests / self._context_step + 0.5)
        return self._itl_s[iy if iy < last else last][ix if ix < ix_last else ix_last]

    def _decode_linear_s(self, sum_kv_tokens: float, num_requests: int) -> float:
        """The smooth world's decode iteration: a + b·batch + c·Σ context."""
        a, b, c = self._decode_s
        return a + b * num_requests + c * sum_kv_tokens
