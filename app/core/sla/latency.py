"""What an engine iteration costs, learned from the engines' own forward passes, with the profile
only as the prior.

Each role's iteration time is a linear model in what the FPM record says the iteration did:

- **prefill**: `a + b·T + c·T·(P + T/2)/n`, for `T` prompt tokens computed (`sum_prefill_tokens`),
  `P` tokens of KV already there (`sum_prefill_kv_tokens`: earlier chunks, prefix hits) and `n`
  prompts in the iteration: a fixed cost, the linear layers per token, and attention, each new
  token reading the prefix before it. A late chunk of a long prompt costs more than the first.
- **decode**: `a + b·n + c·K` for `n` requests holding `K` tokens of context
  (`num_decode_requests`, `sum_decode_kv_tokens`): per-request work and reading the KV cache.
  It never levels off: a plateau is not extrapolated into free capacity.

The fit is a weighted least squares (a Bayesian linear regression with a Gaussian prior): the
prior is the profile's own measured points as pseudo-observations worth `prior_records` records,
so a planner with no data sizes by a straight-line reading of its profile, and a few ticks of
forward passes outweigh it. Old records fade (`half_life_s`), so the model tracks what an
iteration costs now. A prediction is the fit's mean; the model knows the range of its real data
(`outside`), beyond which decode is never cheaper than its profile (`DecodeCost`).

Pure: no clock (the tick's `now_s` drives the fading), and every update returns a new model,
so a tick can work on the committed state without changing it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from app.core.perf.fpm import ForwardPassMetrics
from app.core.perf.interpolation import PerfModel

# Features are rescaled to similar magnitudes, so that the 3x3 solve is well conditioned.
_PREFILL_SCALE = np.array([1.0, 1e-4, 1e-8])
_DECODE_SCALE = np.array([1.0, 1e-2, 1e-5])
_RIDGE = 1e-9


def prefill_features(tokens: float, prefix_tokens: float, prompts: float = 1.0) -> np.ndarray:
    n = max(prompts, 1.0)
    return np.array([1.0, tokens, tokens * (prefix_tokens + tokens / 2) / n]) * _PREFILL_SCALE


def prefill_rows(
    tokens: np.ndarray, prefix_tokens: np.ndarray, prompts: np.ndarray | None = None
) -> np.ndarray:
    """`prefill_features` of many iterations at once, one row each."""
    n = np.ones_like(tokens) if prompts is None else np.maximum(prompts, 1.0)
    x = np.column_stack([np.ones_like(tokens), tokens, tokens * (prefix_tokens + tokens / 2) / n])
    return x * _PREFILL_SCALE


def decode_features(requests: float, kv_tokens: float) -> np.ndarray:
    return np.array([1.0, requests, kv_tokens]) * _DECODE_SCALE


@dataclass(frozen=True, eq=False)
class LinearCost:
    """Iteration milliseconds as a linear function of the features, fitted online."""

    prior_xtx: np.ndarray
    prior_xty: np.ndarray
    xtx: np.ndarray
    xty: np.ndarray
    weight: float = 0.0  # the real records' weight, faded
    records: int = 0  # real records ever used
    high: np.ndarray | None = None  # the largest feature values of the real data
    updated_s: float | None = None
    half_life_s: float = 900.0

    @classmethod
    def from_prior(
        cls, x: np.ndarray, y_ms: np.ndarray, *, prior_records: float, half_life_s: float
    ) -> LinearCost:
        w = prior_records / len(y_ms)
        p = x.shape[1]
        return cls(
            prior_xtx=w * x.T @ x,
            prior_xty=w * x.T @ y_ms,
            xtx=np.zeros((p, p)),
            xty=np.zeros(p),
            half_life_s=half_life_s,
        )

    def observed(self, x: np.ndarray, y_ms: np.ndarray, now_s: float) -> LinearCost:
        """The model with these records (rows of `x`, times in ms) added at `now_s`."""
        if len(y_ms) == 0:
            return self
        fade = 1.0
        if self.updated_s is not None and now_s > self.updated_s:
            fade = 0.5 ** ((now_s - self.updated_s) / self.half_life_s)
        high = x.max(axis=0) if self.high is None else np.maximum(self.high, x.max(axis=0))
        return replace(
            self,
            xtx=fade * self.xtx + x.T @ x,
            xty=fade * self.xty + x.T @ y_ms,
            weight=fade * self.weight + len(y_ms),
            records=self.records + len(y_ms),
            high=high,
            updated_s=now_s,
        )

    def _fit(self) -> np.ndarray:
        """The coefficients: the weighted least squares' solution, the prior included."""
        cached = self.__dict__.get("_cached")
        if cached is not None:
            return cached
        a = self.prior_xtx + self.xtx
        a = a + _RIDGE * np.trace(a) * np.eye(len(a))
        beta = np.linalg.solve(a, self.prior_xty + self.xty)
        object.__setattr__(self, "_cached", beta)
        return beta

    @property
    def coefficients(self) -> np.ndarray:
        return self._fit()

    def mean_ms(self, x: np.ndarray) -> float:
        return float(self._fit() @ x)

    def outside(self, x: np.ndarray) -> bool:
        """Beyond the real data: past its largest value in some feature (by more than 5%)."""
        return self.high is None or bool(np.any(x[1:] > self.high[1:] * 1.05 + 1e-12))

    def predict_ms(self, x: np.ndarray) -> float:
        """The fit's mean (at least a microsecond)."""
        return max(self.mean_ms(x), 1e-3)

    def predict_many_ms(self, x: np.ndarray) -> np.ndarray:
        """`predict_ms` of each row of `x`, at once."""
        return np.maximum(x @ self._fit(), 1e-3)

    def summary(self) -> dict[str, float | int | list[float] | None]:
        beta = self.coefficients
        return {
            "records": self.records,
            "weight": round(self.weight, 1),
            "coefficients": [round(float(v), 6) for v in beta],
            "range": [round(float(v), 4) for v in self.high[1:]] if self.high is not None else None,
        }


