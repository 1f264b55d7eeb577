"""The FPM regressions of one deployment's mode (prefill and/or decode, or the aggregated one),
trained on every forward pass the engines report."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.core.perf.fpm import ForwardPassMetrics, ScheduledRequestMetrics
from app.core.perf.profile import Profile
from app.core.seed.regression import (
    BOOTSTRAP_WORKER_ID,
    DEFAULT_BUCKETS,
    DEFAULT_MAX_SAMPLES,
    DEFAULT_MIN_OBSERVATIONS,
    AggRegression,
    DecodeRegression,
    PrefillRegression,
    Regression,
)
from app.core.types import Mode, Role, roles_for_mode

_MODEL_FOR_ROLE: dict[Role, type[PrefillRegression] | type[DecodeRegression] | type[AggRegression]] = {
    "prefill": PrefillRegression,
    "decode": DecodeRegression,
    "workers": AggRegression,
}


class LoadModels:
    """The regressions of one deployment's mode: prefill and/or decode, or the aggregated one."""

    def __init__(
        self,
        mode: Mode,
        *,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        min_observations: int = DEFAULT_MIN_OBSERVATIONS,
        buckets: int = DEFAULT_BUCKETS,
    ) -> None:
        self.mode = mode
        self.regressions: dict[Role, Regression] = {
            role: _MODEL_FOR_ROLE[role](
                max_samples=max_samples, min_observations=min_observations, buckets=buckets
            )
            for role in roles_for_mode(mode)
        }

    @property
    def prefill(self) -> PrefillRegression | None:
        return self.regressions.get("prefill")  # type: ignore[return-value]

    @property
    def decode(self) -> DecodeRegression | None:
        return self.regressions.get("decode")  # type: ignore[return-value]

    @property
    def agg(self) -> AggRegression | None:
        return self.regressions.get("workers")  # type: ignore[return-value]

    def copy(self) -> LoadModels:
        """An independent copy for one tick to train."""
        new = LoadModels.__new__(LoadModels)
        new.mode = self.mode
        new.regressions = {role: model.copy() for role, model in self.regressions.items()}
        return new

    def observe_many(self, records: Mapping[Role, Iterable[ForwardPassMetrics]]) -> dict[Role, int]:
        """Train each role's model; returns how many records each used (heartbeats are not)."""
        unknown = set(records) - set(self.regressions)
        if unknown:
            raise ValueError(f"roles {sorted(unknown)} are not part of mode {self.mode!r}")
        return {role: self.regressions[role].observe_many(fpms) for role, fpms in records.items()}

    def bootstrap(self, profile: Profile) -> dict[Role, int]:
        """Warm the prefill and decode models with the profile's synthetic iterations (§3.4). The
        aggregated model has no profile source: it learns from live FPMs only."""
        prefill, decode = bootstrap_fpms_from_profile(profile)
        records: dict[Role, list[ForwardPassMetrics]] = {}
        if "prefill" in self.regressions:
            records["prefill"] = prefill
        if "decode" in self.regressions:
            records["decode"] = decode
        return self.observe_many(records)

    def diagnostics(self) -> dict[str, Any]:
        return {role: model.diagnostics() for role, model in self.regressions.items()}


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
