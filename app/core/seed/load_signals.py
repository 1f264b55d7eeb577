"""Load scaling's per-role signals: the TTFT or ITL each engine would give a request now, and
whether one engine more or less is warranted (reference §4.4-§4.6)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.perf.fpm import ForwardPassMetrics
from app.core.seed.load_types import EngineKey, LoadReason, LoadSettings
from app.core.seed.regression import AggRegression, DecodeRegression, PrefillRegression, Regression
from app.core.types import Role


@dataclass
class Signal:
    """One sub-decision: the load's wish for a role (None: no signal) and why."""

    desired: int | None
    reason: LoadReason | None  # why there is no move (desired None or == current)
    detail: str
    engines: list[dict[str, Any]] = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)
    refused: bool = False


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def engine_id(key: EngineKey) -> str:
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
) -> Signal:
    """Up when every engine is over target, else down when the consolidation checks allowed it."""
    worst = max(estimates_ms)
    if all(t > target_ms for t in estimates_ms):
        top = settings.max_replicas(role)
        if top is not None and n + 1 > top:
            return Signal(
                n, LoadReason.NO_CHANGE, f"every engine over the {label} target but already at max {top}"
            )
        return Signal(
            n + 1,
            None,
            f"every engine's {label} over {target_ms:g} ms (max {worst:.1f} ms): {n} -> {n + 1}",
        )
    if can_scale_down:
        return Signal(
            n - 1,
            None,
            f"max {label} {worst:.1f} ms; the {n - 1} remaining stay within {settings.sensitivity:g} x "
            f"{target_ms:g} ms after absorbing one engine's load: {n} -> {n - 1}",
        )
    if refusal is not None:
        return Signal(None, LoadReason.SCALE_DOWN_REFUSED_CONSOLIDATION, refusal, refused=True)
    if n <= settings.min_replicas(role):
        why = f"at the minimum of {settings.min_replicas(role)}" if n > 1 else "a single worker"
        return Signal(None, LoadReason.NO_CHANGE, f"max {label} {worst:.1f} ms; {why}")
    return Signal(None, LoadReason.NO_CHANGE, f"max {label} {worst:.1f} ms")


def _can_try_down(n: int, settings: LoadSettings, role: Role) -> bool:
    return n > 1 and n - 1 >= settings.min_replicas(role)


def _not_ready(model: Regression, label: str) -> Signal | None:
    if not model.ready:
        return Signal(
            None, LoadReason.INSUFFICIENT_DATA, f"{label} model not ready: {model.not_ready_reason}"
        )
    return None


def prefill_signal(
    model: PrefillRegression,
    engines: Mapping[EngineKey, ForwardPassMetrics],
    n: int,
    settings: LoadSettings,
    kv_hit_rate: float | None,
) -> Signal:
    not_ready = _not_ready(model, "prefill")
    if not_ready is not None:
        return not_ready
    mbt = settings.max_num_batched_tokens
    if not mbt or mbt <= 0:
        return Signal(None, LoadReason.INSUFFICIENT_DATA, "max_num_batched_tokens unknown: no TTFT estimate")
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
            "engine": engine_id(key),
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
                    f"{engine_id(key)}: after consolidation its queue adds {post_ms - t_own_ms:.1f} ms, "
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
            f"{engine_id(key)}: {post_kv} KV tokens after consolidation would not fit the cache of {max_kv}"
        )
    post_ms = _ms(model.estimate_next_itl(post_kv, 0)) or 0.0
    row["post_itl_ms"] = post_ms
    if post_ms >= target * sens:
        return f"{engine_id(key)}: ITL after consolidation {post_ms:.1f} ms >= {sens:g} x {target:g} ms"
    return None


def decode_signal(
    model: DecodeRegression,
    engines: Mapping[EngineKey, ForwardPassMetrics],
    n: int,
    settings: LoadSettings,
) -> Signal:
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
            "engine": engine_id(key),
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


def agg_signal(
    model: AggRegression,
    engines: Mapping[EngineKey, ForwardPassMetrics],
    n: int,
    settings: LoadSettings,
    kv_hit_rate: float | None,
) -> Signal:
    """Aggregated engines: a TTFT signal and an ITL signal; up if either is over, down only if
    both allow it (reference §4.5, last paragraph)."""
    not_ready = _not_ready(model, "aggregated")
    if not_ready is not None:
        return not_ready
    mbt, max_kv, sens = settings.max_num_batched_tokens, settings.max_kv_tokens, settings.sensitivity
    c = n / (n - 1) if n > 1 else 1.0
    check = _can_try_down(n, settings, "workers")
    rows = {key: {"engine": engine_id(key), "heartbeat": engines[key].is_heartbeat} for key in engines}

    prefill: Signal | None = None  # None: no TTFT signal (chunk size unknown)
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
                        f"{engine_id(key)}: after consolidation own prefill {own_ms:.1f} ms + queue "
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
    return Signal(
        desired,
        reason,
        detail,
        engines=[rows[key] for key in sorted(rows)],
        checks={"consolidation_factor": c, "max_kv_tokens": max_kv, "ttft_wants": p, "itl_wants": d},
        refused=refused,
    )
