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

import math
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from app.core.fpm import ForwardPassMetrics, ScheduledRequestMetrics
from app.core.profile import Profile

DEFAULT_MAX_SAMPLES = 64
DEFAULT_MIN_OBSERVATIONS = 5
DEFAULT_BUCKETS = 16
MIN_PREDICTION_S = 1e-6
MAX_KV_HIT_RATE = 0.95  # a prefix cache never makes prefill free: cap the discount
# A negative coefficient whose effect over the whole observed range is below this is rounding
# noise of an exact fit (e.g. -1e-20 s/token), not a physical claim; it is read as zero.
NEGLIGIBLE_EFFECT_S = 1e-9
# Capacity searches without a known KV capacity (reference §3.4).
DEFAULT_DECODE_BATCH_CAP = 256
DEFAULT_AGG_BATCH_CAP = 1024
BOOTSTRAP_WORKER_ID = "profile"


def clamp_kv_hit_rate(rate: float | None) -> float:
    """None/NaN -> 0; otherwise within [0, 0.95]."""
    if rate is None or not math.isfinite(rate):
        return 0.0
    return min(max(rate, 0.0), MAX_KV_HIT_RATE)


class MovingAverage:
    """Mean of the last `window` values; zeros before the first non-zero value are skipped, so an
    idle start does not drag the averages towards zero."""

    def __init__(self, window: int) -> None:
        self._values: deque[float] = deque(maxlen=window)
        self._seen_nonzero = False

    def add(self, value: float) -> None:
        if value == 0.0 and not self._seen_nonzero:
            return
        self._seen_nonzero = self._seen_nonzero or value != 0.0
        self._values.append(float(value))

    @property
    def value(self) -> float:
        return sum(self._values) / len(self._values) if self._values else 0.0

    def __len__(self) -> int:
        return len(self._values)


@dataclass(frozen=True)
class Sample:
    seq: int  # arrival order; smaller is older
    x: tuple[float, ...]
    wall_time_s: float


@dataclass(frozen=True)
class Fit:
    intercept_s: float
    coef: tuple[float, ...]  # seconds per unit of each feature, after clipping
    clipped: tuple[str, ...]  # features whose negative coefficient was set to 0
    rank: int  # rank of the centred design; below the feature count = collinear samples


class PrefillCapacity(NamedTuple):
    engine_rps: float  # 0 = model not ready or invalid input
    ttft_ms: float


class DecodeCapacity(NamedTuple):
    engine_rps: float
    itl_ms: float


class AggCapacity(NamedTuple):
    engine_rps: float
    ttft_ms: float
    itl_ms: float


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
            self._lo[i] = min(self._lo[i], v)
            self._hi[i] = max(self._hi[i], v)
        self._samples.append(Sample(self._seq, x, float(fpm.wall_time_s)))
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
        keys = [self.bucket_of(s.x) for s in self._samples]
        counts = Counter(keys)
        fullest = max(counts.values())
        # Samples are oldest first, so the first one in a fullest bucket is that bucket's oldest;
        # between equally full buckets the one holding the older sample loses it.
        for i, key in enumerate(keys):
            if counts[key] == fullest:
                del self._samples[i]
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


