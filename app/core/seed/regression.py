"""FPM regressions: per-iteration wall time of an engine as a linear function of its batch.

Reference §3.4 (Dynamo's `core/perf_model/`). Three models share one base:

- `PrefillRegression`: `sum_prefill_tokens -> wall_time_s` (1-D, 16 buckets);
- `DecodeRegression`: `(num_decode_requests, sum_decode_kv_tokens) -> wall_time_s` (2-D, 4x4);
- `AggRegression`: `(sum_prefill_tokens, sum_decode_kv_tokens) -> wall_time_s` (2-D, 4x4).

Samples are kept in a bounded, bucketed window: every axis is cut into equal-width buckets between
the smallest and largest value ever seen on it, and when the window is over `max_samples` the
oldest sample of the fullest bucket goes. A FIFO window would let a long stretch at one operating
point push out everything else; retiring from the fullest bucket keeps the fit's coverage of the
whole range (bootstrap points included) while live traffic refreshes it.

The fit is ordinary least squares with an intercept, made lazily when a prediction needs it. A
fit is refused (the model is "not ready", and `not_ready_reason` says why) with fewer than
`min_observations` samples, when a feature never varied, or when a coefficient is negative: "more
work takes less time" is physically meaningless and would invert scaling decisions. The one
exception is decode's `num_decode_requests`, which is nearly collinear with the KV tokens and can
flip sign on noise: its coefficient is clipped to 0.

Times: wall times and the `estimate_*` results are in seconds, `find_best_*` results in ms.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from app.core.perf.fpm import ForwardPassMetrics, ScheduledRequestMetrics
from app.core.seed.averages import MovingAverage

DEFAULT_MAX_SAMPLES = 64
DEFAULT_MIN_OBSERVATIONS = 5
DEFAULT_BUCKETS = 16
MIN_PREDICTION_S = 1e-6
MAX_KV_HIT_RATE = 0.95  # a prefix cache never makes prefill free: cap the discount
# A negative coefficient whose effect over the whole observed range is below this is rounding
# noise of an exact fit (e.g. -1e-20 s/token), not a physical claim; it is read as zero.
NEGLIGIBLE_EFFECT_S = 1e-9
# Capacity searches without a known KV capacity (reference §3.4).
BOOTSTRAP_WORKER_ID = "profile"


def clamp_kv_hit_rate(rate: float | None) -> float:
    """None/NaN -> 0; otherwise within [0, 0.95]."""
    if rate is None or not math.isfinite(rate):
        return 0.0
    return min(max(rate, 0.0), MAX_KV_HIT_RATE)


@dataclass(frozen=True)
class Sample:
    seq: int  # arrival order; smaller is older
    x: tuple[float, ...]
    wall_time_s: float

    def __deepcopy__(self, memo: dict) -> Sample:
        # Immutable: a copied regression (the planner copies what a tick changes) shares it.
        return self


@dataclass(frozen=True)
class Fit:
    intercept_s: float
    coef: tuple[float, ...]  # seconds per unit of each feature, after clipping
    clipped: tuple[str, ...]  # features whose negative coefficient was set to 0
    rank: int  # rank of the centred design; below the feature count = collinear samples

    def __deepcopy__(self, memo: dict) -> Fit:
        return self  # immutable, as Sample


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, int]:
    """Least squares with an intercept. Centring first makes a collinear design (decode's request
    count and KV tokens often move together) resolve to the minimum-norm slopes, as sklearn's
    LinearRegression does, instead of trading slope for intercept."""
    x_mean, y_mean = x.mean(axis=0), y.mean()
    coef, _, rank, _ = np.linalg.lstsq(x - x_mean, y - y_mean, rcond=None)
    return float(y_mean - x_mean @ coef), coef, int(rank)


class _Regression:
    feature_names: tuple[str, ...] = ()
    clippable: frozenset[str] = frozenset()

    def __init__(
        self,
        *,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        min_observations: int = DEFAULT_MIN_OBSERVATIONS,
        buckets: int = DEFAULT_BUCKETS,
    ) -> None:
        if max_samples < 1 or min_observations < 1 or buckets < 1:
            raise ValueError("max_samples, min_observations and buckets must be >= 1")
        ndim = len(self.feature_names)
        per_axis = buckets if ndim == 1 else math.isqrt(buckets)
        if ndim > 1 and per_axis**ndim != buckets:
            raise ValueError(f"a {ndim}-D model needs a perfect-power bucket count, got {buckets}")
        self.max_samples = max_samples
        self.min_observations = min_observations
        self.buckets_per_axis = per_axis
        self._samples: list[Sample] = []  # oldest first
        self._seq = 0
        self._lo = [math.inf] * ndim
        self._hi = [-math.inf] * ndim
        self._heartbeats = 0
        self._rejected = 0
        self._fit: Fit | None = None
        self._fit_reason: str | None = None
        self._fitted = False  # the cached fit (or refusal) matches the samples
        # Each sample's bucket under the current bounds and the buckets' counts (None: the bounds
        # widened, rebuilt when needed): retiring a sample costs a scan, not a re-bucketing.
        self._keys: list[tuple[int, ...]] | None = None
        self._counts: Counter[tuple[int, ...]] = Counter()

    def copy(self) -> Self:
        """An independent copy for one tick to train (the planner commits it once the tick is
        stored). Samples and fits are immutable and shared; the containers are copied."""
        new = copy.copy(self)
        new._samples, new._lo, new._hi = list(self._samples), list(self._lo), list(self._hi)
        new._keys = list(self._keys) if self._keys is not None else None
        new._counts = Counter(self._counts)
        for name, value in vars(self).items():
            if isinstance(value, MovingAverage):
                setattr(new, name, value.copy())
        return new

    # --- observations ------------------------------------------------------------------------

    def _features(self, s: ScheduledRequestMetrics) -> tuple[float, ...]:
        raise NotImplementedError

    def _update_averages(self, s: ScheduledRequestMetrics) -> None:
        raise NotImplementedError

    def observe(self, fpm: ForwardPassMetrics) -> bool:
        """Add one iteration; False when it was not used. A heartbeat (`wall_time_s == 0`) is not an
        iteration: it neither trains the fit nor moves the averages. Negative or non-finite wall
        times are dropped and counted (see `diagnostics()`)."""
        if fpm.is_heartbeat:
            self._heartbeats += 1
            return False
        if not math.isfinite(fpm.wall_time_s) or fpm.wall_time_s < 0:
            self._rejected += 1
            return False
        x = self._features(fpm.scheduled)
        if not all(math.isfinite(v) and v >= 0 for v in x):
            self._rejected += 1
            return False
        self._update_averages(fpm.scheduled)
        for i, v in enumerate(x):
            if v < self._lo[i] or v > self._hi[i]:
                self._keys = None  # the bounds widen: every sample's bucket may move
            self._lo[i] = min(self._lo[i], v)
            self._hi[i] = max(self._hi[i], v)
        self._samples.append(Sample(self._seq, x, float(fpm.wall_time_s)))
        if self._keys is not None:
            key = self.bucket_of(x)
            self._keys.append(key)
            self._counts[key] += 1
        self._seq += 1
        if len(self._samples) > self.max_samples:
            self._retire_one()
        self._fitted = False
        return True

    def observe_many(self, fpms: Iterable[ForwardPassMetrics]) -> int:
        """`observe` each; returns how many were used."""
        return sum(1 for fpm in fpms if self.observe(fpm))

    def bucket_of(self, x: Sequence[float]) -> tuple[int, ...]:
        """The bucket of a point under the current axis bounds (bounds only ever widen, and every
        sample is re-bucketed against them, so a widened range spreads the old samples out)."""
        key = []
        for i, v in enumerate(x):
            lo, hi = self._lo[i], self._hi[i]
            if not hi > lo:
                key.append(0)
                continue
            idx = int((v - lo) / (hi - lo) * self.buckets_per_axis)
            key.append(min(max(idx, 0), self.buckets_per_axis - 1))
        return tuple(key)

    def bucket_counts(self) -> dict[tuple[int, ...], int]:
        return dict(Counter(self.bucket_of(s.x) for s in self._samples))

    def _retire_one(self) -> None:
        if self._keys is None:
            self._keys = [self.bucket_of(s.x) for s in self._samples]
            self._counts = Counter(self._keys)
        keys, counts = self._keys, self._counts
        fullest = max(counts.values())
        # Samples are oldest first, so the first one in a fullest bucket is that bucket's oldest;
        # between equally full buckets the one holding the older sample loses it.
        for i, key in enumerate(keys):
            if counts[key] == fullest:
                del self._samples[i]
                del keys[i]
                counts[key] -= 1
                if not counts[key]:
                    del counts[key]
                return

    # --- fit ---------------------------------------------------------------------------------

    @property
    def samples(self) -> tuple[Sample, ...]:
        return tuple(self._samples)

    @property
    def num_observations(self) -> int:
        return len(self._samples)

    def has_sufficient_data(self) -> bool:
        return len(self._samples) >= self.min_observations

    def _ensure_fit(self) -> Fit | None:
        if not self._fitted:
            self._fit, self._fit_reason = self._compute_fit()
            self._fitted = True
        return self._fit

    def _compute_fit(self) -> tuple[Fit | None, str | None]:
        n = len(self._samples)
        if n < self.min_observations:
            return None, f"too few observations ({n} of {self.min_observations})"
        x = np.array([s.x for s in self._samples], dtype=np.float64)
        y = np.array([s.wall_time_s for s in self._samples], dtype=np.float64)
        spread = x.max(axis=0) - x.min(axis=0)
        for i, name in enumerate(self.feature_names):
            if spread[i] == 0 and name not in self.clippable:
                return None, (
                    f"{name} was {x[0, i]:g} in all {n} samples: its effect on wall time cannot be learned"
                )

        active = [i for i in range(x.shape[1]) if spread[i] > 0]
        clipped: list[str] = []
        while True:
            if active:
                intercept, coef_active, rank = _ols(x[:, active], y)
            else:
                intercept, coef_active, rank = float(y.mean()), np.zeros(0), 0
            coef = np.zeros(x.shape[1])
            coef[active] = coef_active
            negative = [i for i in active if coef[i] < 0 and coef[i] * spread[i] < -NEGLIGIBLE_EFFECT_S]
            if not negative:
                break
            hard = [i for i in negative if self.feature_names[i] not in self.clippable]
            if hard:
                i = hard[0]
                return None, (
                    f"negative coefficient for {self.feature_names[i]} ({coef[i]:.3g} s per unit): "
                    "more work would take less time"
                )
            # Clipping a coefficient to 0 and keeping the others as they were would leave them
            # biased; the least-squares fit under "this coefficient is 0" is the refit without it.
            for i in negative:
                active.remove(i)
                clipped.append(self.feature_names[i])
        coef = np.where(coef < 0, 0.0, coef)  # the negligible rounding-noise ones
        if not all(math.isfinite(v) for v in (intercept, *coef)):
            return None, "the fit is not finite"
        return Fit(float(intercept), tuple(float(c) for c in coef), tuple(clipped), rank), None

    @property
    def ready(self) -> bool:
        return self._ensure_fit() is not None

    @property
    def not_ready_reason(self) -> str | None:
        self._ensure_fit()
        return self._fit_reason

    def coefficients(self) -> dict[str, Any] | None:
        """`intercept_s` and `<feature>_s` (seconds per unit of the feature), the clipped features
        and the design's rank; None when not ready (`not_ready_reason` says why)."""
        fit = self._ensure_fit()
        if fit is None:
            return None
        return {
            "intercept_s": fit.intercept_s,
            **{f"{name}_s": c for name, c in zip(self.feature_names, fit.coef, strict=True)},
            "clipped": list(fit.clipped),
            "rank": fit.rank,
        }

    def _predict(self, *x: float) -> float | None:
        fit = self._ensure_fit()
        if fit is None:
            return None
        value = fit.intercept_s + sum(c * v for c, v in zip(fit.coef, x, strict=True))
        return max(MIN_PREDICTION_S, value)

    def _averages(self) -> dict[str, float]:
        return {}

    def diagnostics(self) -> dict[str, Any]:
        return {
            "observations": len(self._samples),
            "min_observations": self.min_observations,
            "max_samples": self.max_samples,
            "ready": self.ready,
            "not_ready_reason": self.not_ready_reason,
            "coefficients": self.coefficients(),
            "averages": self._averages(),
            "axis_bounds": {
                name: [lo, hi] if hi >= lo else None
                for name, lo, hi in zip(self.feature_names, self._lo, self._hi, strict=True)
            },
            "buckets_in_use": len(self.bucket_counts()),
            "heartbeats_ignored": self._heartbeats,
            "invalid_ignored": self._rejected,
        }


