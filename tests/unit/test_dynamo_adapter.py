"""bench/dynamo_adapter.py: Dynamo 1.6.1 replay snapshots -> the embedding interface, and back.

Dynamo's replay hands its scaling policy plain dicts (`PyReplayScalingPolicy::on_tick`), so the
stand-ins here are dicts with the same keys; nothing needs Dynamo installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.perf.fpm import ForwardPassMetrics
from bench import dynamo_adapter as da


def fpm_snap(worker_id: int = 0, wall_time: float = 0.02, **overrides) -> dict:
    """One entry of `prefill_fpm_snapshots` / `decode_fpm_snapshots`, as Dynamo 1.6.1 emits it."""
    snap = {
        "worker_id": worker_id,
        "dp_rank": 0,
        "wall_time": wall_time,
        "num_prefill_requests": 1,
        "sum_prefill_tokens": 1315,
        "var_prefill_length": 0.0,
        "sum_prefill_kv_tokens": 64,
        "num_decode_requests": 0,
        "sum_decode_kv_tokens": 0,
        "var_decode_kv_tokens": 0.0,
        "num_queued_prefill": 2,
        "sum_queued_prefill_tokens": 3000,
        "var_queued_prefill_length": 12.5,
        "num_queued_decode": 0,
        "sum_queued_decode_kv_tokens": 0,
        "var_queued_decode_kv_tokens": 0.0,
    }
    snap.update(overrides)
    return snap


def traffic(**overrides) -> dict:
    t = {
        "duration_s": 5.0,
        "num_req": 9,
        "avg_isl": 426.5,
        "avg_osl": 84.375,
        "avg_ttft_ms": 15.75,
        "avg_itl_ms": 6.25,
        "shape_count": 8,
        "ttft_count": 8,
        "itl_count": 8,
        "avg_accept_length": 1.0,
        "avg_kv_hit_rate": 0.0,
        "hit_rate_count": 0,
        "accept_length_forward_count": 737,
    }
    t.update(overrides)
    return t


def snapshot(now_ms: float = 10_000.0, **overrides) -> dict:
    s = {
        "tick_ordinal": 1,
        "now_ms": now_ms,
        "prefill_fpm_snapshots": [fpm_snap(0)],
        "decode_fpm_snapshots": [
            fpm_snap(
                0,
                0.0062,
                num_prefill_requests=0,
                sum_prefill_tokens=0,
                sum_prefill_kv_tokens=0,
                num_decode_requests=9,
                sum_decode_kv_tokens=11954,
                var_decode_kv_tokens=56609.7,
                num_queued_prefill=0,
                sum_queued_prefill_tokens=0,
                var_queued_prefill_length=0.0,
            )
        ],
        "active_prefill_count": 1,
        "active_decode_count": 1,
        "active_prefill_ids": [0],
        "active_decode_ids": [0],
        "starting_prefill_count": 2,
        "starting_decode_count": 0,
        "starting_prefill_ids": [1, 2],
        "starting_decode_ids": [],
        "draining_prefill_count": 0,
        "draining_decode_count": 0,
        "draining_prefill_ids": [],
        "draining_decode_ids": [],
        "non_draining_prefill_count": 3,
        "non_draining_decode_count": 1,
        "total_prefill_count": 3,
        "total_decode_count": 1,
        "traffic": traffic(),
    }
    s.update(overrides)
    return s


def test_fpm_snapshot_maps_flat_keys_to_nested_records():
    record = da.fpm_from_snapshot(fpm_snap(3, 0.0275))
    assert record.worker_id == "3" and record.dp_rank == 0
    assert record.wall_time_s == pytest.approx(0.0275)
    s, q = record.scheduled, record.queued
    assert (s.num_prefill_requests, s.sum_prefill_tokens, s.sum_prefill_kv_tokens) == (1, 1315, 64)
    assert (q.num_prefill_requests, q.sum_prefill_tokens, q.var_prefill_length) == (2, 3000, 12.5)
    assert (q.num_decode_requests, q.sum_decode_kv_tokens) == (0, 0)


def test_fpm_snapshot_coerces_integer_floats_and_rejects_bad_fields():
    assert da.fpm_from_snapshot(fpm_snap(wall_time=0, var_prefill_length=0)).is_heartbeat
    with pytest.raises(ValueError, match="sum_queued_prefill_tokens: missing"):
        da.fpm_from_snapshot({k: v for k, v in fpm_snap().items() if k != "sum_queued_prefill_tokens"})
    with pytest.raises(ValueError, match="negative"):
        da.fpm_from_snapshot(fpm_snap(sum_prefill_tokens=-1))


def test_traffic_window_keeps_counts_and_makes_empty_means_unknown():
    w = da.traffic_from_snapshot(traffic())
    assert (w.duration_s, w.num_req, w.isl, w.osl, w.ttft_ms, w.itl_ms) == (
        5.0,
        9.0,
        426.5,
        84.375,
        15.75,
        6.25,
    )
    assert w.isl_buckets == () and w.request_duration_s is None  # Dynamo reports neither
    # Arrivals but nothing completed: shapes and latencies are unknown, not 0.
    idle = da.traffic_from_snapshot(
        traffic(
            num_req=4,
            shape_count=0,
            ttft_count=0,
            itl_count=0,
            avg_isl=0.0,
            avg_osl=0.0,
            avg_ttft_ms=0.0,
            avg_itl_ms=0.0,
        )
    )
    assert idle.num_req == 4.0 and idle.isl is None and idle.osl is None
    assert idle.ttft_ms is None and idle.itl_ms is None
    assert da.traffic_from_snapshot(None) is None
    assert da.traffic_from_snapshot(traffic(duration_s=0.0)) is None


def test_fpm_cache_keeps_identity_until_a_new_record_and_reports_idle_engines():
    cache = da.FpmCache()
    first = cache.update([fpm_snap(0), fpm_snap(1)], [0, 1])
    assert set(first) == {("0", 0), ("1", 0)}
    # Worker 0 ran again, worker 1 did not: 0 gets a new record, 1 an idle heartbeat.
    second = cache.update([fpm_snap(0, 0.03)], [0, 1])
    assert second[("0", 0)] is not first[("0", 0)] and second[("0", 0)].wall_time_s == 0.03
    assert second[("1", 0)].is_heartbeat
    # Nothing new: the same objects, so the planner trains on no record twice.
    third = cache.update([], [0, 1])
    assert third[("1", 0)] is second[("1", 0)]
    assert third[("0", 0)].is_heartbeat
    # Worker 1 removed (draining or gone), worker 2 became active without a pass yet.
    fourth = cache.update([], [0, 2])
    assert set(fourth) == {("0", 0), ("2", 0)} and fourth[("2", 0)].is_heartbeat
    # A record of a worker that is not active (starting or draining) is left out.
    assert ("5", 0) not in cache.update([fpm_snap(5)], [0, 2])


def test_fpm_cache_without_heartbeats_keeps_the_last_record_as_dynamos_adapter_does():
    cache = da.FpmCache(heartbeats=False)
    first = cache.update([fpm_snap(0)], [0, 1])
    assert first[("1", 0)].is_heartbeat  # an active engine that never ran a pass
    # No pass since: the last record stays, the same object (the planner reads it as idle).
    second = cache.update([], [0, 1])
    assert second[("0", 0)] is first[("0", 0)] and not second[("0", 0)].is_heartbeat


def test_tick_input_from_a_snapshot():
    caches = {role: da.FpmCache() for role in da.ROLES}
    inp = da.tick_input(snapshot(), caches)
    assert inp.now_s == 10.0
    assert inp.ready == {"prefill": 1, "decode": 1}  # the starting prefill workers do not serve yet
    assert inp.expected == {"prefill": 3, "decode": 1}
    assert isinstance(inp.fpm["prefill"][("0", 0)], ForwardPassMetrics)
    assert inp.fpm["decode"][("0", 0)].scheduled.num_decode_requests == 9
    assert inp.traffic is not None and inp.traffic.num_req == 9.0


class _Out:
    def __init__(self, target, next_tick_s, reasons=("proposal: x", "protocol: create")):
        self.target = target
        self.next_tick_s = next_tick_s
        self.reasons = list(reasons)
        self.diagnostics = {"at_s": 10.0}


def test_replay_decision_is_absolute_targets_with_none_for_unchanged():
    snap = snapshot()
    assert da.replay_decision(_Out({"prefill": 5, "decode": 1}, 15.0), snap) == {
        "target_prefill": 5,
        "target_decode": None,  # equal to the non-draining count
        "next_tick_ms": 15_000.0,
    }
    assert da.replay_decision(_Out(None, 15.0), snap)["target_prefill"] is None
    # The replay must move on: never a tick at or before now.
    assert da.replay_decision(_Out(None, 10.0), snap)["next_tick_ms"] == 10_001.0


class _StandInPlanner:
    """EmbeddedPlanner's two calls, recording what it was given."""

    def __init__(self):
        self.inputs = []

    def initial_tick_s(self):
        return 5.0

    def on_tick(self, inp):
        self.inputs.append(inp)
        target = {"prefill": 4, "decode": 1} if len(self.inputs) == 1 else None
        return _Out(target, inp.now_s + 5.0)