def _chunked_prefill_s(total_tokens: float, mbt: int, predict: Any) -> float:
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
        return _chunked_prefill_s(total, max_num_batched_tokens, self._predict)

    def find_best_engine_prefill_rps(
        self, ttft_target_ms: float, isl_tokens: float, max_num_batched_tokens: int | None = None
    ) -> PrefillCapacity:
        """Requests/s one engine prefills at this ISL: 1 / wall time of one (chunked) prefill. Linear
        in tokens, batching B requests takes B times as long, so the rate does not depend on B. An
        unreachable target is still answered (the TTFT says so): the caller scales on load."""
        if isl_tokens <= 0 or self._ensure_fit() is None:
            return PrefillCapacity(0.0, 0.0)
        if max_num_batched_tokens and max_num_batched_tokens > 0:
            wall_s = _chunked_prefill_s(isl_tokens, max_num_batched_tokens, self._predict)
        else:
            wall_s = self._predict(isl_tokens)  # type: ignore[assignment]
        return PrefillCapacity(1.0 / wall_s, wall_s * 1000.0)  # type: ignore[operator]


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

    def find_best_engine_decode_rps(
        self,
        itl_target_ms: float,
        context_tokens: float,
        osl_tokens: float,
        max_kv_tokens: int | None = None,
        max_num_seqs: int | None = None,
    ) -> DecodeCapacity:
        """Requests/s one engine decodes within the ITL target: the largest batch whose predicted
        iteration fits, through Little's law (`batch / (osl * wall)`). Batch 1 over the target is
        still answered with its rate and ITL."""
        if context_tokens <= 0 or osl_tokens <= 0 or itl_target_ms <= 0 or self._ensure_fit() is None:
            return DecodeCapacity(0.0, 0.0)
        if max_kv_tokens and max_kv_tokens > 0:
            kv_cap = max(1, int(max_kv_tokens / context_tokens))
        elif self._max_kv_seen > 0:
            kv_cap = max(1, int(self._max_kv_seen / context_tokens))
        else:
            kv_cap = DEFAULT_DECODE_BATCH_CAP
        seq_cap = max_num_seqs if max_num_seqs and max_num_seqs > 0 else kv_cap
        best_bs, best_wall = 1, self._predict(1.0, context_tokens)
        assert best_wall is not None
        if best_wall * 1000.0 <= itl_target_ms:
            # Binary search: the prediction grows with the batch (coefficients are >= 0).
            lo, hi = 1, max(1, min(kv_cap, seq_cap))
            while lo <= hi:
                mid = (lo + hi) // 2
                wall = self._predict(float(mid), mid * context_tokens)
                assert wall is not None
                if wall * 1000.0 <= itl_target_ms:
                    best_bs, best_wall, lo = mid, wall, mid + 1
                else:
                    hi = mid - 1
        return DecodeCapacity(best_bs / (osl_tokens * best_wall), best_wall * 1000.0)


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
        return _chunked_prefill_s(
            total, max_num_batched_tokens, lambda chunk: self._predict(chunk, decode_kv)
        )

    def estimate_next_itl(self, scheduled_decode_kv: float, queued_decode_kv: float) -> float | None:
        """ITL (seconds) with one more average request decoding and the usual prefill piggybacked."""
        if self._ensure_fit() is None:
            return None
        total_kv = scheduled_decode_kv + queued_decode_kv + self._avg_decode_len.value
        return self._predict(self._avg_prefill_tokens.value, total_kv)

    def find_best_engine_agg_rps(
        self,
        isl_tokens: float,
        osl_tokens: float,
        max_num_batched_tokens: int,
        ttft_target_ms: float,
        itl_target_ms: float,
        max_kv_tokens: int | None = None,
        max_num_seqs: int | None = None,
        kv_hit_rate: float | None = None,
    ) -> AggCapacity:
        """Requests/s one engine serves within both targets: sweep the decode batch up from 1 and
        keep the last size meeting TTFT and ITL; the sweep stops where prefill admission can no
        longer keep up with decode egress (`isl / (mbt - batch) > osl`)."""
        mbt = max_num_batched_tokens
        if isl_tokens <= 0 or osl_tokens <= 0 or mbt <= 0 or self._ensure_fit() is None:
            return AggCapacity(0.0, 0.0, 0.0)
        effective_isl = isl_tokens * (1.0 - clamp_kv_hit_rate(kv_hit_rate))
        avg_ctx = isl_tokens + osl_tokens / 2.0  # KV residency uses the full ISL: hits save compute only
        if max_kv_tokens and max_kv_tokens > 0:
            kv_cap = max(1, int(max_kv_tokens / max(1.0, avg_ctx)))
        else:
            kv_cap = DEFAULT_AGG_BATCH_CAP
        seq_cap = max_num_seqs if max_num_seqs and max_num_seqs > 0 else kv_cap
        lo, hi = 1, max(1, min(kv_cap, seq_cap, mbt - 1))
        while lo < hi:  # largest batch with admission >= egress
            mid = (lo + hi + 1) // 2
            if mbt - mid > 0 and isl_tokens / (mbt - mid) <= osl_tokens:
                lo = mid
            else:
                hi = mid - 1
        best = AggCapacity(0.0, 0.0, 0.0)
        for bs in range(1, lo + 1):
            decode_kv = bs * avg_ctx
            prefill_per_iter = min(bs * effective_isl / max(1.0, osl_tokens), float(mbt))
            wall = self._predict(prefill_per_iter, decode_kv)
            ttft = self.estimate_next_ttft(int(prefill_per_iter), mbt, int(decode_kv))
            assert wall is not None and ttft is not None
            itl_ms, ttft_ms = wall * 1000.0, ttft * 1000.0
            if itl_ms > itl_target_ms or ttft_ms > ttft_target_ms:
                if bs == 1:
                    best = AggCapacity(1.0 / (osl_tokens * wall), ttft_ms, itl_ms)
                break
            best = AggCapacity(bs / (osl_tokens * wall), ttft_ms, itl_ms)
        return best


Regression = PrefillRegression | DecodeRegression | AggRegression


def bootstrap_fpms_from_profile(
    profile: Profile,
) -> tuple[list[ForwardPassMetrics], list[ForwardPassMetrics]]:
    """Synthetic iterations from the profiling data (reference §3.4, bootstrap source 3), so the
    models can estimate before the first live FPM arrives: `(prefill_fpms, decode_fpms)`.

    Prefill: one request of `isl` tokens per point, wall time = TTFT. Decode: the active KV tokens
    are `kv_usage * max_kv_tokens`, the batch is that over the context length (at least 1), and the
    wall time is the ITL."""
    prefill = [
        ForwardPassMetrics(
            worker_id=BOOTSTRAP_WORKER_ID,
            dp_rank=0,
            wall_time_s=float(ttft_ms) / 1000.0,
            scheduled=ScheduledRequestMetrics(num_prefill_requests=1, sum_prefill_tokens=round(float(isl))),
        )
        for isl, ttft_ms in zip(profile.prefill.isl_tokens, profile.prefill.ttft_ms, strict=True)
    ]
    decode = []
    data = profile.decode
    for usage, ctx, itl_ms in zip(data.kv_usage, data.context_tokens, data.itl_ms, strict=True):
        kv = round(float(usage) * data.max_kv_tokens)
        decode.append(
            ForwardPassMetrics(
                worker_id=BOOTSTRAP_WORKER_ID,
                dp_rank=0,
                wall_time_s=float(itl_ms) / 1000.0,
                scheduled=ScheduledRequestMetrics(
                    num_decode_requests=max(1, round(kv / float(ctx))), sum_decode_kv_tokens=kv
                ),
            )
        )
    return prefill, decode
