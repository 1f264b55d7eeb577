"""Load-based scaling: the engines' latest forward passes, through the FPM regressions, to ±1.

One load step (reference §4.3–§4.8):
1. disabled -> `disabled`; a pending target the ready counts have not reached (and that has not
   expired) -> `scaling_in_progress`: observe only, never stack a second action on the first;
2. no FPM at all -> `no_fpm_data`; FPMs that do not match the ready workers (distinct worker ids
   vs the ready count, or workers with different numbers of DP ranks) -> `worker_count_mismatch`;
3. per engine: the TTFT a request arriving now would see (prefill: chunked prefill of the queue
   plus its own tokens) and the next ITL (decode: one more average request in the batch);
4. up by one when *every* engine is over its target; down by one only if the engines that remain,
   absorbing the leaving engine's share (`c = N/(N-1)`), stay under `target × sensitivity` and
   within the KV cache (otherwise `scale_down_refused_consolidation`); else `no_change`;
5. the throughput result, when both modes run, is a floor (`scale_down_capped_by_throughput` when
   it lifted a load decision that wanted to go down); then the replica bounds.

The regressions are trained by the caller (`LoadModels.observe_many`) with every FPM it receives,
on every tick, whether or not load scaling decides: that is how the models stay fresh. `load_step`
only reads them. Nothing here reads the clock: `now` comes in with the input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from app.core.fpm import ForwardPassMetrics
from app.core.profile import Profile
from app.core.regression import (
    DEFAULT_BUCKETS,
    DEFAULT_MAX_SAMPLES,
    DEFAULT_MIN_OBSERVATIONS,
    AggRegression,
    DecodeRegression,
    PrefillRegression,
    Regression,
    bootstrap_fpms_from_profile,
)
from app.core.types import Mode, Replicas, Role, RoleBounds, roles_for_mode

EngineKey = tuple[str, int]  # (worker_id, dp_rank)
DEFAULT_PENDING_EXPIRY_S = 900.0  # 5 x the reference's default throughput interval of 180 s


class LoadReason(StrEnum):
    """The reference's load decision states (§5.3), so dashboards read the same."""

    UNSET = "unset"
    DISABLED = "disabled"
    NO_FPM_DATA = "no_fpm_data"
    SCALING_IN_PROGRESS = "scaling_in_progress"
    WORKER_COUNT_MISMATCH = "worker_count_mismatch"
    INSUFFICIENT_DATA = "insufficient_data"
    NO_CHANGE = "no_change"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    SCALE_DOWN_CAPPED_BY_THROUGHPUT = "scale_down_capped_by_throughput"
    SCALE_DOWN_REFUSED_CONSOLIDATION = "scale_down_refused_consolidation"


# Which role's reason speaks for a step that changed something (§4.3 step 7).
_CHANGE_PRIORITY = {
    LoadReason.SCALE_UP: 4,
    LoadReason.SCALE_DOWN_CAPPED_BY_THROUGHPUT: 3,
    LoadReason.SCALE_DOWN: 2,
    LoadReason.NO_CHANGE: 1,
}


class PendingState(StrEnum):
    """What became of the last issued target; the caller clears it on `reached` or `expired`."""

    NONE = "none"
    WAITING = "waiting"
    REACHED = "reached"
    EXPIRED = "expired"


@dataclass(frozen=True)
class LoadSettings:
    mode: Mode
    ttft_target_ms: float
    itl_target_ms: float
    sensitivity: float = 0.8  # scale down only with this fraction of the target to spare
    # Missing roles: at least 1, no maximum.
    bounds: Mapping[Role, RoleBounds] = field(default_factory=dict)
    max_num_batched_tokens: int | None = None  # prefill (or aggregated) engines' chunk size
    max_kv_tokens: int | None = None  # decode (or aggregated) engines' KV cache capacity
    pending_expiry_s: float = DEFAULT_PENDING_EXPIRY_S
    enabled: bool = True

    def __post_init__(self) -> None:
        roles_for_mode(self.mode)  # KeyError for an unknown mode
        if not self.ttft_target_ms > 0 or not self.itl_target_ms > 0:
            raise ValueError("ttft_target_ms and itl_target_ms must be > 0")
        if not 0 < self.sensitivity <= 1:
            raise ValueError(f"sensitivity must be in (0, 1], got {self.sensitivity}")
        if not self.pending_expiry_s > 0:
            raise ValueError("pending_expiry_s must be > 0")

    def min_replicas(self, role: Role) -> int:
        return self.bounds[role].min_replicas if role in self.bounds else 1

    def max_replicas(self, role: Role) -> int | None:
        return self.bounds[role].max_replicas if role in self.bounds else None


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


