"""The embedding interface: the planner's decisions on an embedder's clock, without a database."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from app.config import DeploymentsFile
from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics
from app.core.seed.replicas import plan_replicas
from app.embedding import EmbeddedPlanner, TickInput, TrafficWindow
from tests.support import demo_config

H200 = Path(__file__).resolve().parents[2] / "data" / "profiles" / "h200-llama3.1-8b-fp8"


def _planner(**overrides) -> EmbeddedPlanner:
    raw = demo_config(
        profile=str(H200),
        throughput={
            "enabled": True,
            "interval_s": 60,
            "correction": False,
            "predictor": {"type": "constant"},
        },
        **overrides,
    )
    deployment = DeploymentsFile.model_validate(raw).deployments[0]
    return EmbeddedPlanner.from_config(deployment, base_dir=Path("."), start_s=1000.0)


def _window(num_req: float, isl: float = 3000, osl: float = 150) -> TrafficWindow:
    return TrafficWindow(duration_s=60, num_req=num_req, isl=isl, osl=osl, ttft_ms=100, itl_ms=20)


def _tick(planner, now_s, window, ready):
    return planner.on_tick(TickInput(now_s=now_s, traffic=window, ready=ready, expected=ready))


def test_first_tick_comes_one_interval_after_the_start() -> None:
    assert _planner().initial_tick_s() == 1060.0


def test_a_target_is_what_the_throughput_formula_gives_for_the_forecast() -> None:
    planner = _planner()
    out = _tick(planner, 1060.0, _window(1200), {"prefill": 1, "decode": 1})
    # Constant predictor: the forecast is the last window.
    expected = plan_replicas(
        model=planner.model,
        num_req=1200,
        interval_s=60,
        isl_tokens=3000,
        osl_tokens=150,
        itl_target_ms=50,
    )
    assert out.target == {"prefill": expected.num_prefill, "decode": expected.num_decode}
    assert out.target != {"prefill": 1, "decode": 1}  # the case must exercise a change
    assert out.next_tick_s == 1120.0
    assert out.reasons[-1].startswith("protocol: create")
    assert out.diagnostics["throughput"]["reason"] == "scale"
    assert out.diagnostics["at_s"] == 1060.0


def test_no_new_target_while_the_last_one_is_not_reached_then_one_once_it_is() -> None:
    planner = _planner()
    first = _tick(planner, 1060.0, _window(1200), {"prefill": 1, "decode": 1})
    assert first.target is not None
    held = _tick(planner, 1120.0, _window(2400), {"prefill": 1, "decode": 1})
    assert held.target is None
    assert "awaiting_ack" in held.reasons[-1]
    moved = _tick(planner, 1180.0, _window(2400), dict(first.target))
    assert moved.target is not None and moved.target != first.target


def test_a_pending_target_expires_after_the_ack_timeout() -> None:
    planner = _planner(connector={"type": "virtual", "ack_timeout_s": 100})
    first = _tick(planner, 1060.0, _window(1200), {"prefill": 1, "decode": 1})
    assert first.target is not None
    late = _tick(planner, 1180.0, _window(2400), {"prefill": 1, "decode": 1})
    assert late.target is not None
    assert "expired" in late.reasons[-1]


def test_an_unchanged_target_creates_nothing() -> None:
    planner = _planner()
    first = _tick(planner, 1060.0, _window(1200), {"prefill": 1, "decode": 1})
    again = _tick(planner, 1120.0, _window(1200), dict(first.target))
    assert again.target is None
    assert "unchanged" in again.reasons[-1]


def test_without_traffic_there_is_no_target_and_the_reason_says_so() -> None:
    planner = _planner()
    out = planner.on_tick(
        TickInput(now_s=1060.0, traffic=None, ready={"prefill": 1, "decode": 1}, expected={})
    )
    assert out.target is None
    assert out.diagnostics["throughput"]["reason"] == "no_traffic_data"


def test_bounds_apply_to_the_target() -> None:
    planner = _planner(
        prefill={"min_replicas": 1, "max_replicas": 2}, decode={"min_replicas": 3, "max_replicas": 8}
    )
    out = _tick(planner, 1060.0, _window(2400, osl=20), {"prefill": 1, "decode": 1})
    raw = plan_replicas(
        model=planner.model, num_req=2400, interval_s=60, isl_tokens=3000, osl_tokens=20, itl_target_ms=50
    )
    assert (raw.num_prefill, raw.num_decode) == (3, 1)  # the case: one role above max, one below min
    assert out.target == {"prefill": 2, "decode": 3}


def test_the_same_inputs_give_the_same_outputs_at_any_clock_origin() -> None:
    a, b = _planner(), _planner()
    out_a = _tick(a, 1060.0, _window(1200), {"prefill": 1, "decode": 1})
    out_b = _tick(b, 1060.0 + 1e6, _window(1200), {"prefill": 1, "decode": 1})
    assert out_a.target == out_b.target
    assert math.isclose(out_b.next_tick_s - out_a.next_tick_s, 1e6)


@pytest.mark.parametrize("ready", [{"prefill": 1}, {}])
def test_partial_ready_counts_do_not_acknowledge(ready) -> None:
    planner = _planner()
    first = _tick(planner, 1060.0, _window(1200), {"prefill": 1, "decode": 1})
    held = _tick(planner, 1120.0, _window(2400), {**ready, "prefill": first.target["prefill"]})
    assert held.target is None


def _busy(worker: str, queued_tokens: int, wall_time_s: float = 0.05) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id=worker,
        dp_rank=0,
        wall_time_s=wall_time_s,
        scheduled=ScheduledRequestMetrics(num_prefill_requests=1, sum_prefill_tokens=4096),
        queued=QueuedRequestMetrics(num_prefill_requests=3, sum_prefill_tokens=queued_tokens),
    )


def test_a_busy_record_unchanged_since_the_previous_tick_reads_as_an_idle_engine() -> None:
    # Dynamo's replay adapter keeps an engine's last record until a newer one arrives: a record
    # seen again at the next tick is an engine that has run no pass since, not a queue still there.
    planner = _planner()
    ready = {"prefill": 1, "decode": 1}

    def queued_read(now_s: float, record: ForwardPassMetrics) -> int:
        out = planner.on_tick(
            TickInput(
                now_s=now_s,
                traffic=_window(600),
                ready=ready,
                expected=ready,
                fpm={"prefill": {("p0", 0): record}},
            )
        )
        return out.diagnostics["fpm"]["prefill"]["queued_prefill_tokens"]

    record = _busy("p0", 50_000)
    cases = [  # (record handed over, queued prefill tokens the planner reads, why)
        (record, 50_000, "first seen: the engine's load now"),
        (record, 0, "the same record again: the engine has run no pass since"),
        (_busy("p0", 50_000), 0, "an equal record rebuilt by the embedder is still no new pass"),
        (_busy("p0", 20_000, 0.04), 20_000, "a new pass: read as it is"),
    ]
    for i, (given, expected, why) in enumerate(cases):
        assert queued_read(1060.0 + 60.0 * i, given) == expected, why