def chunked_prefill_s(total_tokens: float, mbt: int, predict: Any) -> float:
    """Time to push `total_tokens` through iterations of at most `mbt` tokens: ceil(total/mbt)
    iterations, all full but the last. The predictions are linear, so this equals the per-chunk sum."""
    n = math.ceil(total_tokens / mbt)
    last = total_tokens - (n - 1) * mbt
    return (n - 1) * predict(float(mbt)) + predict(last)


class PrefillRegression(_Regression):
    """wall_time_s = a + b * sum_prefill_tokens."""

    feature_names = ("sum_prefill_tokens",)

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self._avg_isl = MovingAverage(self.max_samples)
        self._avg_num_prefill = MovingAverage(self.max_samples)

    def _features(self, s: ScheduledRequestMetrics) -> tuple[float, ...]:
        return (float(s.sum_prefill_tokens),)

    def _update_averages(self, s: ScheduledRequestMetrics) -> None:
        if s.num_prefill_requests > 0:
            self._avg_isl.add(s.sum_prefill_tokens / s.num_prefill_requests)
        self._avg_num_prefill.add(float(s.num_prefill_requests))

    @property
    def avg_isl_tokens(self) -> float:
        return self._avg_isl.value

    def _averages(self) -> dict[str, float]:
        return {"isl_tokens": self._avg_isl.value, "num_prefill_requests": self._avg_num_prefill.value}

    def predict_wall_s(self, prefill_tokens: float) -> float | None:
        return self._predict(prefill_tokens)

    def estimate_next_ttft(
        self, queued_prefill_tokens: float, max_num_batched_tokens: int, kv_hit_rate: float | None = None
    ) -> float | None:
        """TTFT (seconds) of a request arriving now: the queue ahead of it plus its own average ISL,
        less the prefix-cache hit share, prefilled in chunks of `max_num_batched_tokens`.
        None when the model is not ready or the chunk size is unknown."""
        if max_num_batched_tokens <= 0 or self._ensure_fit() is None:
            return None
        total = (queued_prefill_tokens + self._avg_isl.value) * (1.0 - clamp_kv_hit_rate(kv_hit_rate))
        if total <= 0:
            return 0.0
        return chunked_prefill_s(total, max_num_batched_tokens, self._predict)