@dataclass(frozen=True)
class PendingTarget:
    """The last target sent to the cluster, and when (aware datetime)."""

    replicas: Replicas
    issued_at: datetime


@dataclass(frozen=True)
class LoadInput:
    # role -> {(worker_id, dp_rank): latest FPM}; heartbeats are fine (they carry the queue state).
    fpm: Mapping[Role, Mapping[EngineKey, ForwardPassMetrics]]
    ready: Mapping[Role, int]  # ready workers per role, from the inventory
    now: datetime
    pending: PendingTarget | None = None
    throughput_floor: Mapping[Role, int] | None = None  # when throughput scaling also runs
    kv_hit_rate: float | None = None  # the sticky prefix-cache hit rate, discounts prefill work


@dataclass(frozen=True)
class LoadTick:
    """Load scaling's share of a tick: the models (already fed this tick's FPM), the input and
    the settings."""

    models: LoadModels
    input: LoadInput
    settings: LoadSettings


@dataclass(frozen=True)
class LoadResult:
    replicas: Replicas | None  # every role of the mode when something changes; None otherwise
    reason: LoadReason
    reasons: dict[Role, LoadReason]
    detail: str
    pending: PendingState
    diagnostics: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Signal:
    """One sub-decision: the load's wish for a role (None: no signal) and why."""

    desired: int | None
    reason: LoadReason | None  # why there is no move (desired None or == current)
    detail: str
    engines: list[dict[str, Any]] = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)
    refused: bool = False


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _engine_id(key: EngineKey) -> str:
    return f"{key[0]}:dp{key[1]}"


def _decide(
    estimates_ms: list[float],
    target_ms: float,
    n: int,
    settings: LoadSettings,
    role: Role,
    *,
    can_scale_down: bool,
    refusal: str | None,
    label: str,
) -> _Signal:
    """Up when every engine is over target, else down when the consolidation checks allowed it."""
    worst = max(estimates_ms)
    if all(t > target_ms for t in estimates_ms):
        top = settings.max_replicas(role)
        if top is not None and n + 1 > top:
            return _Signal(
                n, LoadReason.NO_CHANGE, f"every engine over the {label} target but already at max {top}"
            )
        return _Signal(
            n + 1,
            None,
            f"every engine's {label} over {target_ms:g} ms (max {worst:.1f} ms): {n} -> {n + 1}",
        )
    if can_scale_down:
        return _Signal(
            n - 1,
            None,
            f"max {label} {worst:.1f} ms; the {n - 1} remaining stay within {settings.sensitivity:g} x "
            f"{target_ms:g} ms after absorbing one engine's load: {n} -> {n - 1}",
        )
    if refusal is not None:
        return _Signal(None, LoadReason.SCALE_DOWN_REFUSED_CONSOLIDATION, refusal, refused=True)
    if n <= settings.min_replicas(role):
        why = f"at the minimum of {settings.min_replicas(role)}" if n > 1 else "a single worker"
        return _Signal(None, LoadReason.NO_CHANGE, f"max {label} {worst:.1f} ms; {why}")
    return _Signal(None, LoadReason.NO_CHANGE, f"max {label} {worst:.1f} ms")


def _can_try_down(n: int, settings: LoadSettings, role: Role) -> bool:
    return n > 1 and n - 1 >= settings.min_replicas(role)


def _not_ready(model: Regression, label: str) -> _Signal | None:
    if not model.ready:
        return _Signal(
            None, LoadReason.INSUFFICIENT_DATA, f"{label} model not ready: {model.not_ready_reason}"
        )
    return None


