"""The simulated world's latencies: how long one engine iteration really takes.

The truth is a profile (by default the planner's own), read through the same interpolation the
planner uses, with every latency multiplied by `scale`, so a policy can be graded in a world that
differs from its model (`--truth-scale 1.2`: everything 20% slower than the profile says).

- prefill: an iteration that computes `n` prompt tokens (one chunk of up to
  `max_num_batched_tokens`, possibly from several requests) takes the profile's TTFT at ISL `n`;
- decode: an iteration over a batch takes the profile's ITL at the batch's KV usage
  (Σ context ÷ `max_kv_tokens`) and mean context length.

Lookups are precomputed into plain lists: the simulator calls these millions of times.
"""

from __future__ import annotations

import math

import numpy as np

from app.core.perf.interpolation import PerfModel


class TruthModel:
    def __init__(
        self,
        model: PerfModel,
        *,
        scale: float = 1.0,
        max_num_batched_tokens: int = 8192,
        max_kv_tokens: int | None = None,
    ) -> None:
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"truth scale must be a positive number, got {scale!r}")
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be at least 1, got {max_num_batched_tokens}")
        self.model = model
        self.scale = scale
        self.max_num_batched_tokens = int(max_num_batched_tokens)
        # A deployment may declare its engines' KV capacity; the profile's otherwise.
        self.max_kv_tokens = int(max_kv_tokens or model.decode.max_kv_tokens)
        # The ITL grid is indexed by KV usage of the profile's capacity, whatever the engines have.
        self._grid_kv_tokens = int(model.decode.max_kv_tokens)
        tokens = np.arange(self.max_num_batched_tokens + 1)
        self._prefill_s: list[float] = (model.prefill.ttft_ms_many(tokens) * scale / 1000.0).tolist()
        decode = model.decode
        self._itl_s: list[list[float]] = (decode.itl_grid_ms * scale / 1000.0).tolist()
        self._last_index = decode.resolution - 1
        self._context_step = float(decode.context_axis[1] - decode.context_axis[0])

    def prefill_iteration_s(self, tokens: int) -> float:
        """One prefill iteration computing `tokens` prompt tokens (at most max_num_batched_tokens)."""
        return self._prefill_s[tokens]

    def prefill_request_s(self, isl_tokens: int) -> float:
        """A request alone on an idle engine: its prompt in chunks of max_num_batched_tokens."""
        full, rest = divmod(int(isl_tokens), self.max_num_batched_tokens)
        return full * self._prefill_s[self.max_num_batched_tokens] + (self._prefill_s[rest] if rest else 0.0)

    def decode_iteration_s(self, sum_kv_tokens: float, num_requests: int) -> float:
        """One decode iteration of `num_requests` requests holding `sum_kv_tokens` of context."""
        last = self._last_index
        ix = int(sum_kv_tokens / self._grid_kv_tokens * last + 0.5)
        iy = int(sum_kv_tokens / num_requests / self._context_step + 0.5)
        return self._itl_s[iy if iy < last else last][ix if ix < last else last]
