"""The planner as a scaling policy of NVIDIA Dynamo 1.6.1's offline replay.

Dynamo's replay (`dynamo._core.run_mocker_trace_replay(..., scaling_policy=obj)`, Rust) drives
the loop: it calls `obj.initial_tick_ms()` once, then `obj.on_tick(snapshot)` at each time the
policy asked for, and applies the `{"target_prefill", "target_decode", "next_tick_ms"}` it gets
back (None: unchanged; `next_tick_ms` None: no more ticks). The snapshot is a plain dict
(Dynamo's `PyReplayScalingPolicy::on_tick`): `now_ms`, per pool the worker ids that are active,
starting and draining, the FPM records of the pool's workers since the previous tick
(`prefill_fpm_snapshots`, `decode_fpm_snapshots`: at most one per worker and DP rank, the
latest, with flat field names) and the frontend's `traffic` since the previous tick.

This module translates that to the embedding interface of `app/embedding.py` and back. It needs
nothing from Dynamo (the snapshot is plain data), so its tests run without Dynamo installed.

Translation choices, each what the live system would show the planner:

- `traffic`: `num_req` is Dynamo's arrivals in the window (as our frontend's `started`);
  `isl`/`osl` are means over the requests that completed (`shape_count`), `ttft_ms`/`itl_ms`
  over their own counts; a mean with a zero count is unknown (None), not Dynamo's 0.0. Dynamo
  has no ISL histogram and no request duration: `isl_buckets=()`, `request_duration_s=None`.
- `fpm`: the last record seen per engine (as Dynamo's own replay adapter keeps it), limited to
  the engines that are active; an active engine that ran no forward pass since the previous tick
  is reported by an idle heartbeat (all zeros, `wall_time_s == 0`), as a live engine's idle
  heartbeat would replace its last busy record. With `heartbeats=False` the last record is kept
  until a newer one arrives, exactly as Dynamo's adapter presents it: the planner itself reads a
  record unchanged since its previous tick as an idle engine (`app/embedding.py`). A record is
  the same object until a newer one arrives, so the planner trains its regressions on each
  record once.
- `ready`: the active workers per pool (starting ones do not serve yet, draining ones are on
  their way out); `expected`: the non-draining workers (active + starting).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from app.core.perf.fpm import ForwardPassMetrics
from app.embedding import EmbeddedPlanner, TickInput, TickOutput, TrafficWindow

ROLES = ("prefill", "decode")

# Dynamo's flat FPM snapshot keys -> (nested struct, our field name).
_SCHEDULED = (
    "num_prefill_requests",
    "sum_prefill_tokens",
    "var_prefill_length",
    "sum_prefill_kv_tokens",
    "num_decode_requests",
    "sum_decode_kv_tokens",
    "var_decode_kv_tokens",
)
_QUEUED = {
    "num_queued_prefill": "num_prefill_requests",
    "sum_queued_prefill_tokens": "sum_prefill_tokens",
    "var_queued_prefill_length": "var_prefill_length",
    "num_queued_decode": "num_decode_requests",
    "sum_queued_decode_kv_tokens": "sum_decode_kv_tokens",
    "var_queued_decode_kv_tokens": "var_decode_kv_tokens",
}


def fpm_from_snapshot(snapshot: Mapping[str, Any]) -> ForwardPassMetrics:
    """One of Dynamo's replay FPM snapshots (flat keys, `wall_time` in seconds) as the planner's
    record, validated as a record from the wire is (`ForwardPassMetrics.from_wire`)."""
    try:
        wire = {
            "worker_id": str(snapshot["worker_id"]),
            "dp_rank": int(snapshot.get("dp_rank", 0)),
            "wall_time": snapshot["wall_time"],
            "scheduled_requests": {name: snapshot[name] for name in _SCHEDULED},
            "queued_requests": {ours: snapshot[theirs] for theirs, ours in _QUEUED.items()},
        }
    except KeyError as exc:
        raise ValueError(f"FPM snapshot: {exc.args[0]}: missing") from None
    return ForwardPassMetrics.from_wire(wire)


def idle_heartbeat(worker_id: str, dp_rank: int = 0) -> ForwardPassMetrics:
    """What an idle engine publishes: an all-zero record with no forward pass."""
    return ForwardPassMetrics.heartbeat(worker_id, dp_rank)


def traffic_from_snapshot(traffic: Mapping[str, Any] | None) -> TrafficWindow | None:
    """Dynamo's per-tick traffic window as the planner's; None when there is no window."""
    if not traffic:
        return None
    duration = float(traffic.get("duration_s") or 0.0)
    if duration <= 0:
        return None
    num_req = float(traffic.get("num_req") or 0)

    def mean(key: str, count_key: str) -> float | None:
        count = traffic.get(count_key)
        value = traffic.get(key)
        if value is None or count is None or count <= 0:
            return None
        return float(value)

    return TrafficWindow(
        duration_s=duration,
        num_req=num_req,
        isl=mean("avg_isl", "shape_count"),
        osl=mean("avg_osl", "shape_count"),
        ttft_ms=mean("avg_ttft_ms", "ttft_count"),
        itl_ms=mean("avg_itl_ms", "itl_count"),
    )


class FpmCache:
    """The latest record per (worker_id, dp_rank) of one pool, for the active workers only; with
    `heartbeats`, an engine without a record since the previous tick reads as an idle heartbeat."""

    def __init__(self, heartbeats: bool = True) -> None:
        self.records: dict[tuple[str, int], ForwardPassMetrics] = {}
        self.heartbeats = heartbeats

    def update(
        self, snapshots: Iterable[Mapping[str, Any]], active_ids: Iterable[int | str]
    ) -> dict[tuple[str, int], ForwardPassMetrics]:
        active = {str(w) for w in active_ids}
        fresh: set[tuple[str, int]] = set()
        for snap in snapshots:
            record = fpm_from_snapshot(snap)
            if record.worker_id in active:
                self.records[record.key] = record
                fresh.add(record.key)
        for key in list(self.records):
            if key[0] not in active:
                del self.records[key]
            elif self.heartbeats and key not in fresh and not self.records[key].is_heartbeat:
                # No forward pass since the previous tick: the engine is idle.
                self.records[key] = idle_heartbeat(*key)
        known = {key[0] for key in self.records}
        for worker in sorted(active - known):
            self.records[(worker, 0)] = idle_heartbeat(worker)
        return dict(self.records)


def ready_counts(snapshot: Mapping[str, Any]) -> dict[str, int]:
    return {role: int(snapshot[f"active_{role}_count"]) for role in ROLES}


def expected_counts(snapshot: Mapping[str, Any]) -> dict[str, int]:
    return {
        role: int(snapshot.get(f"non_draining_{role}_count", snapshot[f"active_{role}_count"]))
        for role in ROLES
    }


def tick_input(snapshot: Mapping[str, Any], caches: Mapping[str, FpmCache]) -> TickInput:
    """One replay snapshot as the embedding's tick input (updates the FPM caches)."""
    fpm = {
        role: caches[role].update(
            snapshot.get(f"{role}_fpm_snapshots") or [], snapshot.get(f"active_{role}_ids") or []
        )
        for role in ROLES
    }
    return TickInput(
        now_s=float(snapshot["now_ms"]) / 1000.0,
        traffic=traffic_from_snapshot(snapshot.get("traffic")),
        ready=ready_counts(snapshot),
        expected=expected_counts(snapshot),
        fpm=fpm,
    )