def _prefill_signal(
    model: PrefillRegression,
    engines: Mapping[EngineKey, ForwardPassMetrics],
    n: int,
    settings: LoadSettings,
    kv_hit_rate: float | None,
) -> _Signal:
    not_ready = _not_ready(model, "prefill")
    if not_ready is not None:
        return not_ready
    mbt = settings.max_num_batched_tokens
    if not mbt or mbt <= 0:
        return _Signal(None, LoadReason.INSUFFICIENT_DATA, "max_num_batched_tokens unknown: no TTFT estimate")
    target, sens = settings.ttft_target_ms, settings.sensitivity
    c = n / (n - 1) if n > 1 else 1.0
    check = _can_try_down(n, settings, "prefill")
    refusal: str | None = None
    checks: dict[str, Any] = {"consolidation_factor": c}
    t_own_ms = budget_ms = 0.0
    if check:
        # The new request's own prefill costs the same on any engine; only the queue ahead of it grows
        # when an engine leaves, so the sensitivity margin applies to the queue's share of the target.
        t_own_ms = _ms(model.estimate_next_ttft(0, mbt, kv_hit_rate)) or 0.0
        budget_ms = (target - t_own_ms) * sens
        checks.update(own_ttft_ms=t_own_ms, queue_budget_ms=budget_ms)
        if budget_ms <= 0:
            check = False
            refusal = f"own prefill {t_own_ms:.1f} ms leaves no queue budget under {target:g} ms"
    estimates: list[float] = []
    rows = []
    for key in sorted(engines):
        fpm = engines[key]
        queued = fpm.queued.sum_prefill_tokens
        est_ms = _ms(model.estimate_next_ttft(queued, mbt, kv_hit_rate))
        assert est_ms is not None  # ready and mbt > 0
        estimates.append(est_ms)
        row: dict[str, Any] = {
            "engine": _engine_id(key),
            "heartbeat": fpm.is_heartbeat,
            "queued_prefill_tokens": queued,
            "estimated_ttft_ms": est_ms,
        }
        if check:
            post_queued = int(queued * c)
            post_ms = _ms(model.estimate_next_ttft(post_queued, mbt, kv_hit_rate)) or 0.0
            row.update(post_queued_prefill_tokens=post_queued, post_ttft_ms=post_ms)
            row["post_queue_ttft_ms"] = post_ms - t_own_ms
            if post_ms - t_own_ms >= budget_ms and refusal is None:
                refusal = (
                    f"{_engine_id(key)}: after consolidation its queue adds {post_ms - t_own_ms:.1f} ms, "
                    f">= the budget ({target:g} - {t_own_ms:.1f}) x {sens:g} = {budget_ms:.1f} ms"
                )
        rows.append(row)
    signal = _decide(
        estimates,
        target,
        n,
        settings,
        "prefill",
        can_scale_down=check and refusal is None,
        refusal=refusal,
        label="TTFT",
    )
    signal.engines, signal.checks = rows, checks
    return signal


def _itl_after_consolidation(
    model: DecodeRegression | AggRegression,
    key: EngineKey,
    post_kv: int,
    row: dict[str, Any],
    settings: LoadSettings,
) -> str | None:
    """Why this engine could not take over its share of a removed engine's decode work (None:
    it could): its KV cache would overflow, or its ITL would reach target × sensitivity."""
    max_kv, target, sens = settings.max_kv_tokens, settings.itl_target_ms, settings.sensitivity
    row["post_kv_tokens"] = post_kv
    if max_kv and max_kv > 0 and post_kv >= max_kv:
        # Past the cache the engine queues or evicts: a regime the linear model knows nothing of.
        return (
            f"{_engine_id(key)}: {post_kv} KV tokens after consolidation would not fit the cache of {max_kv}"
        )
    post_ms = _ms(model.estimate_next_itl(post_kv, 0)) or 0.0
    row["post_itl_ms"] = post_ms
    if post_ms >= target * sens:
        return f"{_engine_id(key)}: ITL after consolidation {post_ms:.1f} ms >= {sens:g} x {target:g} ms"
    return None