class DecodeRegression(_Regression):
    """wall_time_s = a + b * num_decode_requests + c * sum_decode_kv_tokens (b clipped to >= 0)."""

    feature_names = ("num_decode_requests", "sum_decode_kv_tokens")
    clippable = frozenset({"num_decode_requests"})

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self._avg_decode_len = MovingAverage(self.max_samples)
        self._avg_num_decode = MovingAverage(self.max_samples)
        self._max_kv_seen = 0.0

    def _features(self, s: ScheduledRequestMetrics) -> tuple[float, ...]:
        return (float(s.num_decode_requests), float(s.sum_decode_kv_tokens))

    def _update_averages(self, s: ScheduledRequestMetrics) -> None:
        if s.num_decode_requests > 0:
            self._avg_decode_len.add(s.sum_decode_kv_tokens / s.num_decode_requests)
        self._avg_num_decode.add(float(s.num_decode_requests))
        self._max_kv_seen = max(self._max_kv_seen, float(s.sum_decode_kv_tokens))

    @property
    def avg_decode_length_tokens(self) -> float:
        return self._avg_decode_len.value

    @property
    def max_kv_seen(self) -> float:
        """The most decode KV tokens one iteration has held (a batch-size cap without a configured one)."""
        return self._max_kv_seen

    @property
    def avg_num_decode_requests(self) -> float:
        return self._avg_num_decode.value

    def _averages(self) -> dict[str, float]:
        return {
            "decode_length_tokens": self._avg_decode_len.value,
            "num_decode_requests": self._avg_num_decode.value,
            "max_decode_kv_tokens_seen": self._max_kv_seen,
        }

    def predict_wall_s(self, num_decode_requests: float, sum_decode_kv_tokens: float) -> float | None:
        return self._predict(num_decode_requests, sum_decode_kv_tokens)

    def estimate_next_itl(self, scheduled_decode_kv: float, queued_decode_kv: float) -> float | None:
        """ITL (seconds) of the next iteration once one more average request joins the batch."""
        if self._ensure_fit() is None:
            return None
        total_kv = scheduled_decode_kv + queued_decode_kv + self._avg_decode_len.value
        return self._predict(self._avg_num_decode.value + 1.0, total_kv)