def replay_decision(out: TickOutput, snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The planner's output as the replay's decision: absolute targets, None where unchanged."""
    target = out.target or {}
    now_ms = float(snapshot["now_ms"])
    current = expected_counts(snapshot)

    def role_target(role: str) -> int | None:
        value = target.get(role)  # type: ignore[call-overload]
        return None if value is None or value == current[role] else int(value)

    return {
        "target_prefill": role_target("prefill"),
        "target_decode": role_target("decode"),
        # The replay needs time to move on; the planner always asks for a later tick.
        "next_tick_ms": max(out.next_tick_s * 1000.0, now_ms + 1.0),
    }


@dataclass
class Scaling:
    at_s: float
    target: dict[str, int]
    reason: str


@dataclass
class PlannerScalingPolicy:
    """`EmbeddedPlanner` behind the replay's scaling-policy callback."""

    planner: EmbeddedPlanner
    caches: dict[str, FpmCache] = field(default_factory=lambda: {role: FpmCache() for role in ROLES})
    ticks: int = 0
    scalings: list[Scaling] = field(default_factory=list)
    policy_wall_s: float = 0.0  # time spent in the planner

    def initial_tick_ms(self) -> float:
        return self.planner.initial_tick_s() * 1000.0

    def on_tick(self, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        started = perf_counter()
        out = self.planner.on_tick(tick_input(snapshot, self.caches))
        decision = replay_decision(out, snapshot)
        self.policy_wall_s += perf_counter() - started
        self.ticks += 1
        if decision["target_prefill"] is not None or decision["target_decode"] is not None:
            reason = out.reasons[0] if out.reasons else ""
            self.scalings.append(Scaling(float(snapshot["now_ms"]) / 1000.0, dict(out.target or {}), reason))
        return decision