def _decode_signal(
    model: DecodeRegression,
    engines: Mapping[EngineKey, ForwardPassMetrics],
    n: int,
    settings: LoadSettings,
) -> _Signal:
    not_ready = _not_ready(model, "decode")
    if not_ready is not None:
        return not_ready
    target, max_kv = settings.itl_target_ms, settings.max_kv_tokens
    c = n / (n - 1) if n > 1 else 1.0
    check = _can_try_down(n, settings, "decode")
    refusal: str | None = None
    estimates: list[float] = []
    rows = []
    for key in sorted(engines):
        fpm = engines[key]
        sched_kv, queued_kv = fpm.scheduled.sum_decode_kv_tokens, fpm.queued.sum_decode_kv_tokens
        est_ms = _ms(model.estimate_next_itl(sched_kv, queued_kv))
        assert est_ms is not None
        estimates.append(est_ms)
        row: dict[str, Any] = {
            "engine": _engine_id(key),
            "heartbeat": fpm.is_heartbeat,
            "scheduled_decode_kv_tokens": sched_kv,
            "queued_decode_kv_tokens": queued_kv,
            "estimated_itl_ms": est_ms,
        }
        if check:
            problem = _itl_after_consolidation(model, key, int((sched_kv + queued_kv) * c), row, settings)
            refusal = refusal or problem
        rows.append(row)
    signal = _decide(
        estimates,
        target,
        n,
        settings,
        "decode",
        can_scale_down=check and refusal is None,
        refusal=refusal,
        label="ITL",
    )
    signal.engines = rows
    signal.checks = {"consolidation_factor": c, "max_kv_tokens": max_kv}
    return signal


def _agg_signal(
    model: AggRegression,
    engines: Mapping[EngineKey, ForwardPassMetrics],
    n: int,
    settings: LoadSettings,
    kv_hit_rate: float | None,
) -> _Signal:
    """Aggregated engines: a TTFT signal and an ITL signal; up if either is over, down only if
    both allow it (reference §4.5, last paragraph)."""
    not_ready = _not_ready(model, "aggregated")
    if not_ready is not None:
        return not_ready
    mbt, max_kv, sens = settings.max_num_batched_tokens, settings.max_kv_tokens, settings.sensitivity
    c = n / (n - 1) if n > 1 else 1.0
    check = _can_try_down(n, settings, "workers")
    rows = {key: {"engine": _engine_id(key), "heartbeat": engines[key].is_heartbeat} for key in engines}

    prefill: _Signal | None = None  # None: no TTFT signal (chunk size unknown)
    if mbt and mbt > 0:
        ttft_target = settings.ttft_target_ms
        refusal: str | None = None
        estimates: list[float] = []
        for key in sorted(engines):
            fpm = engines[key]
            queued, decode_kv = fpm.queued.sum_prefill_tokens, fpm.scheduled.sum_decode_kv_tokens
            est_ms = _ms(model.estimate_next_ttft(queued, mbt, decode_kv, kv_hit_rate))
            assert est_ms is not None
            estimates.append(est_ms)
            row = rows[key]
            row.update(queued_prefill_tokens=queued, estimated_ttft_ms=est_ms)
            if check:
                # The survivor takes both a share of the queue and of the decode batch it prefills beside.
                post_queued, post_kv = int(queued * c), int(decode_kv * c)
                own_ms = _ms(model.estimate_next_ttft(0, mbt, post_kv, kv_hit_rate)) or 0.0
                post_ms = _ms(model.estimate_next_ttft(post_queued, mbt, post_kv, kv_hit_rate)) or 0.0
                budget_ms = (ttft_target - own_ms) * sens
                row.update(post_own_ttft_ms=own_ms, post_ttft_ms=post_ms, post_queue_budget_ms=budget_ms)
                if (budget_ms <= 0 or post_ms - own_ms >= budget_ms) and refusal is None:
                    refusal = (
                        f"{_engine_id(key)}: after consolidation own prefill {own_ms:.1f} ms + queue "
                        f"{post_ms - own_ms:.1f} ms leaves no room under {sens:g} x the "
                        f"{ttft_target:g} ms TTFT target"
                    )
        prefill = _decide(
            estimates,
            ttft_target,
            n,
            settings,
            "workers",
            can_scale_down=check and refusal is None,
            refusal=refusal,
            label="TTFT",
        )

    itl_target = settings.itl_target_ms
    refusal = None
    estimates = []
    for key in sorted(engines):
        fpm = engines[key]
        sched_kv, queued_kv = fpm.scheduled.sum_decode_kv_tokens, fpm.queued.sum_decode_kv_tokens
        queued_prefill = fpm.queued.sum_prefill_tokens
        est_ms = _ms(model.estimate_next_itl(sched_kv, queued_kv))
        assert est_ms is not None
        estimates.append(est_ms)
        row = rows[key]
        row.update(
            scheduled_decode_kv_tokens=sched_kv, queued_decode_kv_tokens=queued_kv, estimated_itl_ms=est_ms
        )
        if check:
            # Queued prompts become KV once prefilled: they count against the survivor's cache.
            post_kv = int((sched_kv + queued_kv + queued_prefill) * c)
            problem = _itl_after_consolidation(model, key, post_kv, row, settings)
            refusal = refusal or problem
    decode = _decide(
        estimates,
        itl_target,
        n,
        settings,
        "workers",
        can_scale_down=check and refusal is None,
        refusal=refusal,
        label="ITL",
    )

    # A sub-signal that stays (no change or refused) wants n: only a missing TTFT signal lets the
    # ITL side scale down alone.
    p = None if prefill is None else (prefill.desired if prefill.desired is not None else n)
    d = decode.desired if decode.desired is not None else n
    refused = decode.refused or (prefill is not None and prefill.refused)
    ttft_detail = prefill.detail if prefill is not None else "max_num_batched_tokens unknown: no TTFT signal"
    detail = f"TTFT: {ttft_detail}; ITL: {decode.detail}"
    if p is not None and p > n:
        desired, reason = p, None
    elif d > n:
        desired, reason = d, None
    elif p is None and d < n:
        desired, reason = d, None
    elif p is not None and p < n and d < n:
        desired, reason = max(p, d), None
    else:
        desired = None
        reason = LoadReason.SCALE_DOWN_REFUSED_CONSOLIDATION if refused else LoadReason.NO_CHANGE
    return _Signal(
        desired,
        reason,
        detail,
        engines=[rows[key] for key in sorted(rows)],
        checks={"consolidation_factor": c, "max_kv_tokens": max_kv, "ttft_wants": p, "itl_wants": d},
        refused=refused,
    )