class AggRegression(_Regression):
    """wall_time_s = a + b * sum_prefill_tokens + c * sum_decode_kv_tokens (chunked prefill mixed
    with decode in the same iterations)."""

    feature_names = ("sum_prefill_tokens", "sum_decode_kv_tokens")

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        window = self.max_samples
        self._avg_isl = MovingAverage(window)
        self._avg_decode_len = MovingAverage(window)
        self._avg_prefill_tokens = MovingAverage(window)
        self._avg_num_prefill = MovingAverage(window)
        self._avg_num_decode = MovingAverage(window)

    def _features(self, s: ScheduledRequestMetrics) -> tuple[float, ...]:
        return (float(s.sum_prefill_tokens), float(s.sum_decode_kv_tokens))

    def _update_averages(self, s: ScheduledRequestMetrics) -> None:
        if s.num_prefill_requests > 0:
            self._avg_isl.add(s.sum_prefill_tokens / s.num_prefill_requests)
        if s.num_decode_requests > 0:
            self._avg_decode_len.add(s.sum_decode_kv_tokens / s.num_decode_requests)
        self._avg_prefill_tokens.add(float(s.sum_prefill_tokens))
        self._avg_num_prefill.add(float(s.num_prefill_requests))
        self._avg_num_decode.add(float(s.num_decode_requests))

    @property
    def avg_isl_tokens(self) -> float:
        return self._avg_isl.value

    @property
    def avg_decode_length_tokens(self) -> float:
        return self._avg_decode_len.value

    @property
    def avg_prefill_tokens_per_iteration(self) -> float:
        return self._avg_prefill_tokens.value

    def _averages(self) -> dict[str, float]:
        return {
            "isl_tokens": self._avg_isl.value,
            "decode_length_tokens": self._avg_decode_len.value,
            "prefill_tokens_per_iteration": self._avg_prefill_tokens.value,
            "num_prefill_requests": self._avg_num_prefill.value,
            "num_decode_requests": self._avg_num_decode.value,
        }

    def predict_wall_s(self, sum_prefill_tokens: float, sum_decode_kv_tokens: float) -> float | None:
        return self._predict(sum_prefill_tokens, sum_decode_kv_tokens)

    def estimate_next_ttft(
        self,
        queued_prefill_tokens: float,
        max_num_batched_tokens: int,
        current_decode_kv: float,
        kv_hit_rate: float | None = None,
    ) -> float | None:
        """Like the prefill model's, but every chunk shares its iteration with the decode batch."""
        if max_num_batched_tokens <= 0 or self._ensure_fit() is None:
            return None
        total = (queued_prefill_tokens + self._avg_isl.value) * (1.0 - clamp_kv_hit_rate(kv_hit_rate))
        if total <= 0:
            return 0.0
        decode_kv = float(current_decode_kv)
        return chunked_prefill_s(total, max_num_batched_tokens, lambda chunk: self._predict(chunk, decode_kv))

    def estimate_next_itl(self, scheduled_decode_kv: float, queued_decode_kv: float) -> float | None:
        """ITL (seconds) with one more average request decoding and the usual prefill piggybacked."""
        if self._ensure_fit() is None:
            return None
        total_kv = scheduled_decode_kv + queued_decode_kv + self._avg_decode_len.value
        return self._predict(self._avg_prefill_tokens.value, total_kv)


Regression = PrefillRegression | DecodeRegression | AggRegression
