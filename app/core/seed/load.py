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
only reads them. Nothing here reads the clock: `now_s` comes in with the input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core.perf.fpm import ForwardPassMetrics
from app.core.seed.load_models import LoadModels
from app.core.seed.load_signals import (
    Signal,
    agg_signal,
    decode_signal,
    engine_id,
    prefill_signal,
)
from app.core.seed.load_types import (
    EngineKey,
    LoadInput,
    LoadReason,
    LoadResult,
    LoadSettings,
    PendingState,
)
from app.core.seed.regression import DecodeRegression, PrefillRegression
from app.core.types import Replicas, Role, roles_for_mode

# Which role's reason speaks for a step that changed something (§4.3 step 7).
_CHANGE_PRIORITY = {
    LoadReason.SCALE_UP: 4,
    LoadReason.SCALE_DOWN_CAPPED_BY_THROUGHPUT: 3,
    LoadReason.SCALE_DOWN: 2,
    LoadReason.NO_CHANGE: 1,
}


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
    per_role = {
        role: {"target": pending.replicas[role], "ready": inp.ready[role]}
        for role in roles
        if role in pending.replicas
    }
    age_s = inp.now_s - pending.issued_s
    diag: dict[str, Any] = {
        "target": dict(pending.replicas),
        "issued_s": pending.issued_s,
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
        row: dict[str, Any] = {"engine": engine_id(key), "heartbeat": fpm.is_heartbeat}
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

    signals: dict[Role, Signal] = {}
    for role in roles:
        engines, n = engines_by_role[role], current[role]
        model = models.regressions[role]
        if not engines:
            signals[role] = Signal(None, LoadReason.NO_FPM_DATA, "no forward-pass metrics")
        elif not model.has_sufficient_data():
            signals[role] = Signal(
                None,
                LoadReason.INSUFFICIENT_DATA,
                f"{model.num_observations} of {model.min_observations} observations",
            )
        elif isinstance(model, PrefillRegression):
            signals[role] = prefill_signal(model, engines, n, settings, inp.kv_hit_rate)
        elif isinstance(model, DecodeRegression):
            signals[role] = decode_signal(model, engines, n, settings)
        else:
            signals[role] = agg_signal(model, engines, n, settings, inp.kv_hit_rate)

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
        value = settings.role_bounds(role).clamp(floored)
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