def _reconcile(role: Role, engines: Mapping[EngineKey, ForwardPassMetrics], ready: int) -> str | None:
    """Why these FPMs do not describe the ready workers (None: they do). Deciding on a partial view
    would scale on the engines that happen to report (reference §4.3 step 4)."""
    ranks: dict[str, int] = {}
    for worker_id, _ in engines:
        ranks[worker_id] = ranks.get(worker_id, 0) + 1
    if len(ranks) != ready:
        return f"{role}: FPMs from {len(ranks)} workers but {ready} ready"
    if len(set(ranks.values())) > 1:
        per = ", ".join(f"{w}: {k}" for w, k in sorted(ranks.items()))
        return f"{role}: workers report different numbers of DP ranks ({per})"
    return None


def _pending_state(inp: LoadInput, roles: tuple[Role, ...], expiry_s: float) -> tuple[PendingState, dict]:
    pending = inp.pending
    if pending is None:
        return PendingState.NONE, {"state": str(PendingState.NONE)}
    if pending.issued_at.tzinfo is None:
        raise ValueError("pending.issued_at must be an aware datetime")
    per_role = {
        role: {"target": pending.replicas[role], "ready": inp.ready[role]}
        for role in roles
        if role in pending.replicas
    }
    age_s = (inp.now - pending.issued_at).total_seconds()
    diag: dict[str, Any] = {
        "target": dict(pending.replicas),
        "issued_at": pending.issued_at.isoformat(),
        "age_s": age_s,
        "expiry_s": expiry_s,
        "roles": per_role,
    }
    if all(v["target"] == v["ready"] for v in per_role.values()):
        state = PendingState.REACHED
    elif age_s >= expiry_s:
        state = PendingState.EXPIRED  # a rejected or lost request must not freeze scaling forever
    else:
        state = PendingState.WAITING
    diag["state"] = str(state)
    return state, diag