@dataclass(frozen=True)
class PrefillCost:
    """A prefill engine's learned iteration cost, and whether it packs several prompts into one
    iteration (seen in the records; until then it is taken not to: the cautious reading)."""

    model: LinearCost
    chunk_tokens: int
    packed_evidence: float = 0.0
    unpacked_evidence: float = 0.0

    @property
    def packs(self) -> bool:
        return self.packed_evidence > self.unpacked_evidence

    def iteration_ms(self, tokens: float, prefix_tokens: float = 0.0, prompts: float = 1.0) -> float:
        return self.model.predict_ms(prefill_features(tokens, prefix_tokens, prompts))

    def alone_s(self, isl_tokens: float, computed_share: float = 1.0) -> float:
        """One prompt on an idle engine: its chunks one after the other, each reading the prefix
        of the chunks before it. With `computed_share` below 1 the rest of the prompt, its start,
        is read from a prefix cache: only the tokens after it are computed, reading it all."""
        isl = max(float(isl_tokens), 1.0)
        cached = min(isl * (1.0 - computed_share), isl - 1.0)
        starts = np.arange(cached, isl, self.chunk_tokens)
        takes = np.minimum(self.chunk_tokens, isl - starts)
        return float(self.model.predict_many_ms(prefill_rows(takes, starts)).sum()) / 1000.0

    def busy_s(self, isl_tokens: float, computed_share: float = 1.0) -> float:
        """Engine time one prompt takes on a saturated engine: alone, unless the engine packs
        prompts into full chunks, which share the iteration's fixed cost. Packed, a prompt costs
        no less than its tokens' share of one full single-prompt chunk: the features charge
        attention per prompt (÷ n), but a packed chunk may cost what one sequence of all its
        tokens does (the project's worlds time it so), and a saturated engine is where that shows
        and where no record has shown it yet. Read per prompt, a short-prompt mix is modelled faster
        than any full chunk can run (53.4k tokens/s against the 48.2k of a full 8,192-token chunk
        on the bundled H200 profile), so an engine planned at 88% runs saturated."""
        alone = self.alone_s(isl_tokens, computed_share)
        if not self.packs:
            return alone
        computed = max(float(isl_tokens) * computed_share, 1.0)
        chunks = math.ceil(computed / self.chunk_tokens)
        fixed_ms = self.model.coefficients[0] * _PREFILL_SCALE[0]
        shared_ms = fixed_ms * (chunks - computed / self.chunk_tokens)
        full_chunk_s = self.iteration_ms(self.chunk_tokens) / 1000.0 * computed / self.chunk_tokens
        return max(alone - max(shared_ms, 0.0) / 1000.0, alone * 0.2, min(full_chunk_s, alone))

    def longest_within_s(
        self, budget_s: float, limit_tokens: int = 1 << 20, computed_share: float = 1.0
    ) -> int:
        """The longest prompt whose prefill alone fits in `budget_s` (0: not even one token)."""
        if self.alone_s(1, computed_share) > budget_s:
            return 0
        lo, hi = 1, limit_tokens
        if self.alone_s(hi, computed_share) <= budget_s:
            return hi
        while hi - lo > max(16, lo // 200):
            mid = (lo + hi) // 2
            if self.alone_s(mid, computed_share) <= budget_s:
                lo = mid
            else:
                hi = mid
        return lo


@dataclass(frozen=True)
class DecodeCost:
    model: LinearCost

    def iteration_ms(self, requests: float, kv_tokens: float) -> float:
        return self.model.predict_ms(decode_features(requests, kv_tokens))

    def beyond_data(self, requests: float, kv_tokens: float) -> bool:
        return self.model.outside(decode_features(requests, kv_tokens))


@dataclass(frozen=True)
class LatencyModels:
    """Both roles' learned costs: the planner's picture of its engines."""

    prefill: PrefillCost
    decode: DecodeCost

    def observed(
        self, role: str, records: Sequence[ForwardPassMetrics], now_s: float, fit_limit: int | None = None
    ) -> LatencyModels:
        """Fold `records` (in the order each engine ran them) into the role's model; the fit
        reads at most `fit_limit` of them, evenly spread."""
        fitted = _spread(records, fit_limit)
        if role == "prefill":
            return replace(self, prefill=_learn_prefill(self.prefill, records, fitted, now_s))
        if role == "decode":
            return replace(self, decode=_learn_decode(self.decode, fitted, now_s))
        return self


def _spread(records: Sequence[ForwardPassMetrics], limit: int | None) -> Sequence[ForwardPassMetrics]:
    if limit is None or len(records) <= limit:
        return records
    step = len(records) / limit
    return [records[int(i * step)] for i in range(limit)]


def _learn_prefill(
    cost: PrefillCost,
    records: Sequence[ForwardPassMetrics],
    fitted: Sequence[ForwardPassMetrics],
    now_s: float,
) -> PrefillCost:
    """The fit over `fitted`; the packing evidence over every record of `records`, since it
    compares each pass with the same engine's pass just before it (in a thinned list the pass
    before is an older one, and its queue says nothing of what this pass could schedule)."""
    rows, times = [], []
    for r in fitted:
        s = r.scheduled
        if r.wall_time_s <= 0 or s.sum_prefill_tokens <= 0:
            continue
        rows.append(prefill_features(s.sum_prefill_tokens, s.sum_prefill_kv_tokens, s.num_prefill_requests))
        times.append(r.wall_time_s * 1000.0)
    packed = unpacked = 0
    before: dict[tuple[str, int], ForwardPassMetrics] = {}  # each engine's previous record
    for r in records:
        s = r.scheduled
        previous = before.get((r.worker_id, r.dp_rank))
        before[(r.worker_id, r.dp_rank)] = r
        if r.wall_time_s <= 0 or s.sum_prefill_tokens <= 0:
            continue
        if s.num_prefill_requests >= 2:
            packed += 1
        elif (
            previous is not None
            and previous.queued.num_prefill_requests >= 2
            and s.sum_prefill_tokens < cost.chunk_tokens
        ):
            # Two prompts were waiting when this iteration was scheduled and the chunk had
            # room, yet it ran one: the engine does not pack prompts.
            unpacked += 1
    if not rows:
        return cost
    fade = 0.9
    return PrefillCost(
        model=cost.model.observed(np.array(rows), np.array(times), now_s),
        chunk_tokens=cost.chunk_tokens,
        packed_evidence=fade * cost.packed_evidence + packed,
        unpacked_evidence=fade * cost.unpacked_evidence + unpacked,
    )


def _learn_decode(cost: DecodeCost, records: Iterable[ForwardPassMetrics], now_s: float) -> DecodeCost:
    rows, times = [], []
    for r in records:
        s = r.scheduled
        if r.wall_time_s <= 0 or s.num_decode_requests <= 0:
            continue
        rows.append(decode_features(s.num_decode_requests, s.sum_decode_kv_tokens))
        times.append(r.wall_time_s * 1000.0)
    if not rows:
        return cost
    return DecodeCost(cost.model.observed(np.array(rows), np.array(times), now_s))


def prior_models(
    model: PerfModel,
    *,
    chunk_tokens: int,
    prior_records: float,
    half_life_s: float,
) -> LatencyModels:
    """The profile's measured points as the prior of both roles' models."""
    pre = model.prefill.data
    x_pre = np.array([prefill_features(float(t), 0.0) for t in pre.isl_tokens])
    dec = model.decode.data
    kv = np.asarray(dec.kv_usage, dtype=float) * dec.max_kv_tokens
    requests = np.maximum(kv / np.maximum(np.asarray(dec.context_tokens, dtype=float), 1.0), 1.0)
    x_dec = np.array([decode_features(n, k) for n, k in zip(requests, kv, strict=True)])
    kwargs = {"prior_records": prior_records, "half_life_s": half_life_s}
    return LatencyModels(
        prefill=PrefillCost(
            LinearCost.from_prior(x_pre, np.asarray(pre.ttft_ms, dtype=float), **kwargs), chunk_tokens
        ),
        decode=DecodeCost(LinearCost.from_prior(x_dec, np.asarray(dec.itl_ms, dtype=float), **kwargs)),
    )