def test_policy_drives_the_planner_on_the_replay_clock():
    planner = _StandInPlanner()
    policy = da.PlannerScalingPolicy(planner)  # type: ignore[arg-type]
    assert policy.initial_tick_ms() == 5000.0
    first = policy.on_tick(snapshot(now_ms=5000.0))
    assert first == {"target_prefill": 4, "target_decode": None, "next_tick_ms": 10_000.0}
    second = policy.on_tick(snapshot(now_ms=10_000.0, prefill_fpm_snapshots=[]))
    assert second["target_prefill"] is None and second["next_tick_ms"] == 15_000.0
    assert policy.ticks == 2 and len(policy.scalings) == 1
    assert policy.scalings[0].target == {"prefill": 4, "decode": 1}
    # The second tick saw worker 0 idle (no pass since the first).
    assert planner.inputs[1].fpm["prefill"][("0", 0)].is_heartbeat


def test_the_real_planner_accepts_a_translated_tick():
    from app.embedding import EmbeddedPlanner
    from app.sim.replay.config import load_replay_config

    config = load_replay_config(Path(__file__).resolve().parents[2] / "examples" / "replay.yaml")
    policy = da.PlannerScalingPolicy(EmbeddedPlanner.from_config(config.deployment, base_dir=config.base_dir))
    first_ms = policy.initial_tick_ms()
    decision = policy.on_tick(snapshot(now_ms=first_ms))
    assert set(decision) == {"target_prefill", "target_decode", "next_tick_ms"}
    assert decision["next_tick_ms"] > first_ms
    assert policy.ticks == 1