def _engine_rows(role: Role, records: Mapping[EngineKey, ForwardPassMetrics]) -> list[dict[str, Any]]:
    """What every engine reports about its queues, estimates aside: shown even on ticks that
    decide nothing (waiting for a scale-up is when the queues matter most)."""
    rows = []
    for key, fpm in sorted(records.items()):
        row: dict[str, Any] = {"engine": _engine_id(key), "heartbeat": fpm.is_heartbeat}
        if role != "decode":
            row["queued_prefill_tokens"] = fpm.queued.sum_prefill_tokens
        if role != "prefill":
            row["scheduled_decode_kv_tokens"] = fpm.scheduled.sum_decode_kv_tokens
            row["queued_decode_kv_tokens"] = fpm.queued.sum_decode_kv_tokens
        rows.append(row)
    return rows


def _finish(
    replicas: Replicas | None,
    reasons: dict[Role, LoadReason],
    reason: LoadReason,
    details: dict[Role, str] | str,
    pending: PendingState,
    diagnostics: dict[str, Any],
) -> LoadResult:
    detail = details if isinstance(details, str) else "; ".join(f"{r}: {d}" for r, d in details.items())
    for role, section in diagnostics.get("roles", {}).items():
        section.setdefault("reason", str(reasons[role]) if role in reasons else None)
    diagnostics["reason"] = str(reason)
    diagnostics["detail"] = detail
    return LoadResult(replicas, reason, reasons, detail, pending, diagnostics)


def load_step(models: LoadModels, inp: LoadInput, settings: LoadSettings) -> LoadResult:
    """One load-scaling decision for the deployment (see the module docstring)."""
    if inp.now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    if models.mode != settings.mode:
        raise ValueError(f"models are for mode {models.mode!r}, settings for {settings.mode!r}")
    roles = roles_for_mode(settings.mode)
    missing = [role for role in roles if role not in inp.ready]
    if missing:
        raise ValueError(f"ready counts missing for {missing}")
    current = {role: inp.ready[role] for role in roles}
    diagnostics: dict[str, Any] = {
        "mode": settings.mode,
        "current": dict(current),
        "targets": {
            "ttft_ms": settings.ttft_target_ms,
            "itl_ms": settings.itl_target_ms,
            "sensitivity": settings.sensitivity,
        },
        "throughput_floor": dict(inp.throughput_floor) if inp.throughput_floor is not None else None,
        "kv_hit_rate": inp.kv_hit_rate,
        "estimated_ttft_ms": None,
        "estimated_itl_ms": None,
        "models": models.diagnostics(),
    }

    def everywhere(reason: LoadReason) -> dict[Role, LoadReason]:
        return {role: reason for role in roles}

    if not settings.enabled:
        diagnostics["pending"] = {"state": str(PendingState.NONE)}
        reasons = everywhere(LoadReason.DISABLED)
        return _finish(
            None, reasons, LoadReason.DISABLED, "load scaling disabled", PendingState.NONE, diagnostics
        )
    # Replaced by the full per-role record (estimates, checks) when the step gets that far.
    diagnostics["roles"] = {role: {"engines": _engine_rows(role, inp.fpm.get(role) or {})} for role in roles}
    pending, pending_diag = _pending_state(inp, roles, settings.pending_expiry_s)
    diagnostics["pending"] = pending_diag
    if pending is PendingState.WAITING:
        waiting = ", ".join(
            f"{role} {v['ready']} ready of {v['target']}"
            for role, v in pending_diag["roles"].items()
            if v["target"] != v["ready"]
        )
        left_s = settings.pending_expiry_s - pending_diag["age_s"]
        return _finish(
            None,
            everywhere(LoadReason.SCALING_IN_PROGRESS),
            LoadReason.SCALING_IN_PROGRESS,
            f"waiting for the last target ({waiting}); observing only, gives up in {left_s:.0f} s",
            pending,
            diagnostics,
        )

    engines_by_role = {role: dict(inp.fpm.get(role) or {}) for role in roles}
    if not any(engines_by_role.values()):
        detail = "no forward-pass metrics from any engine"
        return _finish(
            None, everywhere(LoadReason.NO_FPM_DATA), LoadReason.NO_FPM_DATA, detail, pending, diagnostics
        )
    mismatches = [
        problem
        for role, engines in engines_by_role.items()
        if engines and (problem := _reconcile(role, engines, current[role])) is not None
    ]
    if mismatches:
        reasons = everywhere(LoadReason.WORKER_COUNT_MISMATCH)
        detail = "; ".join(mismatches)
        return _finish(None, reasons, LoadReason.WORKER_COUNT_MISMATCH, detail, pending, diagnostics)

    signals: dict[Role, _Signal] = {}
    for role in roles:
        engines, n = engines_by_role[role], current[role]
        model = models.regressions[role]
        if not engines:
            signals[role] = _Signal(None, LoadReason.NO_FPM_DATA, "no forward-pass metrics")
        elif not model.has_sufficient_data():
            signals[role] = _Signal(
                None,
                LoadReason.INSUFFICIENT_DATA,
                f"{model.num_observations} of {model.min_observations} observations",
            )
        elif isinstance(model, PrefillRegression):
            signals[role] = _prefill_signal(model, engines, n, settings, inp.kv_hit_rate)
        elif isinstance(model, DecodeRegression):
            signals[role] = _decode_signal(model, engines, n, settings)
        else:
            signals[role] = _agg_signal(model, engines, n, settings, inp.kv_hit_rate)

    final: dict[Role, int] = {}
    reasons: dict[Role, LoadReason] = {}
    details: dict[Role, str] = {}
    per_role: dict[str, Any] = {}
    for role in roles:
        signal, n = signals[role], current[role]
        wanted = signal.desired if signal.desired is not None else n
        floor = inp.throughput_floor.get(role) if inp.throughput_floor is not None else None
        floored = max(wanted, floor) if floor is not None else wanted
        # Only the throughput floor lifting a wish to go down counts as "capped"; the bounds
        # below are the operator's, and say so in the detail.
        capped = floored > wanted and wanted < n
        value = max(floored, settings.min_replicas(role))
        top = settings.max_replicas(role)
        if top is not None:
            value = min(value, top)
        final[role] = value
        detail = signal.detail
        if floored != wanted:
            detail += f"; throughput floor {floor} -> {floored}"
        if value != floored:
            detail += f"; bounds -> {value}"
        if value > n:
            reasons[role] = LoadReason.SCALE_UP
        elif value < n:
            reasons[role] = LoadReason.SCALE_DOWN_CAPPED_BY_THROUGHPUT if capped else LoadReason.SCALE_DOWN
        elif capped:
            reasons[role] = LoadReason.SCALE_DOWN_CAPPED_BY_THROUGHPUT
        else:
            reasons[role] = signal.reason or LoadReason.NO_CHANGE
        details[role] = detail
        per_role[role] = {
            "reason": str(reasons[role]),
            "detail": detail,
            "current": n,
            "load_wants": signal.desired,
            "throughput_floor": floor,
            "final": value,
            "engines": signal.engines,
            "checks": signal.checks,
        }
    diagnostics["roles"] = per_role
    ttft = [e["estimated_ttft_ms"] for s in signals.values() for e in s.engines if "estimated_ttft_ms" in e]
    itl = [e["estimated_itl_ms"] for s in signals.values() for e in s.engines if "estimated_itl_ms" in e]
    diagnostics["estimated_ttft_ms"] = max(ttft) if ttft else None
    diagnostics["estimated_itl_ms"] = max(itl) if itl else None

    if all(final[role] == current[role] for role in roles):
        # Nothing moves: the most informative role's reason speaks (e.g. insufficient_data).
        informative = [reasons[role] for role in roles if reasons[role] is not LoadReason.NO_CHANGE]
        reason = informative[0] if informative else LoadReason.NO_CHANGE
        return _finish(None, reasons, reason, details, pending, diagnostics)
    reason = max(reasons.values(), key=lambda r: _CHANGE_PRIORITY.get(r, 0))
    diagnostics["final"] = dict(final)
    return _finish(dict(final), reasons, reason, details, pending, diagnostics)
